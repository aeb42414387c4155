// Package crowdsec reads a CrowdSec Local API's decision stream
// (GET /v1/decisions/stream, CrowdSec's pkg/models/localapi_swagger.yaml)
// and keeps the decisions it gave: the set a rampart list is made of.
//
// It is not built on crowdsecurity/go-cs-bouncer: that library's
// StreamBouncer retries a failed first call every 10 s without backoff (or
// stops for good), never asks for the whole set again after an outage,
// reads a body of any size into memory, and brings in CrowdSec's API client
// with go-openapi, logrus and a BSON codec (a 17.7 MB binary for one GET).
// The protocol is one GET with a header; this client is that GET, with a
// cap on the body and the answer decoded one decision at a time.
package crowdsec

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Client polls one Local API with a bouncer key.
type Client struct {
	URL     string // the Local API's base, e.g. http://127.0.0.1:8080/
	Key     string
	Scopes  []string // asked of the LAPI: "ip", "range"
	Origins []string // nil: every origin
	MaxBody int64    // bytes; 0: DefaultMaxBody
	HTTP    *http.Client
}

// DefaultMaxBody bounds one answer: a startup answer of 1M decisions is
// about 200 MB.
const DefaultMaxBody = 512 << 20

// Decision is one decision as rampart keeps it.
type Decision struct {
	ID      int64
	Origin  string
	scope   string // "ip" or "range"
	Type    string
	Prefix  netip.Prefix
	Expires time.Time
}

// Answer is one answer of the stream: decisions new and deleted since the
// last poll (all active ones when asked with startup), and those refused,
// by reason.
type Answer struct {
	New, Deleted []Decision
	Refused      map[string]int
	Bytes        int64
	Received     time.Time // when the answer's headers arrived
}

// Error is a failed poll, with a reason fit for a metric label.
type Error struct {
	Reason string // "connect", "status", "auth", "too-large", "decode"
	Err    error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Stream asks for the decisions since the last poll, or for every active
// one when startup is set.
func (c *Client) Stream(ctx context.Context, startup bool) (*Answer, error) {
	u, err := url.Parse(c.URL)
	if err != nil {
		return nil, &Error{"connect", fmt.Errorf("crowdsec url %q: %w", c.URL, err)}
	}
	u = u.JoinPath("v1/decisions/stream")
	q := url.Values{"startup": {fmt.Sprint(startup)}}
	if len(c.Scopes) > 0 {
		q.Set("scopes", strings.Join(c.Scopes, ","))
	}
	if len(c.Origins) > 0 {
		q.Set("origins", strings.Join(c.Origins, ","))
	}
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, &Error{"connect", err}
	}
	req.Header.Set("X-Api-Key", c.Key)
	req.Header.Set("User-Agent", "rampart-bouncer/v1") // the LAPI wants name/version
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, &Error{"connect", fmt.Errorf("crowdsec %s: %w", c.URL, err)}
	}
	defer resp.Body.Close()
	received := time.Now()
	if resp.StatusCode != http.StatusOK {
		reason := "status"
		if resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusUnauthorized {
			reason = "auth"
		}
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, &Error{reason, fmt.Errorf("crowdsec %s answered %s: %s", c.URL, resp.Status, strings.TrimSpace(string(msg)))}
	}
	limit := c.MaxBody
	if limit <= 0 {
		limit = DefaultMaxBody
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, &Error{"connect", fmt.Errorf("crowdsec %s: reading the answer: %w", c.URL, err)}
	}
	if int64(len(body)) > limit {
		return nil, &Error{"too-large", fmt.Errorf("crowdsec %s: the answer is over %d bytes (nothing of it was applied)", c.URL, limit)}
	}
	a, err := c.decode(body, time.Now(), startup)
	a.Bytes, a.Received = int64(len(body)), received
	if err != nil {
		return nil, &Error{"decode", fmt.Errorf("crowdsec %s: the answer is not a decision stream: %w (nothing of it was applied)", c.URL, err)}
	}
	return a, nil
}

// wire is a decision as the LAPI sends it (models.Decision).
type wire struct {
	ID       int64   `json:"id"`
	Origin   *string `json:"origin"`
	Scope    *string `json:"scope"`
	Type     *string `json:"type"`
	Value    *string `json:"value"`
	Duration *string `json:"duration"`
}

// decode reads {"new": [...], "deleted": [...]}. A decision of a scope
// or origin not asked for is refused: a LAPI that does not filter cannot
// widen what rampart enforces.
// A startup answer's deleted decisions (a million, after a flush of
// bans) are read, not kept: the answer replaces the whole set.
func (c *Client) decode(body []byte, now time.Time, startup bool) (*Answer, error) {
	// About 140 bytes a decision: room for all of them at once.
	a := &Answer{Refused: map[string]int{}, New: make([]Decision, 0, len(body)/160)}
	keep := func(w *wire, deleted bool, to *[]Decision) {
		d, reason := w.decision(now, deleted)
		if reason == "" && len(c.Origins) > 0 && !slices.Contains(c.Origins, d.Origin) {
			reason = "origin"
		}
		if reason == "" && len(c.Scopes) > 0 && !slices.Contains(c.Scopes, d.scope) {
			reason = "scope"
		}
		if reason != "" {
			a.Refused[reason]++
			return
		}
		*to = append(*to, d)
	}
	err := parseStream(body, func(key string, w *wire) {
		switch {
		case key == "new":
			keep(w, false, &a.New)
		case !startup:
			keep(w, true, &a.Deleted)
		}
	})
	return a, err
}

// decision checks a decision; a reason says why it cannot be kept.
func (w *wire) decision(now time.Time, deleted bool) (Decision, string) {
	if w.Scope == nil || w.Value == nil || w.Type == nil {
		return Decision{}, "incomplete"
	}
	d := Decision{ID: w.ID, Type: strings.ToLower(*w.Type)}
	if w.Origin != nil {
		d.Origin = *w.Origin
	}
	v := strings.TrimSpace(*w.Value)
	d.scope = strings.ToLower(*w.Scope)
	switch d.scope {
	case "ip":
		a, err := netip.ParseAddr(v)
		if err != nil || a.Zone() != "" {
			return Decision{}, "value"
		}
		a = a.Unmap()
		d.Prefix = netip.PrefixFrom(a, a.BitLen())
	case "range":
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return Decision{}, "value"
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		d.Prefix = p.Masked()
	default:
		return Decision{}, "scope"
	}
	if deleted {
		return d, ""
	}
	if w.Duration == nil {
		return Decision{}, "duration"
	}
	dur, err := time.ParseDuration(*w.Duration)
	if err != nil || dur <= 0 {
		return Decision{}, "duration"
	}
	d.Expires = now.Add(dur)
	return d, ""
}

package policy

import (
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// CrowdSec is the policy's crowdsec: section: where `rampart serve` pulls
// decisions from (a CrowdSec Local API's decision stream) and the list they
// feed. The list is defined by the section, empty until the service fills
// it; rules name it like any other list.
type CrowdSec struct {
	Line     int
	URL      string
	APIKey   string `json:"-"` // never printed
	KeyFile  string // where APIKey came from, "" when given inline
	Interval time.Duration
	Resync   time.Duration // how often the whole set is asked for again
	Scopes   []string      // "ip", "range"
	Origins  []string      // nil: every origin
	Types    []string      // the decision types enforced; others are counted
	List     string
}

// Enforces says whether decisions of the type go into the list.
func (c *CrowdSec) Enforces(typ string) bool {
	return slices.Contains(c.Types, strings.ToLower(typ))
}

func (p *parser) crowdsec(n *yaml.Node, pol *Policy) error {
	f, err := p.fields(n, "crowdsec", "url", "api_key", "api_key_file", "interval", "resync", "scopes", "origins", "types", "list")
	if err != nil {
		return err
	}
	c := &CrowdSec{Line: n.Line, Interval: 10 * time.Second, Resync: 10 * time.Minute, Scopes: []string{"ip", "range"}, Types: []string{"ban"}, List: "crowdsec"}
	un := f["url"]
	if un == nil {
		return p.errf(n, "crowdsec.url", "missing: the CrowdSec Local API's address, e.g. http://127.0.0.1:8080/")
	}
	u, err := url.Parse(un.Value)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return p.errf(un, "crowdsec.url", "%q: must be an http:// or https:// address of the Local API", un.Value)
	}
	c.URL = un.Value
	switch kn, fn := f["api_key"], f["api_key_file"]; {
	case kn != nil && fn != nil:
		return p.errf(fn, "crowdsec.api_key_file", "give api_key or api_key_file, not both")
	case kn != nil:
		c.APIKey = strings.TrimSpace(kn.Value)
	case fn != nil:
		c.KeyFile = fn.Value
		if !filepath.IsAbs(c.KeyFile) {
			c.KeyFile = filepath.Join(p.dir, c.KeyFile)
		}
		b, err := os.ReadFile(c.KeyFile)
		if err != nil {
			return p.errf(fn, "crowdsec.api_key_file", "%v", err)
		}
		c.APIKey = strings.TrimSpace(string(b))
	default:
		return p.errf(n, "crowdsec.api_key", "missing: a bouncer key (cscli bouncers add rampart), as api_key or api_key_file")
	}
	if c.APIKey == "" || strings.ContainsAny(c.APIKey, "\r\n") {
		return p.errf(n, "crowdsec.api_key", "the bouncer key is empty or spans lines")
	}
	if in := f["interval"]; in != nil {
		d, err := time.ParseDuration(in.Value)
		if err != nil || d < 100*time.Millisecond || d > time.Hour {
			return p.errf(in, "crowdsec.interval", "%q: must be a duration from 100ms to 1h, e.g. 10s", in.Value)
		}
		c.Interval = d
	}
	if rn := f["resync"]; rn != nil {
		d, err := time.ParseDuration(rn.Value)
		if err != nil || d < c.Interval || d > 24*time.Hour {
			return p.errf(rn, "crowdsec.resync", "%q: must be a duration from the interval (%s) to 24h, e.g. 10m", rn.Value, c.Interval)
		}
		c.Resync = d
	}
	for _, v := range []struct {
		field   string
		to      *[]string
		allowed []string
	}{{"scopes", &c.Scopes, []string{"ip", "range"}}, {"origins", &c.Origins, nil}, {"types", &c.Types, nil}} {
		vn := f[v.field]
		if vn == nil {
			continue
		}
		vals, err := p.strings(vn, "crowdsec."+v.field)
		if err != nil {
			return err
		}
		if len(vals) == 0 {
			return p.errf(vn, "crowdsec."+v.field, "empty: omit it for the default")
		}
		*v.to = nil
		for _, s := range vals {
			if s = strings.TrimSpace(s); v.field != "origins" { // origins are names: CAPI, cscli
				s = strings.ToLower(s)
			}
			if s == "" {
				return p.errf(vn, "crowdsec."+v.field, "an empty name")
			}
			if v.allowed != nil && !slices.Contains(v.allowed, s) {
				return p.errf(vn, "crowdsec."+v.field, "%q: must be one of %s", s, strings.Join(v.allowed, ", "))
			}
			*v.to = append(*v.to, s)
		}
	}
	if ln := f["list"]; ln != nil {
		if err := validName(ln.Value); err != nil {
			return p.errf(ln, "crowdsec.list", "list name %q: %v", ln.Value, err)
		}
		c.List = ln.Value
	}
	if _, dup := pol.Lists[c.List]; dup {
		return p.errf(n, "crowdsec.list", "list %q is also defined under lists: the crowdsec section fills it; name another (crowdsec.list)", c.List)
	}
	pol.Lists[c.List] = NewList(c.List, nil)
	pol.CrowdSec = c
	return nil
}

// Feeds says whether c feeds list: its own, or one of the lists by origin
// rampart serve splits it into ("list/origin").
func (c *CrowdSec) Feeds(list string) bool {
	return c != nil && (list == c.List || strings.HasPrefix(list, c.List+"/"))
}

package crowdsec

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// lapi answers every poll with body, and records the requests.
func lapi(t *testing.T, status int, body string) (*Client, *[]*http.Request) {
	var reqs []*http.Request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reqs = append(reqs, r)
		w.WriteHeader(status)
		w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return &Client{URL: srv.URL, Key: "k", Scopes: []string{"ip", "range"}}, &reqs
}

func TestStreamDecodes(t *testing.T) {
	body := `{"new":[
	 {"id":1,"origin":"cscli","scenario":"manual \"ban\"  from \\ x","scope":"Ip","type":"ban","value":"192.0.2.7","duration":"1h"},
	 {"id":2,"origin":"CAPI","scope":"Range","type":"ban","value":"2001:db8:1::9/48","duration":"30m"},
	 {"id":3,"origin":"cscli","scope":"Ip","type":"captcha","value":"::ffff:198.51.100.1","duration":"1m"},
	 {"id":4,"origin":"cscli","scope":"Country","type":"ban","value":"FR","duration":"1h"},
	 {"id":5,"origin":"cscli","scope":"Ip","type":"ban","value":"not-an-ip","duration":"1h"},
	 {"id":6,"origin":"cscli","scope":"Ip","type":"ban","value":"192.0.2.8","duration":"-5s"},
	 {"id":7,"origin":"cscli","scope":"Ip","type":"ban","value":"192.0.2.9"}],
	"deleted":[{"id":9,"origin":"cscli","scope":"Ip","type":"ban","value":"192.0.2.1","duration":"-1s"}],
	"extra":{"ignored":true}}`
	c, reqs := lapi(t, 200, body)
	a, err := c.Stream(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	r := (*reqs)[0]
	if r.Header.Get("X-Api-Key") != "k" || r.URL.Path != "/v1/decisions/stream" || r.URL.Query().Get("startup") != "false" || r.URL.Query().Get("scopes") != "ip,range" {
		t.Errorf("request %s %v", r.URL, r.Header)
	}
	var got []string
	for _, d := range a.New {
		got = append(got, d.Prefix.String()+" "+d.Type+" "+d.Origin)
	}
	want := []string{"192.0.2.7/32 ban cscli", "2001:db8:1::/48 ban CAPI", "198.51.100.1/32 captcha cscli"}
	if !slices.Equal(got, want) {
		t.Errorf("new: %q, want %q", got, want)
	}
	if len(a.Deleted) != 1 || a.Deleted[0].ID != 9 {
		t.Errorf("deleted: %+v", a.Deleted)
	}
	if a.Refused["scope"] != 1 || a.Refused["value"] != 1 || a.Refused["duration"] != 2 {
		t.Errorf("refused: %v", a.Refused)
	}
	// A startup answer replaces the set: its deleted decisions are not kept.
	if a, err := c.Stream(context.Background(), true); err != nil || len(a.New) != 3 || len(a.Deleted) != 0 || (*reqs)[1].URL.Query().Get("startup") != "true" {
		t.Errorf("startup: %d new, %d deleted, %v", len(a.New), len(a.Deleted), err)
	}
}

func TestStreamRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, body, reason string
		status             int
	}{
		{"garbage", "<html>bad gateway</html>", "decode", 200},
		{"cut short", `{"new":[{"id":1,"scope":"Ip","type":"ban","value":"192.0.2.7","duration":"1h"}`, "decode", 200},
		{"a list for new", `{"new":{"id":1}}`, "decode", 200},
		{"two objects", `{"new":null}{"new":null}`, "decode", 200},
		{"too large", `{"new":[` + strings.Repeat(" ", 5000) + `]}`, "too-large", 200},
		{"bad key", `{"message":"access forbidden"}`, "auth", 403},
		{"server error", `oops`, "status", 500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := lapi(t, tc.status, tc.body)
			c.MaxBody = 4096
			a, err := c.Stream(context.Background(), false)
			var ce *Error
			if !errors.As(err, &ce) || ce.Reason != tc.reason {
				t.Fatalf("got %v, %v; want a %q error", a, err, tc.reason)
			}
		})
	}
	c := &Client{URL: "http://127.0.0.1:1/", Key: "k"}
	if _, err := c.Stream(context.Background(), true); err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("a LAPI that is not there: %v", err)
	}
}

func decision(id int64, prefix, typ string, ttl time.Duration) Decision {
	return Decision{ID: id, Origin: "cscli", Type: typ, Prefix: netip.MustParsePrefix(prefix), Expires: time.Now().Add(ttl)}
}

func TestSet(t *testing.T) {
	s := NewSet(func(d Decision) bool { return d.Type == "ban" })
	if changed, fresh := s.Replace(&Answer{New: []Decision{decision(1, "192.0.2.7/32", "ban", time.Hour), decision(2, "192.0.2.0/24", "ban", time.Hour), decision(3, "198.51.100.1/32", "captcha", time.Hour)}}); !changed || len(fresh) != 2 {
		t.Errorf("a first startup answer: changed %v, %d fresh bans", changed, len(fresh))
	}
	if got := s.Prefixes(); len(got) != 2 {
		t.Errorf("enforced %v, want the two bans", got)
	}
	if s.Counts()[Kind{"cscli", "captcha"}] != 1 {
		t.Error("the captcha is not counted")
	}
	// The same decisions again, with other expiries: nothing to rebuild.
	if changed, _ := s.Replace(&Answer{New: []Decision{decision(1, "192.0.2.7/32", "ban", 2*time.Hour), decision(2, "192.0.2.0/24", "ban", time.Hour), decision(3, "198.51.100.1/32", "captcha", time.Hour)}}); changed {
		t.Error("expiries alone counted as a change")
	}
	// A decision sent again takes its new time; one that expires goes.
	adds, removed := s.Update(&Answer{New: []Decision{decision(4, "203.0.113.5/32", "ban", 50*time.Millisecond), decision(1, "192.0.2.7/32", "ban", time.Hour)}})
	if removed || len(adds) != 1 || adds[0].Prefix != netip.MustParsePrefix("203.0.113.5/32") {
		t.Errorf("update: adds %v removed %v", adds, removed)
	}
	if s.Expire(time.Now()) {
		t.Error("expired before its time")
	}
	if !s.Expire(time.Now().Add(100*time.Millisecond)) || s.Len() != 3 {
		t.Errorf("the 50 ms decision did not expire alone: %d left", s.Len())
	}
	// Deleting the /32's decision leaves the /24's: a rebuild keeps it listed.
	if _, removed := s.Update(&Answer{Deleted: []Decision{{ID: 1}}}); !removed {
		t.Error("a deleted decision was not reported")
	}
	if got := s.Prefixes(); len(got) != 1 || got[0].String() != "192.0.2.0/24" {
		t.Errorf("after the delete: %v", got)
	}
	// Saved and read back, without what expired meanwhile.
	path := filepath.Join(t.TempDir(), "set")
	s.Update(&Answer{New: []Decision{decision(5, "2001:db8::/32", "ban", 50*time.Millisecond)}})
	if err := s.Save(path); err != nil {
		t.Fatal(err)
	}
	r := NewSet(nil)
	if err := r.Load(path, time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	// Decisions 2 (the /24 ban) and 3 (the captcha); 5 expired.
	if c := r.Counts(); r.Len() != 2 || c[Kind{"cscli", "ban"}] != 1 || c[Kind{"cscli", "captcha"}] != 1 {
		t.Errorf("read back %d decisions: %v", r.Len(), c)
	}
}

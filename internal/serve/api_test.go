package serve

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestDecodeBanRefuses: a malformed, misspelt, trailing or oversized ban
// request is an error naming what is wrong, before any change is made.
func TestDecodeBanRefuses(t *testing.T) {
	huge := io.MultiReader(strings.NewReader(`{"list":"l","prefixes":["`), strings.NewReader(strings.Repeat("1", maxBanBody)), strings.NewReader(`"]}`))
	for _, c := range []struct {
		name string
		body io.Reader
		want string
	}{
		{"not JSON", strings.NewReader("ban 192.0.2.1"), "invalid character"},
		{"cut short", strings.NewReader(`{"list":"l","prefixes":["192.0.2.1"`), "unexpected EOF"},
		{"misspelt ttl", strings.NewReader(`{"list":"l","prefixes":["192.0.2.1"],"tll":"10m"}`), `unknown field "tll"`},
		{"two objects", strings.NewReader(`{"list":"l","prefixes":["192.0.2.1"]} {"list":"l"}`), "more than one JSON object"},
		{"wrong type", strings.NewReader(`{"list":"l","prefixes":"192.0.2.1"}`), "cannot unmarshal string"},
		{"bad prefix", strings.NewReader(`{"list":"l","prefixes":["192.0.2.300"]}`), `prefix "192.0.2.300"`},
		{"bad ttl", strings.NewReader(`{"list":"l","prefixes":["192.0.2.1"],"ttl":"-1m"}`), `ttl "-1m"`},
		{"over the cap", huge, "at most 64 MiB"},
	} {
		var req BanRequest
		_, _, err := decodeBan(httptest.NewRequest("POST", "/v1/ban", c.body), &req)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	var req BanRequest
	p, ttl, err := decodeBan(httptest.NewRequest("POST", "/v1/ban", strings.NewReader(`{"list":"l","prefixes":["192.0.2.1","2001:db8::/32"],"ttl":"10m"}`)), &req)
	if err != nil || len(p) != 2 || ttl.Minutes() != 10 || req.List != "l" {
		t.Errorf("a good request: %v %v %v %+v", p, ttl, err, req)
	}
}

package policy

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestCrowdSecSection(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "key"), []byte("s3cret\n"), 0o600)
	pol, err := Parse(filepath.Join(dir, "p.yaml"), []byte(`crowdsec:
  url: http://127.0.0.1:8080/
  api_key_file: key
  interval: 2s
  origins: [CAPI, cscli]
  types: [ban, Captcha]
  list: cs
rules:
  - {name: cs, src: cs, action: drop}
`))
	if err != nil {
		t.Fatal(err)
	}
	c := pol.CrowdSec
	if c == nil || c.APIKey != "s3cret" || c.Interval != 2*time.Second || c.Resync != 10*time.Minute || c.List != "cs" ||
		!slices.Equal(c.Origins, []string{"CAPI", "cscli"}) || !slices.Equal(c.Types, []string{"ban", "captcha"}) || !slices.Equal(c.Scopes, []string{"ip", "range"}) {
		t.Fatalf("section read as %+v", c)
	}
	if l := pol.Lists["cs"]; l == nil || len(l.V4)+len(l.V6) != 0 {
		t.Errorf("the list the section defines: %+v", l)
	}
	if !c.Enforces("BAN") || c.Enforces("throttle") {
		t.Error("Enforces")
	}
}

func TestCrowdSecErrors(t *testing.T) {
	for _, c := range []struct{ name, yaml, want string }{
		{"no url", "crowdsec: {api_key: k}\nrules: []", "p.yaml:1: crowdsec.url: missing"},
		{"bad url", "crowdsec: {url: 'ftp://x', api_key: k}\nrules: []", `p.yaml:1: crowdsec.url: "ftp://x": must be an http:// or https://`},
		{"no key", "crowdsec: {url: 'http://x/'}\nrules: []", "p.yaml:1: crowdsec.api_key: missing"},
		{"both keys", "crowdsec:\n  url: http://x/\n  api_key: k\n  api_key_file: f\nrules: []", "p.yaml:4: crowdsec.api_key_file: give api_key or api_key_file, not both"},
		{"key file missing", "crowdsec:\n  url: http://x/\n  api_key_file: nope\nrules: []", "p.yaml:3: crowdsec.api_key_file: open testdata/nope"},
		{"bad interval", "crowdsec:\n  url: http://x/\n  api_key: k\n  interval: 1ms\nrules: []", `p.yaml:4: crowdsec.interval: "1ms"`},
		{"resync under interval", "crowdsec:\n  url: http://x/\n  api_key: k\n  interval: 10s\n  resync: 5s\nrules: []", `p.yaml:5: crowdsec.resync: "5s"`},
		{"bad scope", "crowdsec:\n  url: http://x/\n  api_key: k\n  scopes: [ip, country]\nrules: []", `p.yaml:4: crowdsec.scopes: "country": must be one of ip, range`},
		{"unknown key", "crowdsec:\n  url: http://x/\n  api_key: k\n  lapi: y\nrules: []", `unknown key "lapi"`},
		{"list defined twice", "lists:\n  crowdsec: {prefixes: [192.0.2.0/24]}\ncrowdsec: {url: 'http://x/', api_key: k}\nrules: []", `p.yaml:3: crowdsec.list: list "crowdsec" is also defined under lists`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("testdata/p.yaml", []byte(c.yaml))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v\nwant it to contain %q", err, c.want)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Error("the key is in the error")
			}
		})
	}
}

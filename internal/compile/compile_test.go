package compile

import (
	"net/netip"
	"testing"

	"github.com/rampart-fw/rampart/internal/policy"
)

func TestClosureAndAggregation(t *testing.T) {
	pol, err := policy.Parse("p.yaml", []byte(`
lists:
  deny: {prefixes: [10.0.0.0/8, 10.1.0.0/16, 10.1.2.0/24, 10.1.2.0/24]}
  allow: {prefixes: [10.1.2.128/25]}
rules:
  - {name: allow, src: allow, action: pass}
  - {name: deny, src: deny, action: drop}
`))
	if err != nil {
		t.Fatal(err)
	}
	img := Build(pol)
	got := map[string]uint64{}
	for _, e := range img.V4 {
		got[netip.PrefixFrom(netip.AddrFrom4(e.Key.Addr), int(e.Key.Prefixlen)).String()] = e.Mask
	}
	// allow is bit 0 (first referenced), deny bit 1. The /16 and /24 inside
	// the /8 add nothing to a longest-prefix lookup; the allow /25 carries
	// both bits.
	want := map[string]uint64{"10.0.0.0/8": 2, "10.1.2.128/25": 3}
	if len(got) != len(want) {
		t.Fatalf("entries %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: mask %b, want %b (all %v)", k, got[k], v, got)
		}
	}
	if !img.NeedSrc || img.NeedDst {
		t.Errorf("lookups: src %v dst %v", img.NeedSrc, img.NeedDst)
	}
}

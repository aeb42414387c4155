package policy

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestFlowSpecSection(t *testing.T) {
	pol, err := Parse("p.yaml", []byte(`flowspec:
  local_as: 65001
  router_id: 192.0.2.1
  listen: 0.0.0.0:1179
  neighbors:
    - {address: 192.0.2.2, peer_as: 65000}
    - {address: "2001:db8::2", peer_as: AS65002, families: [ipv6], max_routes: 50, hold_time: 9s}
  position: after ssh
  interfaces: [eth0, eth1]
rules:
  - {name: ssh, dport: 22, proto: tcp, action: pass}
  - {name: web, dport: 80, proto: tcp, action: pass}
  - {name: bad, src: 198.51.100.0/24, action: drop}
`))
	if err != nil {
		t.Fatal(err)
	}
	f := pol.FlowSpec
	if f == nil || f.LocalAS != 65001 || f.RouterID != netip.MustParseAddr("192.0.2.1") || f.Listen != netip.MustParseAddrPort("0.0.0.0:1179") || len(f.Neighbors) != 2 {
		t.Fatalf("section read as %+v", f)
	}
	if n := f.Neighbors[0]; !n.IPv4 || !n.IPv6 || n.MaxRoutes != 10000 || n.HoldTime != 90*time.Second || n.PeerAS != 65000 {
		t.Errorf("defaults: %+v", n)
	}
	if n := f.Neighbors[1]; n.IPv4 || !n.IPv6 || n.MaxRoutes != 50 || n.HoldTime != 9*time.Second || n.PeerAS != 65002 {
		t.Errorf("second neighbor: %+v", n)
	}
	if !slices.Equal(f.Interfaces, []string{"eth0", "eth1"}) || f.InterfacesLine != 9 {
		t.Errorf("interfaces %v at line %d", f.Interfaces, f.InterfacesLine)
	}
	for pos, want := range map[string]int{"after ssh": 1, "before bad": 2, "first": 0, "last": 3, "auto": 2} {
		f.Position, f.Anchor, _ = strings.Cut(pos, " ")
		if got := pol.FlowSpecAt(); got != want {
			t.Errorf("position %q: at %d, want %d", pos, got, want)
		}
	}
}

func TestFlowSpecErrors(t *testing.T) {
	const nb = "  neighbors: [{address: 192.0.2.2, peer_as: 65000}]\n"
	for _, c := range []struct{ name, yaml, want string }{
		{"no as", "flowspec: {router_id: 192.0.2.1}\nrules: []", "p.yaml:1: flowspec.local_as: missing"},
		{"bad as", "flowspec:\n  local_as: 0\n  router_id: 192.0.2.1\n" + nb + "rules: []", `p.yaml:2: flowspec.local_as: "0": must be an AS number`},
		{"router id v6", "flowspec:\n  local_as: 1\n  router_id: '::1'\n" + nb + "rules: []", `p.yaml:3: flowspec.router_id: "::1": must be a non-zero IPv4 address`},
		{"no neighbors", "flowspec:\n  local_as: 1\n  router_id: 192.0.2.1\nrules: []", "p.yaml:2: flowspec.neighbors: needs a list of neighbors"},
		{"bad listen", "flowspec:\n  local_as: 1\n  router_id: 192.0.2.1\n  listen: 179\n" + nb + "rules: []", `p.yaml:4: flowspec.listen: "179"`},
		{"dup neighbor", "flowspec:\n  local_as: 1\n  router_id: 192.0.2.1\n  neighbors:\n    - {address: 192.0.2.2, peer_as: 2}\n    - {address: 192.0.2.2, peer_as: 3}\nrules: []", "p.yaml:6: flowspec.neighbors.address: 192.0.2.2 is already a neighbor at line 5"},
		{"bad family", "flowspec:\n  local_as: 1\n  router_id: 192.0.2.1\n  neighbors:\n    - {address: 192.0.2.2, peer_as: 2, families: [l2vpn]}\nrules: []", `p.yaml:5: flowspec.neighbors.families: "l2vpn"`},
		{"hold time", "flowspec:\n  local_as: 1\n  router_id: 192.0.2.1\n  neighbors:\n    - {address: 192.0.2.2, peer_as: 2, hold_time: 1s}\nrules: []", `p.yaml:5: flowspec.neighbors.hold_time: "1s"`},
		{"max routes", "flowspec:\n  local_as: 1\n  router_id: 192.0.2.1\n  neighbors:\n    - {address: 192.0.2.2, peer_as: 2, max_routes: 0}\nrules: []", `p.yaml:5: flowspec.neighbors.max_routes: "0"`},
		{"no anchor", "flowspec:\n  local_as: 1\n  router_id: 192.0.2.1\n  position: before nope\n" + nb + "rules: []", `p.yaml:4: flowspec.position: no rule is named "nope"`},
		{"no interfaces", "flowspec:\n  local_as: 1\n  router_id: 192.0.2.1\n  interfaces: []\n" + nb + "rules: []", "p.yaml:4: flowspec.interfaces: empty"},
		{"bad interface", "flowspec:\n  local_as: 1\n  router_id: 192.0.2.1\n  interfaces: [eth0, a/b]\n" + nb + "rules: []", `p.yaml:4: flowspec.interfaces: "a/b": not an interface name`},
		{"interface twice", "flowspec:\n  local_as: 1\n  router_id: 192.0.2.1\n  interfaces: [eth0, eth0]\n" + nb + "rules: []", "p.yaml:4: flowspec.interfaces: eth0 is named twice"},
		{"bad position", "flowspec:\n  local_as: 1\n  router_id: 192.0.2.1\n  position: middle\n" + nb + "rules: []", `p.yaml:4: flowspec.position: "middle"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(c.yaml))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v\nwant it to contain %q", err, c.want)
			}
		})
	}
}

// The fields BGP FlowSpec brings to rules: ICMP type and code, DSCP,
// fragment bits and the flow label, read and refused as the other fields
// are.
func TestLeafFields(t *testing.T) {
	pol, err := Parse("p.yaml", []byte(`rules:
  - {name: echo, proto: icmp, icmp_type: 8, icmp_code: 0-3, action: drop}
  - {name: ef, dscp: 46, action: pass}
  - {name: frags, fragment: "is,!last", action: drop}
  - {name: label, flow_label: 100-1048575, action: drop}
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(pol.Warnings) != 0 {
		t.Errorf("warnings %v: no rule here matches every frame", pol.Warnings)
	}
	r := pol.Rules
	if *r[0].ICMPType != (Range{8, 8}) || *r[0].ICMPCode != (Range{0, 3}) || *r[1].DSCP != (Range{46, 46}) ||
		!r[2].HasFrag || r[2].FragOn != FragIs || r[2].FragOff != FragLast || *r[3].FlowLabel != (Range{100, MaxFlowLabel}) {
		t.Fatalf("read as %+v", r)
	}
	if !r[0].NeedsL4() || r[1].NeedsL4() || !r[2].NeedsL4() {
		t.Error("NeedsL4: ICMP and fragment bits (IPv6's are in the header chain) need the L4 walk, DSCP does not")
	}
	if !strings.Contains(r[2].MatchKey(), "fragment=is,!last") || !strings.Contains(r[0].MatchKey(), "icmp_type=8;icmp_code=0-3") {
		t.Errorf("match keys %q, %q", r[0].MatchKey(), r[2].MatchKey())
	}
	if r[3].NeedsL4() || !strings.Contains(r[3].MatchKey(), "flow_label=100-1048575") {
		t.Errorf("the flow label rule: NeedsL4 %v, match key %q", r[3].NeedsL4(), r[3].MatchKey())
	}
	for _, c := range []struct{ yaml, want string }{
		{"{name: a, proto: tcp, icmp_type: 8, action: drop}", "p.yaml:2: icmp_type: rule \"a\" matches an ICMP type or code but its proto is not icmp"},
		{"{name: a, dport: 80, icmp_code: 1, action: drop}", "p.yaml:2: icmp_type: rule \"a\" matches an ICMP type or code and ports"},
		{"{name: a, icmp_type: 256, action: drop}", `p.yaml:2: icmp_type: "256": at most 255`},
		{"{name: a, dscp: 64, action: drop}", `p.yaml:2: dscp: "64": at most 63`},
		{"{name: a, flow_label: 1048576, action: drop}", `p.yaml:2: flow_label: "1048576": values go up to 1048575`},
		{"{name: a, family: 4, flow_label: 5, action: drop}", `p.yaml:2: flow_label: rule "a" matches a flow label, which only IPv6 has, and IPv4 alone`},
		{"{name: a, fragment: middle, action: drop}", `p.yaml:2: fragment: "middle": unknown fragment bit "middle" (fragment bits: df,is,first,last`},
		{"{name: a, fragment: 'is,!is', action: drop}", `a fragment bit cannot be both set and clear`},
	} {
		if _, err := Parse("p.yaml", []byte("rules:\n  - "+c.yaml+"\n")); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.yaml, err, c.want)
		}
	}
}

// AddrBits: an RFC 8956 prefix with an offset matches the bits from the
// offset to its length, wherever the rest of the address points.
func TestAddrBits(t *testing.T) {
	b := AddrBits{Prefix: netip.MustParsePrefix("0:0:1234::/48"), Offset: 32}
	for addr, want := range map[string]bool{
		"2001:db8:1234::1": true, "fd00:0:1234:ffff::": true, "2001:db8:1235::": false, "::": false,
	} {
		if got := b.Has(netip.MustParseAddr(addr)); got != want {
			t.Errorf("%s offset 32: has %s = %v", b.Prefix, addr, got)
		}
	}
	if m := b.Mask(); m != [16]byte{4: 0xff, 5: 0xff} {
		t.Errorf("mask %x", m)
	}
	r := Rule{DstBits: &b}
	if !strings.Contains(r.MatchKey(), "dst_bits=0:0:1234::/48 offset 32") || r.matchesAll() {
		t.Errorf("match key %q, matches all %v", r.MatchKey(), r.matchesAll())
	}
}

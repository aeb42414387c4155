package flowspec

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/rampart-fw/rampart/internal/packet"
	"github.com/rampart-fw/rampart/internal/policy"
)

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The RFCs' encoding examples (RFC 8955 §4.3, RFC 8956 §3.8), byte for
// byte, and what they match.
func TestRFCExamples(t *testing.T) {
	for _, tc := range []struct {
		hex, want string
		v6        bool
	}{
		{"0b0118c00002038106048119", "dst 192.0.2.0/24 proto =6 port =25", false},
		{"120118c000020218cb0071040389458b911f90", "dst 192.0.2.0/24 src 203.0.113.0/24 port >=137&<=139,=8080", false},
		{"090120c00002010c8005", "dst 192.0.2.1/32 fragment 0x5", false},
		// RFC 8956's table prints the last byte of 2001:db8 as bb; its
		// decoding (and the address) says b8.
		{"1201200020010db802684012345678 9a038106", "dst 2001:db8::/32 src ::1234:5678:9a00:0/104 offset 64 proto =6", true},
	} {
		b := mustHex(t, tc.hex)
		r, rest, err := Decode(b, tc.v6)
		if err != nil || len(rest) != 0 {
			t.Fatalf("%s: %v, %d left", tc.hex, err, len(rest))
		}
		if got := r.String(); got != tc.want {
			t.Errorf("%s decodes as %q, want %q", tc.hex, got, tc.want)
		}
		if got := Encode(r); !bytes.Equal(got, b) {
			t.Errorf("%s encodes back as %x", tc.hex, got)
		}
	}
	r, _, _ := Decode(mustHex(t, "120118c000020218cb0071040389458b911f90"), false)
	c := r.Get(TypePort)
	for v, want := range map[uint64]bool{136: false, 137: true, 139: true, 140: false, 8080: true, 8081: false} {
		if got := evalOps(c.Ops, false, v); got != want {
			t.Errorf("port %d: %v, want %v", v, got, want)
		}
	}
	if got := ranges(c.Ops, 65535); !slices.Equal(got, []policy.Range{{Lo: 137, Hi: 139}, {Lo: 8080, Hi: 8080}}) {
		t.Errorf("ranges %v", got)
	}
}

// AND binds tighter than OR: a OR b AND c is a OR (b AND c).
func TestAndBeforeOr(t *testing.T) {
	ops := []Op{{Bits: opEq, Value: 1, Len: 1}, {Bits: opGt, Value: 10, Len: 1}, {And: true, Bits: opLt, Value: 20, Len: 1}}
	for v, want := range map[uint64]bool{1: true, 5: false, 15: true, 25: false} {
		if got := evalOps(ops, false, v); got != want {
			t.Errorf("%d: %v, want %v", v, got, want)
		}
	}
}

func TestDecodeRefuses(t *testing.T) {
	for _, h := range []string{
		"",                // nothing
		"00",              // no components
		"0301180a",        // a prefix cut
		"0403010602",      // proto's list never ends
		"06038106 01180a", // dst after proto: types must increase
		"030e8101",        // type 14: unknown
		"03098901",        // a reserved bit in a bitmask op
		"04038206",        // a value longer than the NLRI
		"f0",              // a two-byte length cut
		"0501210a000001",  // an IPv4 prefix of 33 bits
	} {
		if _, _, err := Decode(mustHex(t, h), false); err == nil {
			t.Errorf("%s decoded", h)
		}
	}
	// IPv6: an offset not below the length.
	if _, _, err := Decode(mustHex(t, "04012020 00"), true); err == nil {
		t.Error("an offset equal to the length decoded")
	}
}

func TestCompare(t *testing.T) {
	p := func(s string) Component {
		return Component{Type: TypeDst, Prefix: netip.MustParsePrefix(s)}
	}
	route := func(cs ...Component) *Route {
		r := &Route{Components: cs}
		*r, _, _ = Decode(Encode(*r), false)
		return r
	}
	proto := func(v uint64) Component {
		return Component{Type: TypeProto, Ops: []Op{{Bits: opEq, Value: v, Len: 1}}}
	}
	for _, tc := range []struct {
		a, b *Route
		want int // sign
	}{
		{route(p("10.0.0.0/24")), route(p("10.0.0.0/16")), -1},                                                                              // more specific first
		{route(p("10.0.1.0/24")), route(p("10.0.0.0/24")), 1},                                                                               // disjoint: lower address first
		{route(p("10.0.0.0/24")), route(proto(6)), -1},                                                                                      // the lower type first
		{route(p("10.0.0.0/24"), proto(6)), route(p("10.0.0.0/24")), -1},                                                                    // more components first
		{route(p("10.0.0.0/24"), proto(6)), route(p("10.0.0.0/24"), proto(17)), -1},                                                         // lower bytes first
		{route(p("10.0.0.0/24"), proto(6)), route(p("10.0.0.0/24"), proto(6)), 0},                                                           // equal
		{route(proto(6)), route(Component{Type: TypeProto, Ops: []Op{{Bits: opEq, Value: 6, Len: 1}, {Bits: opEq, Value: 17, Len: 1}}}), 1}, // common prefix... 0x01 06 vs 0x01 06 0x81 11: first ops differ in the end bit
	} {
		got := Compare(tc.a, tc.b)
		if sign(got) != tc.want || sign(Compare(tc.b, tc.a)) != -tc.want {
			t.Errorf("%s vs %s: %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

func sign(v int) int {
	switch {
	case v < 0:
		return -1
	case v > 0:
		return 1
	}
	return 0
}

// randomOps makes a numeric or bitmask operator list over values near
// interesting ones.
func randomOps(rng *rand.Rand, bitmask bool, vals []uint64) []Op {
	ops := make([]Op, 1+rng.IntN(3))
	for i := range ops {
		ops[i] = Op{And: i > 0 && rng.IntN(2) == 0, Len: 1, Value: vals[rng.IntN(len(vals))]}
		switch {
		case ops[i].Value > 65535:
			ops[i].Len = 4
		case ops[i].Value > 255:
			ops[i].Len = 2
		}
		if bitmask {
			ops[i].Bits = byte(rng.IntN(4))
		} else {
			ops[i].Bits = byte(1 + rng.IntN(6))
		}
	}
	return ops
}

var (
	testPrefixes4 = []string{"10.0.0.0/8", "10.1.0.0/16", "10.1.2.0/24", "10.1.2.3/32", "192.0.2.0/24"}
	testPrefixes6 = []string{"2001:db8::/32", "2001:db8:1::/48", "2001:db8:1::5/128", "fd00::/8"}
	testProtos    = []uint64{1, 6, 17, 58, 47}
	testPorts     = []uint64{0, 22, 53, 80, 443, 1024, 8080, 65535}
	testLengths   = []uint64{40, 60, 100, 576, 1500}
	// Two-byte values test byte 12: NS, the reserved bits, the data
	// offset (read as 0).
	testFlags  = []uint64{0x02, 0x10, 0x12, 0x04, 0x01, 0x3f, 0x0100, 0x0e00, 0x0f12, 0x1002}
	testICMP   = []uint64{0, 3, 8, 128, 135}
	testLabels = []uint64{0, 5, 0x12345, policy.MaxFlowLabel}
)

// victim is one of thousands of prefixes inside 10.1.0.0/16 or
// 2001:db8:1::/48, as a feed names the addresses under attack: each a rule's
// own, none taking a bit of the membership mask.
func victim(rng *rand.Rand, ipv6 bool) netip.Prefix {
	if ipv6 {
		a := [16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 1, 6: byte(rng.IntN(256)), 7: byte(rng.IntN(256)), 15: byte(rng.IntN(256))}
		return netip.PrefixFrom(netip.AddrFrom16(a), []int{64, 120, 128}[rng.IntN(3)]).Masked()
	}
	a := [4]byte{10, 1, byte(rng.IntN(256)), byte(rng.IntN(256))}
	return netip.PrefixFrom(netip.AddrFrom4(a), []int{24, 28, 32}[rng.IntN(3)]).Masked()
}

// RandomRoute makes a route of the components rampart installs.
func randomRoute(rng *rand.Rand, ipv6 bool) Route {
	r := Route{IPv6: ipv6}
	pfx := testPrefixes4
	if ipv6 {
		pfx = testPrefixes6
	}
	for typ := TypeDst; typ <= TypeFlowLabel; typ++ {
		if rng.IntN(3) != 0 || typ == TypeFlowLabel && !ipv6 {
			continue
		}
		c := Component{Type: typ}
		switch typ {
		case TypeDst, TypeSrc:
			c.Prefix = netip.MustParsePrefix(pfx[rng.IntN(len(pfx))])
			if rng.IntN(2) == 0 {
				c.Prefix = victim(rng, ipv6)
			}
			if ipv6 && rng.IntN(3) == 0 {
				c.Offset = rng.IntN(c.Prefix.Bits())
			}
		case TypeProto:
			c.Ops = randomOps(rng, false, testProtos)
		case TypePort, TypeDport, TypeSport:
			c.Ops = randomOps(rng, false, testPorts)
		case TypeTCPFlags:
			c.Ops = randomOps(rng, true, testFlags)
		case TypeLength:
			c.Ops = randomOps(rng, false, testLengths)
		case TypeICMPType:
			c.Ops = randomOps(rng, false, testICMP)
		case TypeICMPCode:
			c.Ops = randomOps(rng, false, []uint64{0, 1, 3})
		case TypeDSCP:
			c.Ops = randomOps(rng, false, []uint64{0, 10, 46})
		case TypeFragment:
			c.Ops = randomOps(rng, true, []uint64{FragDF, FragIsF, FragFF, FragLF, FragIsF | FragLF, FragDF | FragFF})
		case TypeFlowLabel:
			c.Ops = randomOps(rng, false, testLabels)
		}
		r.Components = append(r.Components, c)
	}
	if len(r.Components) == 0 {
		r.Components = []Component{{Type: TypeProto, Ops: []Op{{Bits: opEq, Value: 17, Len: 1}}}}
	}
	r, _, _ = Decode(Encode(r), ipv6)
	return r
}

func pick[T any](rng *rand.Rand, s []T) T { return s[rng.IntN(len(s))] }

func randomFrame(rng *rand.Rand, ipv6 bool) []byte {
	addr := func(pfx []string) netip.Addr {
		p := netip.MustParsePrefix(pick(rng, pfx))
		a := p.Addr().AsSlice()
		if rng.IntN(2) == 0 {
			a[len(a)-1] ^= byte(rng.IntN(4))
		}
		ad, _ := netip.AddrFromSlice(a)
		return ad
	}
	pfx := testPrefixes4
	if ipv6 {
		pfx = testPrefixes6
	}
	f := packet.Frame{Src: addr(pfx), Dst: addr(pfx), Proto: uint8(pick(rng, testProtos))}
	f.Sport, f.Dport = uint16(pick(rng, testPorts)+uint64(rng.IntN(2))), uint16(pick(rng, testPorts))
	f.TCPFlags, f.TCPRes = uint8(rng.IntN(256)), uint8(rng.IntN(16))
	f.Payload = int(pick(rng, testLengths)) - 20 + rng.IntN(3)
	f.ICMPType, f.ICMPCode = uint8(pick(rng, testICMP)+uint64(rng.IntN(2))), uint8(rng.IntN(4))
	f.TOS = uint8(pick(rng, []uint64{0, 10, 46})+uint64(rng.IntN(2))) << 2
	f.FlowLabel = uint32(pick(rng, testLabels)+uint64(rng.IntN(2))) & policy.MaxFlowLabel
	f.DF = rng.IntN(2) == 0
	if rng.IntN(5) == 0 {
		f.FragOff, f.MoreFrags = uint16(rng.IntN(3)), rng.IntN(2) == 0
		f.Fragment = true
	}
	return f.Bytes()
}

// TestRulesAgreeWithRFC holds the rules a route becomes to the reference
// matcher, frame by frame, through policy.Eval.
func TestRulesAgreeWithRFC(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	routes, frames := 3000, 300
	complex, checked := 0, 0
	var seen [3]int // frames by the reference's answer
	if testing.Short() {
		routes = 300
	}
	for i := range routes {
		ipv6 := i%2 == 1
		r := randomRoute(rng, ipv6)
		pol := &policy.Policy{Lists: map[string]*policy.List{}, Default: policy.Pass, Unparsed: policy.Limit}
		rules, err := Rules(&r, Action{Kind: Drop}, "r", pol.Lists)
		var u *Unsupported
		if errors.As(err, &u) && u.Reason == "too-complex" {
			complex++
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", r.String(), err)
		}
		checked++
		pol.Rules = rules
		for range frames {
			f := randomFrame(rng, ipv6)
			p, class := policy.ParseFrame(f)
			if class != policy.ClassIP {
				continue
			}
			want := r.Matches(&p)
			seen[want]++
			v := pol.Eval(f)
			switch {
			case want == Unknown:
				continue // rampart's unparsed action decides; the RFC has no word
			case v.Unparsed:
				t.Fatalf("route %s, frame %x: unparsed, the RFC says %v", r.String(), f, want)
			case (v.Action == policy.Drop) != (want == Match):
				t.Fatalf("route %s (rules %+v), frame %x (%+v): rampart %v, RFC %v", r.String(), rules, f, p, v.Action, want)
			}
		}
	}
	t.Logf("%d routes checked, %d too complex for rules; frames: %d not matched, %d matched, %d unknown", checked, complex, seen[NoMatch], seen[Match], seen[Unknown])
	if seen[Match] < checked || seen[NoMatch] < checked {
		t.Errorf("too few frames matched or not: %v", seen)
	}
	if complex > checked/20 {
		t.Errorf("%d of %d routes too complex", complex, checked+complex)
	}
}

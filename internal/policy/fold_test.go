package policy

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

// TestFold: a list with its ops folded in holds what the list with the ops
// beside it holds (Contains, the reference the overlay is held to), address
// for address, over ops that nest, repeat and undo each other.
func TestFold(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	near := func(v6 bool) netip.Addr {
		if v6 {
			return netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(rng.IntN(4))}).Next()
		}
		return netip.AddrFrom4([4]byte{10, byte(rng.IntN(2)), byte(rng.IntN(4)), byte(rng.IntN(256))})
	}
	prefix := func(v6 bool) netip.Prefix {
		a := near(v6)
		if v6 {
			return netip.PrefixFrom(a, 96+rng.IntN(33)).Masked()
		}
		return netip.PrefixFrom(a, 14+rng.IntN(19)).Masked()
	}
	for round := range 300 {
		var base []netip.Prefix
		for range rng.IntN(20) {
			base = append(base, prefix(rng.IntN(2) == 0))
		}
		if round%50 == 0 {
			base = append(base, netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0"))
		}
		l := NewList("l", base)
		for range rng.IntN(60) {
			p := prefix(rng.IntN(2) == 0)
			if rng.IntN(40) == 0 {
				p = netip.PrefixFrom(p.Addr(), 0).Masked()
			}
			l.Ops = append(l.Ops, ListOp{List: "l", Prefix: p, Add: rng.IntN(2) == 0})
		}
		f := l.Fold(l.Ops)
		if len(f.Ops) != 0 || len(l.Ops) == 0 && (len(f.V4) != len(l.V4) || len(f.V6) != len(l.V6)) {
			t.Fatalf("round %d: folded list keeps %d ops", round, len(f.Ops))
		}
		for range 2000 {
			a := near(rng.IntN(2) == 0)
			if rng.IntN(10) == 0 {
				a = netip.AddrFrom4([4]byte{byte(rng.IntN(256)), byte(rng.IntN(256)), 0, 1})
			}
			if f.Contains(a) != l.Contains(a) {
				t.Fatalf("round %d: %s: folded %v, with ops %v (ops %v)", round, a, f.Contains(a), l.Contains(a), l.Ops)
			}
		}
		for _, op := range l.Ops { // the edges of every op
			for _, a := range []netip.Addr{op.Prefix.Addr(), lastOf(op.Prefix), op.Prefix.Addr().Prev(), lastOf(op.Prefix).Next()} {
				if a.IsValid() && f.Contains(a) != l.Contains(a) {
					t.Fatalf("round %d: %s at the edge of %s: folded %v, with ops %v", round, a, op.Prefix, f.Contains(a), l.Contains(a))
				}
			}
		}
	}
}

func lastOf(p netip.Prefix) netip.Addr {
	if p.Addr().Is4() {
		return UintToV4(PrefixRange4(p).Hi)
	}
	return PrefixRange6(p).Hi.Addr()
}

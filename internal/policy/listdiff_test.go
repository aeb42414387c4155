package policy

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

// TestDiffList: base with the ops DiffList gives holds what next holds, at
// every address where either list or an op starts or ends, for random
// lists of both families sharing most of their entries.
func TestDiffList(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	prefix := func() netip.Prefix {
		if rng.IntN(2) == 0 {
			a := netip.AddrFrom4([4]byte{10, byte(rng.IntN(4)), byte(rng.IntN(256)), byte(rng.IntN(256))})
			return netip.PrefixFrom(a, 20+rng.IntN(13)).Masked()
		}
		a := netip.AddrFrom16([16]byte{0x20, 1, 0xd, 0xb8, 15: byte(rng.IntN(256)), 14: byte(rng.IntN(4))})
		return netip.PrefixFrom(a, 112+rng.IntN(17)).Masked()
	}
	for round := range 200 {
		var common, onlyBase, onlyNext []netip.Prefix
		for range rng.IntN(60) {
			common = append(common, prefix())
		}
		for range rng.IntN(6) {
			onlyBase = append(onlyBase, prefix())
		}
		for range rng.IntN(6) {
			onlyNext = append(onlyNext, prefix())
		}
		base := NewList("l", append(append([]netip.Prefix{}, common...), onlyBase...))
		next := NewList("l", append(append([]netip.Prefix{}, common...), onlyNext...))
		ops, ok := DiffList(base, next, 1000)
		if !ok {
			t.Fatalf("round %d: no diff within 1000 ops", round)
		}
		changed := &List{Name: "l", V4: base.V4, V6: base.V6, Ops: ops}
		var probes []netip.Addr
		for _, l := range []*List{base, next} {
			for _, r := range l.V4 {
				probes = append(probes, UintToV4(r.Lo), UintToV4(r.Hi), UintToV4(r.Lo-1), UintToV4(r.Hi+1))
			}
			for _, r := range l.V6 {
				probes = append(probes, r.Lo.Addr(), r.Hi.Addr(), r.Lo.Sub1().Addr(), r.Hi.Add1().Addr())
			}
		}
		for _, op := range ops {
			if op.List != "l" || op.Seq != 0 {
				t.Fatalf("round %d: op %+v", round, op)
			}
			r := PrefixRange6(op.Prefix)
			if op.Prefix.Addr().Is4() {
				r4 := PrefixRange4(op.Prefix)
				probes = append(probes, UintToV4(r4.Lo), UintToV4(r4.Hi))
				continue
			}
			probes = append(probes, r.Lo.Addr(), r.Hi.Addr())
		}
		for _, a := range probes {
			if got, want := changed.Contains(a), next.Contains(a); got != want {
				t.Fatalf("round %d: %s: base with %d ops holds it %v, the next list %v", round, a, len(ops), got, want)
			}
		}
		if len(onlyBase)+len(onlyNext) == 0 && len(ops) != 0 {
			t.Fatalf("round %d: equal lists took %d ops", round, len(ops))
		}
	}
}

// TestDiffListBound: past most ops, no ops.
func TestDiffListBound(t *testing.T) {
	var ps []netip.Prefix
	for i := range 10 {
		ps = append(ps, netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(2 * i)}), 32))
	}
	next := NewList("l", ps)
	if ops, ok := DiffList(NewList("l", nil), next, 10); !ok || len(ops) != 10 {
		t.Fatalf("10 additions within 10: %d ops, %v", len(ops), ok)
	}
	if ops, ok := DiffList(NewList("l", nil), next, 9); ok || ops != nil {
		t.Fatalf("10 additions within 9: %d ops, %v", len(ops), ok)
	}
}

package policy

import "net/netip"

// DiffList is what turns list base into next as list ops, oldest first
// (no sequence numbers): removals of what base holds and next does not,
// then additions of what next holds and base does not, each range as the
// fewest prefixes. Their prefixes are disjoint, so their order does not
// matter to List.Contains. ok is false, and ops nil, when more than most
// ops would do it.
func DiffList(base, next *List, most int) (ops []ListOp, ok bool) {
	emit := func(add bool, width int) func(lo, hi U128) bool {
		return func(lo, hi U128) bool {
			Cover(lo, hi, width, func(first U128, length int) {
				a := first.Addr()
				if width == 32 {
					a = UintToV4(uint32(first.Lo))
				}
				ops = append(ops, ListOp{List: next.Name, Prefix: netip.PrefixFrom(a, length), Add: add})
			})
			return len(ops) <= most
		}
	}
	lo4 := func(r Range4) U128 { return U128{Lo: uint64(r.Lo)} }
	hi4 := func(r Range4) U128 { return U128{Lo: uint64(r.Hi)} }
	lo6 := func(r Range6) U128 { return r.Lo }
	hi6 := func(r Range6) U128 { return r.Hi }
	a4, b4 := trimCommon(base.V4, next.V4)
	a6, b6 := trimCommon(base.V6, next.V6)
	ok = subtract(a4, b4, lo4, hi4, emit(false, 32)) && subtract(a6, b6, lo6, hi6, emit(false, 128)) &&
		subtract(b4, a4, lo4, hi4, emit(true, 32)) && subtract(b6, a6, lo6, hi6, emit(true, 128))
	if !ok {
		return nil, false
	}
	return ops, true
}

// trimCommon cuts the ranges a and b share at their starts and ends: a
// change to a list of millions is mostly a few lines.
func trimCommon[R comparable](a, b []R) ([]R, []R) {
	for len(a) > 0 && len(b) > 0 && a[0] == b[0] {
		a, b = a[1:], b[1:]
	}
	for len(a) > 0 && len(b) > 0 && a[len(a)-1] == b[len(b)-1] {
		a, b = a[:len(a)-1], b[:len(b)-1]
	}
	return a, b
}

// subtract calls emit for each range of addresses a holds and b does not
// (both sorted and disjoint), in order, until emit returns false, which it
// then returns.
func subtract[R any](a, b []R, lo, hi func(R) U128, emit func(lo, hi U128) bool) bool {
	j := 0
	for _, r := range a {
		l, h := lo(r), hi(r)
		for j < len(b) && hi(b[j]).Cmp(l) < 0 {
			j++
		}
		covered := false
		for k := j; k < len(b) && lo(b[k]).Cmp(h) <= 0; k++ {
			if lo(b[k]).Cmp(l) > 0 && !emit(l, lo(b[k]).Sub1()) {
				return false
			}
			if hi(b[k]).Cmp(h) >= 0 {
				covered = true
				break
			}
			l = hi(b[k]).Add1()
		}
		if !covered && !emit(l, h) {
			return false
		}
	}
	return true
}

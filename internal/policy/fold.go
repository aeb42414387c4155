package policy

import (
	"net/netip"
	"slices"
)

// Fold is the list with ops applied to its contents, as Contains applies
// them (the latest op covering an address decides), and no ops of its
// own: the ranges a table holds when a list's live changes are compiled
// in, instead of looked up beside the tables in the overlay. It costs a
// sort of the ops and one pass over the ranges, however the ops nest.
func (l *List) Fold(ops []ListOp) *List {
	out := *l
	out.Ops = nil
	var ops4, ops6 []netip.Prefix
	var add4, add6 []bool
	for _, op := range ops {
		if op.Prefix.Addr().Is4() {
			ops4, add4 = append(ops4, op.Prefix.Masked()), append(add4, op.Add)
		} else {
			ops6, add6 = append(ops6, op.Prefix.Masked()), append(add6, op.Add)
		}
	}
	if len(ops4) > 0 {
		base := make([]Range6, len(l.V4))
		for i, r := range l.V4 {
			base[i] = Range6{U128{0, uint64(r.Lo)}, U128{0, uint64(r.Hi)}}
		}
		folded := foldRanges(base, ops4, add4)
		out.V4 = make([]Range4, len(folded))
		for i, r := range folded {
			out.V4[i] = Range4{uint32(r.Lo.Lo), uint32(r.Hi.Lo)}
		}
	}
	if len(ops6) > 0 {
		out.V6 = foldRanges(slices.Clone(l.V6), ops6, add6)
	}
	return &out
}

// decided is a stretch of addresses whose latest covering op is add.
type decided struct {
	Range6
	add bool
}

// foldRanges applies ops (prefixes of one family, oldest first, each an
// add or not) to base, sorted disjoint ranges in the space of U128 (IPv4
// in its low 32 bits).
func foldRanges(base []Range6, ops []netip.Prefix, add []bool) []Range6 {
	// Only the ops no later op covers whole decide anything: of any two
	// that overlap then, the inner one is the later, and the deepest op
	// over an address is its latest.
	var lengths [129]bool
	later := map[netip.Prefix]bool{}
	type op struct {
		r   Range6
		add bool
	}
	var kept []op
	for i := len(ops) - 1; i >= 0; i-- {
		p := ops[i]
		covered := false
		for b := p.Bits(); b >= 0 && !covered; b-- {
			covered = lengths[b] && later[netip.PrefixFrom(p.Addr(), b).Masked()]
		}
		if covered {
			continue
		}
		lengths[p.Bits()], later[p] = true, true
		r := PrefixRange6(p)
		if p.Addr().Is4() {
			r = Range6{U128{0, uint64(PrefixRange4(p).Lo)}, U128{0, uint64(PrefixRange4(p).Hi)}}
		}
		kept = append(kept, op{r, add[i]})
	}
	// Outer before inner: by start, then the larger first.
	slices.SortFunc(kept, func(a, b op) int {
		if c := a.r.Lo.Cmp(b.r.Lo); c != 0 {
			return c
		}
		return b.r.Hi.Cmp(a.r.Hi)
	})
	// The stretches each op decides: its range less the ops inside it.
	var segs []decided
	var stack []op
	cursor, ended := U128{}, false
	emit := func(hi U128, o op) {
		if ended || hi.Cmp(cursor) < 0 {
			return
		}
		segs = append(segs, decided{Range6{cursor, hi}, o.add})
		if hi == Max128 {
			ended = true
		} else {
			cursor = hi.Add1()
		}
	}
	for _, o := range kept {
		for len(stack) > 0 && stack[len(stack)-1].r.Hi.Cmp(o.r.Lo) < 0 {
			emit(stack[len(stack)-1].r.Hi, stack[len(stack)-1])
			stack = stack[:len(stack)-1]
		}
		if len(stack) > 0 && o.r.Lo.Cmp(cursor) > 0 {
			emit(o.r.Lo.Sub1(), stack[len(stack)-1])
		}
		if o.r.Lo.Cmp(cursor) > 0 || len(stack) == 0 {
			cursor = o.r.Lo
		}
		stack = append(stack, o)
	}
	for len(stack) > 0 {
		emit(stack[len(stack)-1].r.Hi, stack[len(stack)-1])
		stack = stack[:len(stack)-1]
	}
	// The base less every decided stretch, with those that add.
	var out []Range6
	j := 0
	for _, r := range base {
		for j < len(segs) && segs[j].Hi.Cmp(r.Lo) < 0 {
			j++
		}
		cur, done := r.Lo, false
		for k := j; k < len(segs) && segs[k].Lo.Cmp(r.Hi) <= 0 && !done; k++ {
			if segs[k].Lo.Cmp(cur) > 0 {
				out = append(out, Range6{cur, segs[k].Lo.Sub1()})
			}
			if segs[k].Hi.Cmp(r.Hi) >= 0 {
				done = true
			} else {
				cur = segs[k].Hi.Add1()
			}
		}
		if !done {
			out = append(out, Range6{cur, r.Hi})
		}
	}
	for _, s := range segs {
		if s.add {
			out = append(out, s.Range6)
		}
	}
	return MergeRanges6(out)
}

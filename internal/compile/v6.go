package compile

import (
	"net/netip"
	"slices"
	"sort"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/policy"
)

type entry struct {
	p    netip.Prefix
	mask uint64
}

// buildV6 gives each IPv6 prefix the union of its own lists and those of
// every prefix containing it, so the longest match answers for all lists;
// a prefix adding nothing to its nearest ancestor is left out (aggregation).
func buildV6(t *Tables, lists []*policy.List, bits []uint64) {
	var all []entry
	for i, l := range lists {
		for _, p := range l.V6 {
			all = append(all, entry{p, bits[i]})
		}
	}
	lens := map[int]bool{}
	for _, e := range closeOverAncestors(all) {
		lens[e.p.Bits()] = true
		t.V6 = append(t.V6, Entry[abi.LPMKeyV6]{Key: key6(e.p), Mask: e.mask})
	}
	for l := range lens {
		t.V6Lens = append(t.V6Lens, uint8(l))
	}
	sort.Slice(t.V6Lens, func(i, j int) bool { return t.V6Lens[i] > t.V6Lens[j] })
}

func key6(p netip.Prefix) abi.LPMKeyV6 {
	return abi.LPMKeyV6{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As16()}
}

func key4(p netip.Prefix) abi.LPMKeyV4 {
	return abi.LPMKeyV4{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As4()}
}

// closeOverAncestors walks prefixes in address order, ancestors first, with
// a stack of the prefixes containing the current one.
func closeOverAncestors(all []entry) []entry {
	slices.SortFunc(all, func(a, b entry) int { return policy.ComparePrefix(a.p, b.p) })
	var out, stack []entry
	for i := 0; i < len(all); {
		e := all[i]
		for i++; i < len(all) && all[i].p == e.p; i++ {
			e.mask |= all[i].mask
		}
		for len(stack) > 0 && !stack[len(stack)-1].p.Contains(e.p.Addr()) {
			stack = stack[:len(stack)-1]
		}
		if len(stack) > 0 {
			parent := stack[len(stack)-1].mask
			if e.mask|parent == parent {
				continue
			}
			e.mask |= parent
		}
		stack = append(stack, e)
		out = append(out, e)
	}
	return out
}

// Overlay turns in-place ops into overlay entries: for every op prefix, per
// list, the latest op whose prefix contains it sets or clears the list's
// bit. Ops on lists without a bit (not in this policy) are ignored.
func Overlay(bits map[string]uint64, ops []policy.ListOp) (v4 []OverlayEntry[abi.LPMKeyV4], v6 []OverlayEntry[abi.LPMKeyV6]) {
	type node struct {
		p      netip.Prefix
		latest map[string]int // list -> index of its latest op covering p
	}
	idx := make([]int, 0, len(ops))
	for i, op := range ops {
		if _, ok := bits[op.List]; ok {
			idx = append(idx, i)
		}
	}
	slices.SortStableFunc(idx, func(a, b int) int { return policy.ComparePrefix(ops[a].Prefix, ops[b].Prefix) })
	var stack []node
	for k := 0; k < len(idx); {
		p := ops[idx[k]].Prefix
		for len(stack) > 0 && !stack[len(stack)-1].p.Contains(p.Addr()) {
			stack = stack[:len(stack)-1]
		}
		n := node{p: p, latest: map[string]int{}}
		if len(stack) > 0 {
			for l, i := range stack[len(stack)-1].latest {
				n.latest[l] = i
			}
		}
		for ; k < len(idx) && ops[idx[k]].Prefix == p; k++ {
			i := idx[k]
			if j, ok := n.latest[ops[i].List]; !ok || i > j {
				n.latest[ops[i].List] = i
			}
		}
		stack = append(stack, n)
		var o abi.Overlay
		for l, i := range n.latest {
			if ops[i].Add {
				o.Set |= bits[l]
			} else {
				o.Clear |= bits[l]
			}
		}
		if p.Addr().Is4() {
			v4 = append(v4, OverlayEntry[abi.LPMKeyV4]{Key: key4(p), Overlay: o})
		} else {
			v6 = append(v6, OverlayEntry[abi.LPMKeyV6]{Key: key6(p), Overlay: o})
		}
	}
	return v4, v6
}

// Package compile turns a validated Policy into the exact contents of the
// data plane's maps: the rule array and the prefix-list tables.
package compile

import (
	"net/netip"
	"sort"

	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/policy"
)

// Build compiles pol. Only lists that rules refer to are loaded; each gets one
// bit of the membership mask.
func Build(pol *policy.Policy) *datapath.Image {
	bits := map[string]uint64{}
	bit := func(name string) uint64 {
		if b, ok := bits[name]; ok {
			return b
		}
		b := uint64(1) << len(bits)
		bits[name] = b
		return b
	}

	img := &datapath.Image{DefaultAction: action(pol.Default)}
	for _, r := range pol.Rules {
		cr := datapath.Rule{Action: action(r.Action)}
		for _, n := range r.Src {
			cr.SrcLists |= bit(n)
			cr.Match |= datapath.MatchSrc
			img.NeedSrc = true
		}
		for _, n := range r.Dst {
			cr.DstLists |= bit(n)
			cr.Match |= datapath.MatchDst
			img.NeedDst = true
		}
		switch r.Family {
		case 4:
			cr.Match |= datapath.MatchIPv4
		case 6:
			cr.Match |= datapath.MatchIPv6
		}
		if r.Proto >= 0 {
			cr.Match |= datapath.MatchProto
			cr.Proto = uint8(r.Proto)
		}
		if r.Sport != nil {
			cr.Match |= datapath.MatchSport
			cr.SportLo, cr.SportHi = r.Sport.Lo, r.Sport.Hi
		}
		if r.Dport != nil {
			cr.Match |= datapath.MatchDport
			cr.DportLo, cr.DportHi = r.Dport.Lo, r.Dport.Hi
		}
		if r.Length != nil {
			cr.Match |= datapath.MatchLength
			cr.LenLo, cr.LenHi = r.Length.Lo, r.Length.Hi
		}
		if r.HasFlags {
			cr.Match |= datapath.MatchTCPFlags
			cr.FlagsSet, cr.FlagsClear = r.FlagsOn, r.FlagsOff
		}
		img.Rules = append(img.Rules, cr)
	}

	masks := map[netip.Prefix]uint64{}
	for name, b := range bits {
		for _, p := range pol.Lists[name].Prefixes {
			masks[p.Masked()] |= b
		}
	}
	for _, e := range closeOverAncestors(masks) {
		if e.p.Addr().Is4() {
			img.V4 = append(img.V4, datapath.Entry[datapath.LPMKeyV4]{Key: datapath.LPMKeyV4{Prefixlen: uint32(e.p.Bits()), Addr: e.p.Addr().As4()}, Mask: e.mask})
		} else {
			img.V6 = append(img.V6, datapath.Entry[datapath.LPMKeyV6]{Key: datapath.LPMKeyV6{Prefixlen: uint32(e.p.Bits()), Addr: e.p.Addr().As16()}, Mask: e.mask})
		}
	}
	return img
}

func action(a policy.Action) uint8 {
	if a == policy.Drop {
		return datapath.ActionDrop
	}
	return datapath.ActionPass
}

type entry struct {
	p    netip.Prefix
	mask uint64
}

// closeOverAncestors gives each prefix the union of the masks of every prefix
// that contains it, so a single longest-prefix match yields the membership in
// all lists. A prefix whose closed mask equals its nearest ancestor's adds
// nothing to a longest-prefix lookup and is dropped (aggregation).
func closeOverAncestors(masks map[netip.Prefix]uint64) []entry {
	lengths := map[bool]map[int]bool{true: {}, false: {}}
	for p := range masks {
		lengths[p.Addr().Is4()][p.Bits()] = true
	}
	sorted := map[bool][]int{}
	for fam, ls := range lengths {
		for l := range ls {
			sorted[fam] = append(sorted[fam], l)
		}
		sort.Ints(sorted[fam])
	}

	out := make([]entry, 0, len(masks))
	for p, own := range masks {
		closed, parent, hasParent := own, uint64(0), false
		ls := sorted[p.Addr().Is4()]
		// Walk ancestors from the nearest outwards.
		for i := len(ls) - 1; i >= 0; i-- {
			l := ls[i]
			if l >= p.Bits() {
				continue
			}
			anc, _ := p.Addr().Prefix(l)
			if m, ok := masks[anc]; ok {
				hasParent = true
				parent |= m
				closed |= m
			}
		}
		if hasParent && closed == parent {
			continue
		}
		out = append(out, entry{p, closed})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].p.Bits() != out[j].p.Bits() {
			return out[i].p.Bits() < out[j].p.Bits()
		}
		return out[i].p.Addr().Less(out[j].p.Addr())
	})
	return out
}

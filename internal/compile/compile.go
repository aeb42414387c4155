// Package compile turns a validated Policy into the exact contents of the
// data plane's maps: the rule array and the prefix-list tables.
package compile

import (
	"encoding/binary"
	"net/netip"
	"slices"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/policy"
)

// Build compiles pol, which holds to the policy's limits (policy.Load and
// flowspec.Place see to it). Only lists that rules refer to are loaded:
// each an entry tests by membership gets a bit of the membership mask
// (policy.ListUse: lists that the same rules name may share one), and each
// inline prefix an entry checks by its bits (policy.SplitSide) an id.
func Build(pol *policy.Policy) *Image { return build(pol, false) }

// BuildReleasingRanges is Build for a caller that reads pol's lists' ranges
// no more (a one-shot apply or check): each list's ranges of a family are
// dropped (set to nil) once that family's tables no longer read them, so
// that the collector reuses their memory while the tables are laid out.
// Ten million IPv6 /128s are 305 MiB of ranges.
func BuildReleasingRanges(pol *policy.Policy) *Image { return build(pol, true) }

func build(pol *policy.Policy, release bool) *Image {
	use := pol.ListUse()
	b := builder{pol: pol, bits: use.Bits(), static: use.Static(), ids: map[netip.Prefix]uint32{}, parts: newStaticSets()}
	img := &Image{DefaultAction: action(pol.Default), UnparsedAction: action(pol.Unparsed), MalformedAction: action(pol.MalformedAction()),
		Limits: make([]abi.Limit, len(pol.Rules)), Rules: make([]abi.Rule, 0, len(pol.Rules))}
	b.img = img
	if pol.FlowSpec != nil {
		for _, n := range pol.FlowSpec.Neighbors {
			img.Room += n.MaxRoutes
		}
	}
	for i, rule := range pol.Rules {
		if rule.Limit != nil {
			img.Limits[i] = limit(rule.Limit)
			img.PerSource = img.PerSource || rule.Limit.PerSource
		}
		img.Syncookie = img.Syncookie || rule.Action == policy.Syncookie
		img.NeedL4 = img.NeedL4 || rule.NeedsL4()
		// Each alternative's entries count, and are limited, as the rule.
		for _, r := range rule.Alternatives() {
			b.entries(&r, rule.Action, i)
		}
	}

	img.Lists = b.bits
	var lists []*policy.List
	var listBits []uint64
	var static []uint32
	for name, bit := range b.bits {
		lists = append(lists, pol.Lists[name])
		listBits = append(listBits, bit)
		static = append(static, b.static[name])
	}
	img.Tables = buildTables(lists, listBits, static, b.prefixes, release)
	rows := b.rows(&img.Tables)
	img.Classifier = Classify(img.Rules, img.Classes, &Prefixes{Parent: img.prefixParent, OfClass: img.classPrefix, Src: b.src, Dst: b.dst}, rows)
	return img
}

// Rows are the rows of the address classes' static lists: Set gives each
// class its set of static ways (0 for none, else a row; the kernel has it
// in the class's abi.ClassEqs), and bit j of set s's row (words
// (s-1)*Words on of Bits) says whether the set meets the static part of
// entries' sides numbered j (abi.Rule's SrcRow), from 1. A row is a
// set's, not a class's: classes are many (a feed's victims make one
// each), sets of static lists few.
type Rows struct {
	Words int
	Set   []uint32 // by class
	Bits  []uint32
}

// of is class cls's row, nil for none.
func (r *Rows) of(cls int) []uint32 {
	if s := r.Set[cls]; s != 0 {
		return r.Bits[int(s-1)*r.Words : int(s)*r.Words]
	}
	return nil
}

// rows are t's classes' rows of the sides' static parts; nil without.
func (b *builder) rows(t *Tables) *Rows {
	parts := b.parts.sets // by row bit: the ways; 0 is none
	if len(parts) == 1 {
		return nil
	}
	partsOf := map[uint32][]uint16{} // by way, the parts naming it
	for j, ways := range parts {
		for _, w := range ways {
			partsOf[w] = append(partsOf[w], uint16(j))
		}
	}
	r := &Rows{Words: (len(parts) + 31) / 32, Set: make([]uint32, len(t.Classes))}
	row := map[uint32]uint32{0: 0} // by set of static ways, its row
	for c, set := range t.classStatic {
		s, ok := row[set]
		if !ok {
			s = uint32(len(row))
			row[set] = s
			bits := make([]uint32, r.Words)
			for _, w := range t.sets.sets[set] {
				for _, j := range partsOf[w] {
					bits[j/32] |= 1 << (j % 32)
				}
			}
			r.Bits = append(r.Bits, bits...)
		}
		r.Set[c] = s
	}
	return r
}

// builder is Build's state: the lists' bits, the inline prefixes' ids.
type builder struct {
	pol      *policy.Policy
	img      *Image
	bits     map[string]uint64
	static   map[string]uint32       // the lists of static ways: their way
	parts    *staticSets             // the sides' sets of static ways: a set's id is its row bit
	ids      map[netip.Prefix]uint32 // from 1
	prefixes []netip.Prefix          // by id - 1
	src, dst []uint32                // by entry: its inline prefix's id, 0 for none
}

func (b *builder) prefixID(p netip.Prefix) uint32 {
	id, ok := b.ids[p]
	if !ok {
		b.prefixes = append(b.prefixes, p)
		id = uint32(len(b.prefixes))
		b.ids[p] = id
	}
	return id
}

// entries appends the data plane's entries of one of rule i's
// alternatives.
func (b *builder) entries(r *policy.Rule, act policy.Action, i int) {
	img := b.img
	cr := abi.Rule{Action: action(act), Rule: uint32(i)}
	switch r.Family {
	case 4:
		cr.Match |= abi.MatchIPv4
	case 6:
		cr.Match |= abi.MatchIPv6
	}
	if r.Proto != nil {
		cr.Match |= abi.MatchProto
		cr.ProtoLo, cr.ProtoHi = uint8(r.Proto.Lo), uint8(r.Proto.Hi)
	}
	if r.Length != nil {
		cr.Match |= abi.MatchLength
		cr.LenLo, cr.LenHi = uint16(r.Length.Lo), uint16(r.Length.Hi)
	}
	if r.HasFlags {
		cr.Match |= abi.MatchTCPFlags
		cr.FlagsSet, cr.FlagsClear = r.FlagsOn, r.FlagsOff
		if r.ResOn|r.ResOff != 0 {
			cr.Match |= abi.MatchTCPRes
			cr.ResSet, cr.ResClear = r.ResOn, r.ResOff
		}
	}
	if r.ICMPType != nil {
		cr.Match |= abi.MatchIcmpType
		cr.IcmpTypeLo, cr.IcmpTypeHi = uint8(r.ICMPType.Lo), uint8(r.ICMPType.Hi)
	}
	if r.ICMPCode != nil {
		cr.Match |= abi.MatchIcmpCode
		cr.IcmpCodeLo, cr.IcmpCodeHi = uint8(r.ICMPCode.Lo), uint8(r.ICMPCode.Hi)
	}
	if r.DSCP != nil {
		cr.Match |= abi.MatchDscp
		cr.DscpLo, cr.DscpHi = uint8(r.DSCP.Lo), uint8(r.DSCP.Hi)
	}
	if r.FlowLabel != nil {
		cr.Match |= abi.MatchFlowLabel
		cr.FlowLo, cr.FlowHi = r.FlowLabel.Lo, r.FlowLabel.Hi
	}
	if r.HasFrag {
		cr.Match |= abi.MatchFragment
		cr.FragSet, cr.FragClear = r.FragOn, r.FragOff
	}
	// One entry per way of checking each side and pair of port ranges,
	// all counted as the rule.
	srcs := b.sides(r.Src, r.SrcBits, &img.NeedSrc)
	dsts := b.sides(r.Dst, r.DstBits, &img.NeedDst)
	for _, src := range srcs {
		for _, dst := range dsts {
			for _, sp := range orAny(r.Sport) {
				for _, dp := range orAny(r.Dport) {
					e := cr
					src.put(&e, abi.MatchSrc, abi.MatchSrcBits, &e.SrcLists, &e.SrcRow, &e.SrcMask, &e.SrcBits)
					dst.put(&e, abi.MatchDst, abi.MatchDstBits, &e.DstLists, &e.DstRow, &e.DstMask, &e.DstBits)
					if sp != nil {
						e.Match |= abi.MatchSport
						e.SportLo, e.SportHi = uint16(sp.Lo), uint16(sp.Hi)
					}
					if dp != nil {
						e.Match |= abi.MatchDport
						e.DportLo, e.DportHi = uint16(dp.Lo), uint16(dp.Hi)
					}
					img.Rules = append(img.Rules, e)
					b.src, b.dst = append(b.src, src.prefix), append(b.dst, dst.prefix)
				}
			}
		}
	}
}

// side is one way an entry checks a side of its rule: membership in some
// lists, address bits, or both (a FlowSpec prefix with an offset among
// lists); none for a side the rule leaves open.
type side struct {
	lists  uint64
	row    uint16 // its static lists' row bit (Rows), 0 for none
	bits   *policy.AddrBits
	prefix uint32 // the inline prefix's id, 0 for none
}

// sides are the ways of checking one side of a rule (policy.SplitSide):
// the named lists together, each inline prefix apart. An inline prefix is
// checked by its bits; the address lookup still gives the trees its eq.
func (b *builder) sides(refs []string, bits *policy.AddrBits, need *bool) []side {
	masked, inline := policy.SplitSide(refs, bits, b.pol.Lists)
	var out []side
	if len(masked) > 0 || bits != nil {
		s := side{bits: bits}
		var ways []uint32
		for _, n := range masked {
			s.lists |= b.bits[n]
			if w := b.static[n]; w != 0 {
				ways = append(ways, w)
			}
		}
		s.row = b.part(ways)
		out = append(out, s)
	}
	for _, p := range inline {
		out = append(out, side{bits: &policy.AddrBits{Prefix: p}, prefix: b.prefixID(p)})
	}
	if len(refs) > 0 {
		*need = true
	}
	if len(out) == 0 {
		out = append(out, side{})
	}
	return out
}

// part is the row bit of a side's static ways, 0 for none: the id of
// their set (policy.ListUse.Fits bounds the sides naming lists by
// abi.MaxRowBits, and so the sets).
func (b *builder) part(ways []uint32) uint16 {
	slices.Sort(ways)
	return uint16(b.parts.id(slices.Compact(ways)))
}

// put writes the side into entry e's fields of that side.
func (s side) put(e *abi.Rule, match, bitsFlag uint32, lists *uint64, row *uint16, mask, want *[2]uint64) {
	if s.lists != 0 || s.row != 0 {
		*lists, *row = s.lists, s.row
		e.Match |= match
	}
	if s.bits != nil {
		e.Match |= bitsFlag | familyMatch(s.bits.Prefix.Addr())
		*mask, *want = addrWords(s.bits)
	}
}

// familyMatch is the match bit of addr's family: address bits are one
// family's.
func familyMatch(addr netip.Addr) uint32 {
	if addr.Is4() {
		return abi.MatchIPv4
	}
	return abi.MatchIPv6
}

// addrWords are the mask and the bits under it as the data plane compares
// an address: two words of its 16 bytes in memory order, an IPv4 address
// in the first 4.
func addrWords(bits *policy.AddrBits) (mask, want [2]uint64) {
	m := bits.Mask()
	var a [16]byte
	if addr := bits.Prefix.Addr(); addr.Is4() {
		a4 := addr.As4()
		copy(a[:], a4[:])
	} else {
		a = addr.As16()
	}
	for i := range 2 {
		mask[i] = binary.NativeEndian.Uint64(m[8*i:])
		want[i] = binary.NativeEndian.Uint64(a[8*i:]) & mask[i]
	}
	return mask, want
}

// BuildTables builds the prefix-list tables for lists, lists[i] answering
// to bit bits[i] (lists sharing a bit answer as their union), or when
// static is not nil and static[i] is not 0, to that static way (they take
// no bit; a class in one has ClassUnmasked set), with the lists' in-place
// ops as the overlay; and for the inline prefixes (id i+1 for
// prefixes[i]), which take no bit: a class inside one has ClassUnmasked
// set.
func BuildTables(lists []*policy.List, bits []uint64, static []uint32, prefixes []netip.Prefix) Tables {
	return buildTables(lists, bits, static, prefixes, false)
}

// buildTables is BuildTables, which with release drops the lists' ranges
// as it is done with them (BuildReleasingRanges).
func buildTables(lists []*policy.List, bits []uint64, static []uint32, prefixes []netip.Prefix, release bool) Tables {
	t := Tables{releaseRanges: release}
	var ops []policy.ListOp
	byName := map[string]uint64{}
	for i, l := range lists {
		ops = append(ops, l.Ops...)
		byName[l.Name] = bits[i]
	}
	if static == nil {
		static = make([]uint32, len(lists))
	}
	lists, bits, static = unite(lists, bits, static, release)
	c := newClasses(&t)
	t.sets = c.sets
	t.prefixParent = make([]uint32, len(prefixes)+1)
	buildV4(&t, c, lists, bits, static, prefixes)
	buildV6(&t, c, lists, bits, static, prefixes)
	t.OverlayV4, t.OverlayV6 = Overlay(byName, ops)
	return t
}

// unite makes the lists that share a bit or a static way (policy.ListUse)
// one list each, their union, so that the sweeps walk a list per bit or
// way, however many lists a policy names.
func unite(lists []*policy.List, bits []uint64, static []uint32, release bool) ([]*policy.List, []uint64, []uint32) {
	type way struct {
		bit    uint64
		static uint32
	}
	of := map[way][]*policy.List{}
	var order []way
	for i, l := range lists {
		w := way{bits[i], static[i]}
		if of[w] == nil {
			order = append(order, w)
		}
		of[w] = append(of[w], l)
	}
	if len(order) == len(lists) {
		return lists, bits, static
	}
	out := make([]*policy.List, len(order))
	bits, static = make([]uint64, len(order)), make([]uint32, len(order))
	for i, w := range order {
		bits[i], static[i] = w.bit, w.static
		ls := of[w]
		if len(ls) == 1 {
			out[i] = ls[0]
			continue
		}
		u := &policy.List{Name: ls[0].Name}
		for _, l := range ls {
			u.V4, u.V6 = append(u.V4, l.V4...), append(u.V6, l.V6...)
			if release { // the union holds them now
				l.V4, l.V6 = nil, nil
			}
		}
		u.V4, u.V6 = policy.MergeRanges4(u.V4), policy.MergeRanges6(u.V6)
		out[i] = u
	}
	return out, bits, static
}

func action(a policy.Action) uint8 {
	switch a {
	case policy.Drop:
		return abi.ActionDrop
	case policy.Limit:
		return abi.ActionLimit
	case policy.Syncookie:
		return abi.ActionSyncookie
	}
	return abi.ActionPass
}

// orAny is the ranges as pointers, or one nil (any) when there are none.
func orAny(rs []policy.Range) []*policy.Range {
	if len(rs) == 0 {
		return []*policy.Range{nil}
	}
	out := make([]*policy.Range, len(rs))
	for i := range rs {
		out[i] = &rs[i]
	}
	return out
}

// clockTick is the longest step of the coarse clock limits read
// (bpf/limit.h): a jiffy at HZ=100, the coarsest Linux builds with.
const clockTick = 10_000_000 // ns

// limit turns a rate into the data plane's cell rate: the cost of one
// packet (or byte, scaled) in ns, and how far ahead of now the schedule may
// run for the burst to pass at once: at least a clock tick, or packets
// arriving within one tick, which all read the same now, would be held to
// the burst for the whole tick.
func limit(l *policy.RateLimit) abi.Limit {
	out := abi.Limit{Prefix4: uint8(l.Prefix4), Prefix6: uint8(l.Prefix6)}
	if l.PerSource {
		out.Flags |= abi.LimitPerSource
	}
	if l.Bits {
		out.Flags |= abi.LimitBytes
		perByte := 8e9 / l.Rate // ns
		out.Interval = uint64(perByte*(1<<abi.LimitByteShift) + 0.5)
		out.Tolerance = max(uint64(perByte*float64(l.Burst)), clockTick)
		return out
	}
	out.Interval = uint64(1e9/l.Rate + 0.5)
	out.Tolerance = max((l.Burst-1)*out.Interval, clockTick)
	return out
}

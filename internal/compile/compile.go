// Package compile turns a validated Policy into the exact contents of the
// data plane's maps: the rule array and the prefix-list tables.
package compile

import (
	"encoding/binary"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/policy"
)

// Build compiles pol. Only lists that rules refer to are loaded; each gets one
// bit of the membership mask.
func Build(pol *policy.Policy) *Image {
	bits := map[string]uint64{}
	bit := func(name string) uint64 {
		if b, ok := bits[name]; ok {
			return b
		}
		b := uint64(1) << len(bits)
		bits[name] = b
		return b
	}

	img := &Image{DefaultAction: action(pol.Default), UnparsedAction: action(pol.Unparsed), MalformedAction: action(pol.MalformedAction()),
		Limits: make([]abi.Limit, len(pol.Rules))}
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
			img.Rules = append(img.Rules, entries(&r, rule.Action, i, bit, img)...)
		}
	}

	img.Lists = bits
	var lists []*policy.List
	var listBits []uint64
	for name, b := range bits {
		lists = append(lists, pol.Lists[name])
		listBits = append(listBits, b)
	}
	img.Tables = BuildTables(lists, listBits)
	img.Classifier = Classify(img.Rules, img.Classes)
	return img
}

// entries are the data plane's entries of one of rule i's alternatives.
func entries(r *policy.Rule, act policy.Action, i int, bit func(string) uint64, img *Image) []abi.Rule {
	cr := abi.Rule{Action: action(act), Rule: uint32(i)}
	for _, n := range r.Src {
		cr.SrcLists |= bit(n)
		cr.Match |= abi.MatchSrc
		img.NeedSrc = true
	}
	for _, n := range r.Dst {
		cr.DstLists |= bit(n)
		cr.Match |= abi.MatchDst
		img.NeedDst = true
	}
	switch r.Family {
	case 4:
		cr.Match |= abi.MatchIPv4
	case 6:
		cr.Match |= abi.MatchIPv6
	}
	if r.Proto >= 0 {
		cr.Match |= abi.MatchProto
		cr.Proto = uint8(r.Proto)
	}
	if r.Length != nil {
		cr.Match |= abi.MatchLength
		cr.LenLo, cr.LenHi = uint16(r.Length.Lo), uint16(r.Length.Hi)
	}
	if r.HasFlags {
		cr.Match |= abi.MatchTCPFlags
		cr.FlagsSet, cr.FlagsClear = r.FlagsOn, r.FlagsOff
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
	for _, side := range []struct {
		bits       *policy.AddrBits
		flag       uint32
		mask, want *[2]uint64
	}{{r.SrcBits, abi.MatchSrcBits, &cr.SrcMask, &cr.SrcBits}, {r.DstBits, abi.MatchDstBits, &cr.DstMask, &cr.DstBits}} {
		if side.bits == nil {
			continue
		}
		// As the data plane loads the address: two words in memory order.
		cr.Match |= side.flag
		m, a := side.bits.Mask(), side.bits.Prefix.Addr().As16()
		for i := range 2 {
			side.mask[i] = binary.NativeEndian.Uint64(m[8*i:])
			side.want[i] = binary.NativeEndian.Uint64(a[8*i:]) & side.mask[i]
		}
	}
	if r.HasFrag {
		cr.Match |= abi.MatchFragment
		cr.FragSet, cr.FragClear = r.FragOn, r.FragOff
	}
	// One entry per pair of port ranges, all counted as the rule.
	var out []abi.Rule
	for _, sp := range orAny(r.Sport) {
		for _, dp := range orAny(r.Dport) {
			e := cr
			if sp != nil {
				e.Match |= abi.MatchSport
				e.SportLo, e.SportHi = uint16(sp.Lo), uint16(sp.Hi)
			}
			if dp != nil {
				e.Match |= abi.MatchDport
				e.DportLo, e.DportHi = uint16(dp.Lo), uint16(dp.Hi)
			}
			out = append(out, e)
		}
	}
	return out
}

// BuildTables builds the prefix-list tables for lists, lists[i] answering
// to bit bits[i], with the lists' in-place ops as the overlay.
func BuildTables(lists []*policy.List, bits []uint64) Tables {
	var t Tables
	c := newClasses(&t)
	buildV4(&t, c, lists, bits)
	buildV6(&t, c, lists, bits)
	var ops []policy.ListOp
	byName := map[string]uint64{}
	for i, l := range lists {
		ops = append(ops, l.Ops...)
		byName[l.Name] = bits[i]
	}
	t.OverlayV4, t.OverlayV6 = Overlay(byName, ops)
	return t
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

// Package compile turns a validated Policy into the exact contents of the
// data plane's maps: the rule array and the prefix-list tables.
package compile

import (
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

	img := &Image{DefaultAction: action(pol.Default), UnparsedAction: action(pol.Unparsed), MalformedAction: action(pol.MalformedAction())}
	for _, r := range pol.Rules {
		cr := abi.Rule{Action: action(r.Action)}
		img.NeedL4 = img.NeedL4 || r.NeedsL4()
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
		if r.Sport != nil {
			cr.Match |= abi.MatchSport
			cr.SportLo, cr.SportHi = r.Sport.Lo, r.Sport.Hi
		}
		if r.Dport != nil {
			cr.Match |= abi.MatchDport
			cr.DportLo, cr.DportHi = r.Dport.Lo, r.Dport.Hi
		}
		if r.Length != nil {
			cr.Match |= abi.MatchLength
			cr.LenLo, cr.LenHi = r.Length.Lo, r.Length.Hi
		}
		if r.HasFlags {
			cr.Match |= abi.MatchTCPFlags
			cr.FlagsSet, cr.FlagsClear = r.FlagsOn, r.FlagsOff
		}
		img.Rules = append(img.Rules, cr)
	}

	img.Lists = bits
	var lists []*policy.List
	var listBits []uint64
	for name, b := range bits {
		lists = append(lists, pol.Lists[name])
		listBits = append(listBits, b)
	}
	img.Tables = BuildTables(lists, listBits)
	return img
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
	if a == policy.Drop {
		return abi.ActionDrop
	}
	return abi.ActionPass
}

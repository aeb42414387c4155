package datapath

import (
	"errors"

	"github.com/cilium/ebpf"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/compile"
)

// ReplaceOverlay rewrites the in-place overlay of the objects: new and
// changed entries first, then stale ones deleted. Every update is atomic for
// the packets that see it, and the base tables are never touched.
func (o *Objects) ReplaceOverlay(v4 []compile.OverlayEntry[abi.LPMKeyV4], v6 []compile.OverlayEntry[abi.LPMKeyV6]) error {
	if err := replaceOverlay(o.OverlayV4, v4); err != nil {
		return err
	}
	return replaceOverlay(o.OverlayV6, v6)
}

func replaceOverlay[K abi.LPMKeyV4 | abi.LPMKeyV6](m *ebpf.Map, entries []compile.OverlayEntry[K]) error {
	if err := putOverlay(m, entries); err != nil {
		return err
	}
	keep := make(map[K]bool, len(entries))
	for _, e := range entries {
		keep[e.Key] = true
	}
	var stale []K
	var k K
	var v abi.Overlay
	it := m.Iterate()
	for it.Next(&k, &v) {
		if !keep[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	for _, k := range stale {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}

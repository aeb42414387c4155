package datapath

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// ScopeStateDir holds the state of the hooks of one network namespace ("":
// the host's).
func ScopeStateDir(netns string) string { return filepath.Join(StateRoot, Hook{Netns: netns}.scope()) }

// ReplaceOverlay rewrites the in-place overlay of st's live generation. New
// and changed entries are written first, then stale ones deleted; every
// update is atomic for the packets that see it, and the base tables are
// never touched.
func ReplaceOverlay(st *State, v4 []OverlayEntry[LPMKeyV4], v6 []OverlayEntry[LPMKeyV6]) error {
	dir := st.Hook.genDir(st.Generation)
	o := &Objects{Tables: map[string]*ebpf.Map{}}
	defer o.Close()
	for _, name := range []string{MapOverlayV4, MapOverlayV6} {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), nil)
		if err != nil {
			return fmt.Errorf("%s: open %s: %w", st.Hook, name, err)
		}
		o.Tables[name] = m
	}
	if err := o.ReplaceOverlay(v4, v6); err != nil {
		return fmt.Errorf("%s: %w", st.Hook, err)
	}
	return nil
}

// ReplaceOverlay rewrites the objects' overlay in place (see the function).
func (o *Objects) ReplaceOverlay(v4 []OverlayEntry[LPMKeyV4], v6 []OverlayEntry[LPMKeyV6]) error {
	if err := replaceOverlay(o.Tables[MapOverlayV4], v4); err != nil {
		return err
	}
	return replaceOverlay(o.Tables[MapOverlayV6], v6)
}

func replaceOverlay[K LPMKeyV4 | LPMKeyV6](m *ebpf.Map, entries []OverlayEntry[K]) error {
	if err := PutOverlay(m, entries); err != nil {
		return err
	}
	keep := make(map[K]bool, len(entries))
	for _, e := range entries {
		keep[e.Key] = true
	}
	var stale []K
	var k K
	var v Overlay
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

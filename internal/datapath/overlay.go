package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/compile"
)

// ReplaceOverlay rewrites the in-place overlay of the objects (see
// TableMaps.ReplaceOverlay).
func (o *Objects) ReplaceOverlay(v4 []compile.OverlayEntry[abi.LPMKeyV4], v6 []compile.OverlayEntry[abi.LPMKeyV6]) error {
	if err := o.addMaskEqs(v4, v6); err != nil {
		return err
	}
	return o.tables().ReplaceOverlay(v4, v6)
}

// AddOverlay writes overlay entries over the ones held, as a change's are:
// their lengths first, then their classifier masks, then the entries.
// Nothing is deleted; a length left without entries costs a probe until
// the next ReplaceOverlay.
func (o *Objects) AddOverlay(v4 []compile.OverlayEntry[abi.LPMKeyV4], v6 []compile.OverlayEntry[abi.LPMKeyV6]) error {
	m := o.tables()
	if err := m.addLengths(overlayLengths(v4, v6)); err != nil {
		return err
	}
	if err := o.addMaskEqs(v4, v6); err != nil {
		return err
	}
	return errors.Join(putOverlay(m.OverlayV4, v4), putOverlay(m.OverlayV6, v6))
}

// overlayLengths are the lengths of the entries, by family.
func overlayLengths(v4 []compile.OverlayEntry[abi.LPMKeyV4], v6 []compile.OverlayEntry[abi.LPMKeyV6]) [2]abi.OverlayLengths {
	var want [2]abi.OverlayLengths
	for _, e := range v4 {
		setLength(&want[0], e.Key.Prefixlen)
	}
	for _, e := range v6 {
		setLength(&want[1], e.Key.Prefixlen)
	}
	return want
}

// addLengths adds lengths to those the programs probe.
func (m TableMaps) addLengths(add [2]abi.OverlayLengths) error {
	for fam := range add {
		var cur abi.OverlayLengths
		if err := m.OverlayLengths.Lookup(uint32(fam), &cur); err != nil {
			return err
		}
		for i := range cur.Bits {
			cur.Bits[i] |= add[fam].Bits[i]
		}
		if err := m.OverlayLengths.Put(uint32(fam), cur); err != nil {
			return err
		}
	}
	return nil
}

// addMaskEqs tells the classifier the eqs of the list masks the overlay
// makes: a mask some address class has takes that class's eqs. A mask no
// class has stays unknown, and its addresses are judged under EQ_ANY, by the
// leaves: correct, only slower. So do the masks of classes inside an inline
// prefix (compile.ClassInPrefix), whose eqs the mask does not decide.
// Entries are only ever added: a mask's eqs are fixed for the life of the
// objects.
func (o *Objects) addMaskEqs(v4 []compile.OverlayEntry[abi.LPMKeyV4], v6 []compile.OverlayEntry[abi.LPMKeyV6]) error {
	deltas := map[abi.Overlay]bool{}
	for _, e := range v4 {
		deltas[e.Overlay] = true
	}
	for _, e := range v6 {
		deltas[e.Overlay] = true
	}
	if len(deltas) == 0 {
		return nil
	}
	masks, err := readArray[uint64](o.Classes)
	if err != nil {
		return err
	}
	eqs, err := readArray[abi.ClassEqs](o.ClassEqs)
	if err != nil {
		return err
	}
	known := make(map[uint64]abi.ClassEqs, len(masks))
	for c, m := range masks {
		if c < len(eqs) && m&compile.ClassInPrefix == 0 {
			known[m] = eqs[c]
		}
	}
	for d := range deltas {
		for _, m := range masks {
			after := m&^d.Clear | d.Set
			if after&compile.ClassInPrefix != 0 {
				continue
			}
			e, ok := known[after]
			if !ok {
				continue
			}
			err := o.MaskEqs.Update(after, e, ebpf.UpdateNoExist)
			switch {
			case errors.Is(err, unix.E2BIG):
				return nil // full: the rest are judged under EQ_ANY
			case err != nil && !errors.Is(err, ebpf.ErrKeyExist):
				return fmt.Errorf("the classifier's overlay masks: %w", err)
			}
		}
	}
	return nil
}

// readArray copies an mmap-able array map's elements.
func readArray[T any](m *ebpf.Map) ([]T, error) {
	mem, err := m.Memory()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", m, err)
	}
	out := make([]T, m.MaxEntries())
	_, err = mem.ReadAt(compile.AsBytes(out), 0)
	return out, err
}

// ReplaceOverlay rewrites the in-place overlay: new and changed entries
// first, then stale ones deleted. Every update is atomic for the packets that
// see it, and the base tables are never touched. The programs probe only the
// lengths overlay_lengths holds: a length is added before entries of it are
// written and dropped after the last is deleted.
func (m TableMaps) ReplaceOverlay(v4 []compile.OverlayEntry[abi.LPMKeyV4], v6 []compile.OverlayEntry[abi.LPMKeyV6]) error {
	return m.writeOverlay(v4, v6, false)
}

// writeOverlay is ReplaceOverlay; fresh: the maps are new and empty, and
// nothing is read first (a batch read walks every bucket of a hash map, a
// million for an empty overlay: 5-6 ms each).
func (m TableMaps) writeOverlay(v4 []compile.OverlayEntry[abi.LPMKeyV4], v6 []compile.OverlayEntry[abi.LPMKeyV6], fresh bool) error {
	want := overlayLengths(v4, v6)
	if err := m.addLengths(want); err != nil {
		return err
	}
	if err := replaceOverlay(m.OverlayV4, v4, fresh); err != nil {
		return err
	}
	if err := replaceOverlay(m.OverlayV6, v6, fresh); err != nil {
		return err
	}
	return errors.Join(m.OverlayLengths.Put(uint32(0), want[0]), m.OverlayLengths.Put(uint32(1), want[1]))
}

func setLength(l *abi.OverlayLengths, n uint32) {
	l.Bits[n/64] |= 1 << (n % 64)
}

func replaceOverlay[K abi.LPMKeyV4 | abi.LPMKeyV6](m *ebpf.Map, entries []compile.OverlayEntry[K], fresh bool) error {
	// What the table holds, read in batches before writing: only new and
	// changed entries are written (a change to a long overlay touches few
	// of its entries). A fresh table holds nothing.
	held := map[K]abi.Overlay{}
	if !fresh {
		keys, vals := make([]K, 4096), make([]abi.Overlay, 4096)
		var cursor ebpf.MapBatchCursor
		for {
			n, err := m.BatchLookup(&cursor, keys, vals, nil)
			for i := range n {
				held[keys[i]] = vals[i]
			}
			if errors.Is(err, ebpf.ErrKeyNotExist) || err == nil && n == 0 {
				break
			}
			if err != nil {
				return fmt.Errorf("read %s: %w", m, err)
			}
		}
	}
	var changed []compile.OverlayEntry[K]
	for _, e := range entries {
		if was, ok := held[e.Key]; !ok || was != e.Overlay {
			changed = append(changed, e)
		}
		delete(held, e.Key)
	}
	if err := putOverlay(m, changed); err != nil {
		return err
	}
	for k := range held { // stale
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}

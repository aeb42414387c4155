package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/compile"
)

// minOverlay is the fewest entries a generation's overlay table of one
// family is made for: 64 KB of buckets.
const minOverlay = 1 << 12

// overlayCapacity is what a generation's overlay table is made for when it
// is to hold n entries: twice as many, a power of two (its bucket count),
// minOverlay at least, most (bpf/lists.h's) at the most. The kernel
// creates and zeroes every bucket of a hash table with it: at a million,
// 16 MB and 9-15 ms a table at every apply. A table that fills grows in
// place (growOverlay): the kernel compares no hash table's max_entries
// with its outer map's template (since Linux 5.10; arrays it does), so a
// table of any size takes a generation's slot.
func overlayCapacity(n int, most uint32) uint32 {
	c := uint32(minOverlay)
	for c < most && uint64(c) < 2*uint64(n) {
		c *= 2
	}
	return min(c, most)
}

// ReplaceOverlay rewrites the in-place overlay of the objects (see
// writeOverlay), growing a table that fills.
func (o *Objects) ReplaceOverlay(v4 []compile.OverlayEntry[abi.LPMKeyV4], v6 []compile.OverlayEntry[abi.LPMKeyV6]) error {
	pinErr, err := o.readSlotOverlays()
	if err != nil {
		return err
	}
	if err := o.addMaskEqs(v4, v6); err != nil {
		return err
	}
	return errors.Join(o.tables().writeOverlay(v4, v6, false, o.growers()), pinErr)
}

// AddOverlay writes overlay entries over the ones held, as a change's are:
// their lengths first, then their classifier masks, then the entries,
// growing a table that fills. Nothing is deleted; a length left without
// entries costs a probe until the next ReplaceOverlay.
func (o *Objects) AddOverlay(v4 []compile.OverlayEntry[abi.LPMKeyV4], v6 []compile.OverlayEntry[abi.LPMKeyV6]) error {
	pinErr, err := o.readSlotOverlays()
	if err != nil {
		return err
	}
	m := o.tables()
	if err := m.addLengths(overlayLengths(v4, v6)); err != nil {
		return err
	}
	if err := o.addMaskEqs(v4, v6); err != nil {
		return err
	}
	grow := o.growers()
	_, err4 := putOrGrow(m.OverlayV4, v4, grow[0])
	_, err6 := putOrGrow(m.OverlayV6, v6, grow[1])
	return errors.Join(err4, err6, pinErr)
}

// grower makes a full overlay table's replacement, holding what it held,
// with room for pending entries more, and returns it: nil when it made
// none; with an error beside it when the replacement is in place but
// could not be pinned.
type grower func(pending int) (*ebpf.Map, error)

// growers grow o's overlay tables, IPv4's and IPv6's; none for an earlier
// release's objects, whose tables are their programs' own.
func (o *Objects) growers() [2]grower {
	if o.shape.Live == nil {
		return [2]grower{}
	}
	g := o.overlayMaps()
	return [2]grower{
		func(pending int) (*ebpf.Map, error) { return growOverlay[abi.LPMKeyV4](o, g[0], pending) },
		func(pending int) (*ebpf.Map, error) { return growOverlay[abi.LPMKeyV6](o, g[1], pending) },
	}
}

// overlayMaps are o's overlay tables, IPv4's and IPv6's, with their outer
// maps.
func (o *Objects) overlayMaps() [2]genMap {
	return [2]genMap{{filterMapOverlayV4, &o.shape.OverlayV4, &o.OverlayV4}, {filterMapOverlayV6, &o.shape.OverlayV6, &o.OverlayV6}}
}

// putOrGrow writes entries into m or, when m is full and grow is given,
// into the table grow replaces it with, which it returns.
func putOrGrow[K abi.LPMKeyV4 | abi.LPMKeyV6](m *ebpf.Map, entries []compile.OverlayEntry[K], grow grower) (*ebpf.Map, error) {
	err := putOverlay(m, entries)
	if grow == nil || !errors.Is(err, unix.E2BIG) {
		return m, err
	}
	grown, pinErr := grow(len(entries))
	if grown == nil {
		return nil, pinErr
	}
	return grown, errors.Join(putOverlay(grown, entries), pinErr)
}

// overlayElemBytes is about what a hash table element of the overlay
// costs the kernel: the element's header, key and value, and its bucket.
const overlayElemBytes = 96

// growOverlay replaces g's full table with one made for what it holds and
// pending entries more: a copy, put into the generation's slot of the
// outer map when it has one, then pinned over the old table's pin. A
// frame's probes may meet either table, one length the old and another
// the new: the new holds every entry of the old, which takes no more
// writes. The old table is closed once the put has returned, after the
// kernel's grace period.
func growOverlay[K abi.LPMKeyV4 | abi.LPMKeyV6](o *Objects, g genMap, pending int) (*ebpf.Map, error) {
	old := *g.inner
	held, err := readOverlay[K](old)
	if err != nil {
		return nil, err
	}
	spec, err := parsedFilter()
	if err != nil {
		return nil, err
	}
	inner := spec.Maps[g.name].InnerMap.Copy()
	inner.MaxEntries = overlayCapacity(len(held)+pending, inner.MaxEntries)
	if inner.MaxEntries <= old.MaxEntries() {
		return nil, fmt.Errorf("the overlay holds %d entries of a family and %d more do not fit (at most %d): fold the live list changes into the lists' files, or revert some", len(held), pending, old.MaxEntries())
	}
	if err := CheckMemory(uint64(inner.MaxEntries) * overlayElemBytes); err != nil {
		return nil, fmt.Errorf("grow the overlay: %w", err)
	}
	m, err := ebpf.NewMap(inner)
	if err != nil {
		return nil, fmt.Errorf("grow the overlay: %w", err)
	}
	entries := make([]compile.OverlayEntry[K], 0, len(held))
	for k, v := range held {
		entries = append(entries, compile.OverlayEntry[K]{Key: k, Overlay: v})
	}
	if err := putOverlay(m, entries); err != nil {
		m.Close()
		return nil, fmt.Errorf("grow the overlay: %w", err)
	}
	slot, err := o.slot()
	var there ebpf.MapID
	if err == nil {
		there, err = overlayIn(g, slot)
	}
	if err == nil && there != 0 {
		err = (*g.outer).Put(uint32(slot), m)
	}
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("grow the overlay: %w", err)
	}
	old.Close()
	*g.inner = m
	// A pin left on the old table (this one failing, or the generation's
	// pins under another hook) is put right by readSlotOverlays.
	return m, o.repin(g.name, m)
}

// overlayIn is the table of g's family in slot of g's outer map (the
// slot of o's generation, o.slot), 0 when there is none: no slot, or one
// an activation or a delete cut short left without that table.
func overlayIn(g genMap, slot int) (ebpf.MapID, error) {
	var id ebpf.MapID
	if slot < 0 {
		return 0, nil
	}
	if err := (*g.outer).Lookup(uint32(slot), &id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return 0, fmt.Errorf("read the generation's %s: %w", g.name, err)
	}
	return id, nil
}

// readSlotOverlays makes o's overlay tables those its generation's slot
// holds, when it is in one, and pins them where o was opened from: a table
// grown through another hook's pins of the same generation, or a growth
// cut short between its put and its pin, leaves the old one pinned here,
// and a change written into it would never reach a frame. A table it
// could not pin is o's all the same (pinErr): the next write pins it.
func (o *Objects) readSlotOverlays() (pinErr, err error) {
	if o.shape.Live == nil {
		return nil, nil
	}
	slot, err := o.slot()
	if err != nil || slot < 0 {
		return nil, err
	}
	for _, g := range o.overlayMaps() {
		id, err := overlayIn(g, slot)
		if err != nil {
			return nil, err
		}
		if id == 0 {
			continue
		}
		own, err := mapID(*g.inner)
		if err != nil {
			return nil, err
		}
		if own == id {
			continue
		}
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			return nil, fmt.Errorf("open the generation's %s: %w", g.name, err)
		}
		(*g.inner).Close()
		*g.inner = m
		pinErr = errors.Join(pinErr, o.repin(g.name, m))
	}
	return pinErr, nil
}

// slot is the slot of the shape's outer maps that holds o's maps, -1 when
// none does (a generation not live yet, or no more).
func (o *Objects) slot() (int, error) {
	own, err := mapID(o.Configs)
	if err != nil {
		return 0, err
	}
	for s := range 2 {
		var id ebpf.MapID
		err := o.shape.Configs.Lookup(uint32(s), &id)
		if err == nil && id == own {
			return s, nil
		}
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return 0, fmt.Errorf("read the generations: %w", err)
		}
	}
	return -1, nil
}

// errPin is a grown overlay table in place that could not be pinned.
var errPin = errors.New("pin the grown overlay table")

// repin pins m as o's map of that name, over the pin there, atomically
// (bpffs renames like any file system).
func (o *Objects) repin(name string, m *ebpf.Map) error {
	if o.pins == "" {
		return nil
	}
	path := filepath.Join(o.pins, name)
	tmp := path + "_new"
	os.Remove(tmp)
	err := (object{m: &m}).pin(tmp)
	if err == nil {
		if err = os.Rename(tmp, path); err != nil {
			os.Remove(tmp)
		}
	}
	if err != nil {
		return fmt.Errorf("%w %s: %w", errPin, name, err)
	}
	return nil
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
// prefix (compile.ClassUnmasked), whose eqs the mask does not decide.
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
	size := uint32(unsafe.Sizeof(abi.ClassEqs{}))
	if len(deltas) == 0 || o.ClassEqs.ValueSize() != size || o.MaskEqs.ValueSize() != size {
		return nil // another build's maps: their masks stay under EQ_ANY
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
		if c > 0 && m == 0 {
			continue // past the classes: no class but 0 has no list, prefix or static list
		}
		if c < len(eqs) && m&compile.ClassUnmasked == 0 {
			known[m] = eqs[c]
		}
	}
	for d := range deltas {
		for _, m := range masks {
			after := m&^d.Clear | d.Set
			if after&compile.ClassUnmasked != 0 {
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

// writeOverlay rewrites the in-place overlay: new and changed entries
// first, then stale ones deleted. Every update is atomic for the packets
// that see it, and the base tables are never touched. The programs probe
// only the lengths overlay_lengths holds: a length is added before entries
// of it are written and dropped after the last is deleted. fresh: the maps
// are new and empty, and nothing is read first (a batch read walks every
// bucket of a hash map). grow replaces a table that fills, per family.
func (m TableMaps) writeOverlay(v4 []compile.OverlayEntry[abi.LPMKeyV4], v6 []compile.OverlayEntry[abi.LPMKeyV6], fresh bool, grow [2]grower) error {
	want := overlayLengths(v4, v6)
	if err := m.addLengths(want); err != nil {
		return err
	}
	if err := replaceOverlay(m.OverlayV4, v4, fresh, grow[0]); err != nil {
		return err
	}
	if err := replaceOverlay(m.OverlayV6, v6, fresh, grow[1]); err != nil {
		return err
	}
	return errors.Join(m.OverlayLengths.Put(uint32(0), want[0]), m.OverlayLengths.Put(uint32(1), want[1]))
}

func setLength(l *abi.OverlayLengths, n uint32) {
	l.Bits[n/64] |= 1 << (n % 64)
}

func replaceOverlay[K abi.LPMKeyV4 | abi.LPMKeyV6](m *ebpf.Map, entries []compile.OverlayEntry[K], fresh bool, grow grower) error {
	// What the table holds, read before writing: only new and changed
	// entries are written (a change to a long overlay touches few of its
	// entries). A fresh table holds nothing.
	held := map[K]abi.Overlay{}
	if !fresh {
		var err error
		if held, err = readOverlay[K](m); err != nil {
			return err
		}
	}
	var changed []compile.OverlayEntry[K]
	for _, e := range entries {
		if was, ok := held[e.Key]; !ok || was != e.Overlay {
			changed = append(changed, e)
		}
		delete(held, e.Key)
	}
	m, err := putOrGrow(m, changed, grow)
	if m == nil || err != nil && !errors.Is(err, errPin) {
		return err
	}
	for k := range held { // stale
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return err // a grown table not pinned: in place, and pinned by the next write
}

// readOverlay reads an overlay table whole, in batches.
func readOverlay[K abi.LPMKeyV4 | abi.LPMKeyV6](m *ebpf.Map) (map[K]abi.Overlay, error) {
	held := map[K]abi.Overlay{}
	keys, vals := make([]K, 4096), make([]abi.Overlay, 4096)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			held[keys[i]] = vals[i]
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) || err == nil && n == 0 {
			return held, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", m, err)
		}
	}
}

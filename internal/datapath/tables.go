package datapath

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/compile"
)

// listParams are the parameters lists.h reads tables t with.
func listParams(t *compile.Tables) abi.ListParams {
	// An empty table has 0 buckets, which lists.h does not read.
	return abi.ListParams{V4Buckets: uint32(len(t.V4Blocks)), V4WideBuckets: uint32(len(t.V4Wide)), V4DenseBuckets: uint32(len(t.V4Dense)),
		V6Buckets: uint32(len(t.V6Blocks)), V6ShortBuckets: uint32(len(t.V6Short)), V6LongBuckets: uint32(len(t.V6Long)), V6HotLen: t.V6HotLen,
		V4BlockMul: t.V4BlockMul, V4WideMul: t.V4WideMul, V4DenseMul: t.V4DenseMul, V6BlockMul: t.V6BlockMul, V6ShortMul: t.V6ShortMul, V6LongMul: t.V6LongMul}
}

// tableSizes are the entries tables t need in each prefix-list map.
func tableSizes(t *compile.Tables) map[string]int {
	return map[string]int{
		filterMapV4Blocks: len(t.V4Blocks), filterMapV4Wide: len(t.V4Wide), filterMapV4Dense: len(t.V4Dense), filterMapV4Tbl8s: len(t.V4Tbl8s),
		filterMapV6Blocks: len(t.V6Blocks), filterMapV6Short: len(t.V6Short), filterMapV6Long: len(t.V6Long), filterMapClasses: len(t.Classes),
	}
}

// ListMaps are the maps of a generation of lists alone (ListGeneration).
type ListMaps struct {
	TableMaps
	all []*ebpf.Map
}

// Close releases the maps' descriptors.
func (l *ListMaps) Close() { closeAll(l.all) }

// SizeLists sizes the prefix-list maps of an object built over
// bpf/lists.h alone (the lookup benchmark's) for tables t, before load.
func SizeLists(spec *ebpf.CollectionSpec, t *compile.Tables) {
	for name, n := range tableSizes(t) {
		spec.Maps[name].InnerMap.MaxEntries = uint32(max(1, n))
	}
}

// ListGeneration gives such an object, loaded from spec once SizeLists
// sized it, tables t as its generation 0: it creates the prefix-list maps
// and the settings, fills them, and puts them into outers (the loaded
// outer maps, by name).
func ListGeneration(spec *ebpf.CollectionSpec, outers map[string]*ebpf.Map, t *compile.Tables) (*ListMaps, error) {
	made := map[string]*ebpf.Map{}
	var all []*ebpf.Map
	for _, name := range []string{filterMapConfigs, filterMapV4Blocks, filterMapV4Wide, filterMapV4Dense, filterMapV4Tbl8s, filterMapV6Blocks,
		filterMapV6Short, filterMapV6Long, filterMapClasses, filterMapOverlayV4, filterMapOverlayV6, filterMapOverlayLengths} {
		m, err := ebpf.NewMap(spec.Maps[name].InnerMap)
		if err != nil {
			closeAll(all)
			return nil, fmt.Errorf("create %s: %w", name, err)
		}
		made[name], all = m, append(all, m)
	}
	tm := TableMaps{V4Blocks: made[filterMapV4Blocks], V4Wide: made[filterMapV4Wide], V4Dense: made[filterMapV4Dense], V4Tbl8s: made[filterMapV4Tbl8s],
		V6Blocks: made[filterMapV6Blocks], V6Short: made[filterMapV6Short], V6Long: made[filterMapV6Long], Classes: made[filterMapClasses],
		OverlayV4: made[filterMapOverlayV4], OverlayV6: made[filterMapOverlayV6], OverlayLengths: made[filterMapOverlayLengths]}
	errs := []error{tm.Fill(t), made[filterMapConfigs].Put(uint32(0), abi.Config{Lists: listParams(t)})}
	for name, m := range made {
		errs = append(errs, outers[name].Put(uint32(0), m))
	}
	if err := errors.Join(errs...); err != nil {
		closeAll(all)
		return nil, err
	}
	return &ListMaps{TableMaps: tm, all: all}, nil
}

func closeAll(maps []*ebpf.Map) {
	for _, m := range maps {
		m.Close()
	}
}

// TableMaps are the prefix-list maps of bpf/lists.h once loaded.
type TableMaps struct {
	V4Blocks, V4Wide, V4Dense, V4Tbl8s, V6Blocks, V6Short, V6Long, Classes *ebpf.Map
	OverlayV4, OverlayV6, OverlayLengths                                   *ebpf.Map
}

// Fill writes the tables into fresh maps, empty and sized by
// TableSpecs.Size.
func (m TableMaps) Fill(t *compile.Tables) error {
	for _, a := range []struct {
		m    *ebpf.Map
		data []byte
	}{
		{m.V4Blocks, compile.AsBytes(t.V4Blocks)}, {m.V4Wide, compile.AsBytes(t.V4Wide)}, {m.V4Dense, compile.AsBytes(t.V4Dense)}, {m.V4Tbl8s, compile.AsBytes(t.V4Tbl8s)},
		{m.V6Blocks, compile.AsBytes(t.V6Blocks)}, {m.V6Short, compile.AsBytes(t.V6Short)}, {m.V6Long, compile.AsBytes(t.V6Long)},
		{m.Classes, compile.AsBytes(t.Classes)},
	} {
		if err := writeArray(a.m, a.data); err != nil {
			return err
		}
	}
	return m.writeOverlay(t.OverlayV4, t.OverlayV6, true, [2]grower{})
}

// Memlock is the kernel memory the tables account for.
func (m TableMaps) Memlock() uint64 {
	var n uint64
	for _, x := range []*ebpf.Map{m.V4Blocks, m.V4Wide, m.V4Dense, m.V4Tbl8s, m.V6Blocks, m.V6Short, m.V6Long, m.Classes, m.OverlayV4, m.OverlayV6} {
		n += Memlock(x)
	}
	return n
}

// Memlock is the kernel memory a map accounts for; 0 when unknown.
func Memlock(m *ebpf.Map) uint64 {
	info, err := m.Info()
	if err != nil {
		return 0
	}
	b, _ := info.Memlock()
	return b
}

// writeWindow is how much of a map writeArray maps at once: whole pages,
// as mmap offsets are.
var writeWindow = 64 << 20

// writeArray copies bytes into an mmap-able array map, far faster than an
// update per element. It maps a window at a time and unmaps it at once,
// rather than through cilium/ebpf's Map.Memory, which stays mapped while the
// map is open: mapped, a list's tables would count in this process's memory
// twice over (hundreds of MB for ten million prefixes) until the end.
func writeArray(m *ebpf.Map, data []byte) error {
	for off := 0; off < len(data); off += writeWindow {
		n := min(writeWindow, len(data)-off)
		mem, err := unix.Mmap(m.FD(), int64(off), n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return fmt.Errorf("%s: map its memory: %w", m, err)
		}
		copy(mem, data[off:off+n])
		if err := unix.Munmap(mem); err != nil {
			return fmt.Errorf("%s: unmap its memory: %w", m, err)
		}
	}
	return nil
}

// putOverlay writes overlay entries, in batches of 4096.
func putOverlay[K abi.LPMKeyV4 | abi.LPMKeyV6](m *ebpf.Map, entries []compile.OverlayEntry[K]) error {
	for len(entries) > 0 {
		n := min(len(entries), 4096)
		keys, vals := make([]K, n), make([]abi.Overlay, n)
		for i, e := range entries[:n] {
			keys[i], vals[i] = e.Key, e.Overlay
		}
		if _, err := m.BatchUpdate(keys, vals, nil); err != nil {
			return fmt.Errorf("overlay: %w", err)
		}
		entries = entries[n:]
	}
	return nil
}

// CheckCap refuses tables over maxBytes, an operator's cap on their kernel
// memory (RAMPART_MAX_TABLE_BYTES; 0 is no cap), before any map is filled
// (a spare generation may exist already: its maps are the running
// policy's size, admitted before).
func CheckCap(need, maxBytes uint64) error {
	if maxBytes > 0 && need > maxBytes {
		return fmt.Errorf("the prefix lists need about %d bytes of kernel memory, over RAMPART_MAX_TABLE_BYTES=%d: nothing was changed", need, maxBytes)
	}
	return nil
}

// CheckMemory refuses tables that would not fit in the memory available,
// before any map is filled; need leaves out what spare maps hold already.
func CheckMemory(need uint64) error {
	if avail, ok := memAvailable(); ok && need > avail*9/10 {
		return fmt.Errorf("the prefix lists need about %d MiB of kernel memory and only %d MiB are available: nothing was changed (shorten the lists or free memory)", need>>20, avail>>20)
	}
	return nil
}

// memAvailable is the kernel's estimate of the bytes available for new
// allocations; ok false when /proc/meminfo does not say.
func memAvailable() (uint64, bool) {
	f, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(f), "\n") {
		var kb uint64
		if _, err := fmt.Sscanf(line, "MemAvailable: %d kB", &kb); err == nil {
			return kb * 1024, true
		}
	}
	return 0, false
}

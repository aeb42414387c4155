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

// TableSpecs are the prefix-list maps and variables of bpf/lists.h before
// load, in any object built over it (the filter, the lookup benchmark).
type TableSpecs struct {
	V4Blocks, V4Wide, V4Bitmaps, V4Tbl8s, V6Blocks, V6Short, V6Long, Classes *ebpf.MapSpec
	V4Buckets, V4WideBuckets, V6Buckets, V6ShortBuckets, V6LongBuckets       *ebpf.VariableSpec
	V4BlockMul, V4WideMul, V6BlockMul, V6ShortMul, V6LongMul, V6HotLen       *ebpf.VariableSpec
}

// Size sets every table to its contents, and the hashes' parameters.
func (s *TableSpecs) Size(t *compile.Tables) error {
	for _, m := range []struct {
		spec *ebpf.MapSpec
		n    int
	}{
		{s.V4Blocks, len(t.V4Blocks)}, {s.V4Wide, len(t.V4Wide)}, {s.V4Bitmaps, len(t.V4Bitmaps)}, {s.V4Tbl8s, len(t.V4Tbl8s)},
		{s.V6Blocks, len(t.V6Blocks)}, {s.V6Short, len(t.V6Short)}, {s.V6Long, len(t.V6Long)}, {s.Classes, len(t.Classes)},
	} {
		m.spec.MaxEntries = uint32(max(1, m.n))
	}
	// An empty table's bucket count is still a page's, as lists.h
	// computes buckets; its one element is empty and lookups past it find
	// nothing.
	buckets := func(n int) uint32 { return uint32(max(abi.PageBuckets, n)) }
	return errors.Join(s.V4Buckets.Set(buckets(len(t.V4Blocks))), s.V4WideBuckets.Set(buckets(len(t.V4Wide))), s.V6Buckets.Set(buckets(len(t.V6Blocks))),
		s.V6ShortBuckets.Set(buckets(len(t.V6Short))), s.V6LongBuckets.Set(buckets(len(t.V6Long))),
		s.V4BlockMul.Set(t.V4BlockMul), s.V4WideMul.Set(t.V4WideMul), s.V6BlockMul.Set(t.V6BlockMul), s.V6ShortMul.Set(t.V6ShortMul), s.V6LongMul.Set(t.V6LongMul),
		s.V6HotLen.Set(t.V6HotLen))
}

// TableMaps are the prefix-list maps of bpf/lists.h once loaded.
type TableMaps struct {
	V4Blocks, V4Wide, V4Bitmaps, V4Tbl8s, V6Blocks, V6Short, V6Long, Classes *ebpf.Map
	OverlayV4, OverlayV6, OverlayLengths                                     *ebpf.Map
}

// Fill writes the tables into maps sized by TableSpecs.Size.
func (m TableMaps) Fill(t *compile.Tables) error {
	for _, a := range []struct {
		m    *ebpf.Map
		data []byte
	}{
		{m.V4Blocks, compile.AsBytes(t.V4Blocks)}, {m.V4Wide, compile.AsBytes(t.V4Wide)}, {m.V4Bitmaps, compile.AsBytes(t.V4Bitmaps)}, {m.V4Tbl8s, compile.AsBytes(t.V4Tbl8s)},
		{m.V6Blocks, compile.AsBytes(t.V6Blocks)}, {m.V6Short, compile.AsBytes(t.V6Short)}, {m.V6Long, compile.AsBytes(t.V6Long)},
		{m.Classes, compile.AsBytes(t.Classes)},
	} {
		if err := writeArray(a.m, a.data); err != nil {
			return err
		}
	}
	return m.ReplaceOverlay(t.OverlayV4, t.OverlayV6)
}

// Memlock is the kernel memory the tables account for.
func (m TableMaps) Memlock() uint64 {
	var n uint64
	for _, x := range []*ebpf.Map{m.V4Blocks, m.V4Wide, m.V4Bitmaps, m.V4Tbl8s, m.V6Blocks, m.V6Short, m.V6Long, m.Classes, m.OverlayV4, m.OverlayV6} {
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
// memory (RAMPART_MAX_TABLE_BYTES; 0 is no cap), before any map is created.
func CheckCap(need, maxBytes uint64) error {
	if maxBytes > 0 && need > maxBytes {
		return fmt.Errorf("the prefix lists need about %d bytes of kernel memory, over RAMPART_MAX_TABLE_BYTES=%d: nothing was changed", need, maxBytes)
	}
	return nil
}

// CheckMemory refuses tables that would not fit in the memory available,
// before any map is created.
func CheckMemory(need uint64) error {
	f, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(f), "\n") {
		var kb uint64
		if _, err := fmt.Sscanf(line, "MemAvailable: %d kB", &kb); err == nil {
			if need > kb*1024*9/10 {
				return fmt.Errorf("the prefix lists need about %d MiB of kernel memory and only %d MiB are available: nothing was changed (shorten the lists or free memory)", need>>20, kb>>10)
			}
			return nil
		}
	}
	return nil
}

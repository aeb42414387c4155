package datapath

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/compile"
)

// TableSpecs are the prefix-list maps and variables of bpf/lists.h before
// load, in any object built over it (the filter, the lookup benchmark).
type TableSpecs struct {
	V4Present, V4Rank, V4Tbl24, V4Bitmaps, V4Tbl8s, V4Classes, V6Prefixes *ebpf.MapSpec
	V6Lens, V6LenCount                                                    *ebpf.VariableSpec
}

// Size sets every table to its contents (and the populated IPv6 lengths).
func (s *TableSpecs) Size(t *compile.Tables) error {
	chunks := (len(t.V4Tbl24) + abi.V4Chunk - 1) / abi.V4Chunk
	for _, m := range []struct {
		spec *ebpf.MapSpec
		n    int
	}{
		{s.V4Present, len(t.V4Present)}, {s.V4Rank, len(t.V4Rank)}, {s.V4Tbl24, chunks}, {s.V4Bitmaps, len(t.V4Bitmaps)},
		{s.V4Tbl8s, len(t.V4Tbl8s)}, {s.V4Classes, len(t.V4Classes)}, {s.V6Prefixes, len(t.V6)},
	} {
		m.spec.MaxEntries = uint32(max(1, m.n))
	}
	var lens [abi.V6MaxLens]uint8
	copy(lens[:], t.V6Lens)
	if err := s.V6Lens.Set(lens); err != nil {
		return err
	}
	return s.V6LenCount.Set(uint32(len(t.V6Lens)))
}

// TableMaps are the prefix-list maps of bpf/lists.h once loaded.
type TableMaps struct {
	V4Present, V4Rank, V4Tbl24, V4Bitmaps, V4Tbl8s, V4Classes, V6Prefixes, OverlayV4, OverlayV6 *ebpf.Map
}

// Fill writes the tables into maps sized by TableSpecs.Size.
func (m TableMaps) Fill(t *compile.Tables) error {
	for _, a := range []struct {
		m    *ebpf.Map
		data []byte
	}{
		{m.V4Present, unsafeBytes(t.V4Present)}, {m.V4Rank, unsafeBytes(t.V4Rank)}, {m.V4Tbl24, unsafeBytes(t.V4Tbl24)},
		{m.V4Bitmaps, unsafeBytes(t.V4Bitmaps)}, {m.V4Tbl8s, unsafeBytes(t.V4Tbl8s)}, {m.V4Classes, unsafeBytes(t.V4Classes)},
	} {
		if err := writeArray(a.m, a.data); err != nil {
			return err
		}
	}
	keys := make([]abi.LPMKeyV6, len(t.V6))
	vals := make([]uint64, len(t.V6))
	for i, e := range t.V6 {
		keys[i], vals[i] = e.Key, e.Mask
	}
	if err := putAll(m.V6Prefixes, keys, vals); err != nil {
		return fmt.Errorf("IPv6 prefixes: %w", err)
	}
	if err := putOverlay(m.OverlayV4, t.OverlayV4); err != nil {
		return err
	}
	return putOverlay(m.OverlayV6, t.OverlayV6)
}

// Memlock is the kernel memory the tables account for.
func (m TableMaps) Memlock() uint64 {
	var n uint64
	for _, x := range []*ebpf.Map{m.V4Present, m.V4Rank, m.V4Tbl24, m.V4Bitmaps, m.V4Tbl8s, m.V4Classes, m.V6Prefixes, m.OverlayV4, m.OverlayV6} {
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

// writeArray copies bytes into an mmap-able array map in one go: far faster
// than an update per element.
func writeArray(m *ebpf.Map, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	mem, err := m.Memory()
	if err != nil {
		return fmt.Errorf("%s: %w", m, err)
	}
	_, err = mem.WriteAt(data, 0)
	return err
}

// putAll writes keys and values with batch updates, falling back to one at
// a time where the map type has no batch operation.
func putAll[K any, V any](m *ebpf.Map, keys []K, vals []V) error {
	const chunk = 1 << 16
	for i := 0; i < len(keys); i += chunk {
		j := min(i+chunk, len(keys))
		if _, err := m.BatchUpdate(keys[i:j], vals[i:j], nil); err != nil {
			if !errors.Is(err, ebpf.ErrNotSupported) {
				return err
			}
			for k := i; k < j; k++ {
				if err := m.Put(keys[k], vals[k]); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// putOverlay writes overlay entries (an LPM trie: no batch updates).
func putOverlay[K abi.LPMKeyV4 | abi.LPMKeyV6](m *ebpf.Map, entries []compile.OverlayEntry[K]) error {
	for _, e := range entries {
		if err := m.Put(e.Key, e.Overlay); err != nil {
			return fmt.Errorf("overlay: %w", err)
		}
	}
	return nil
}

// CheckMemory refuses tables that would not fit in the memory available
// (or over RAMPART_MAX_TABLE_BYTES, an operator's cap), before any map is
// created.
func CheckMemory(need uint64) error {
	if s := os.Getenv("RAMPART_MAX_TABLE_BYTES"); s != "" {
		limit, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return fmt.Errorf("RAMPART_MAX_TABLE_BYTES=%q: want a number of bytes", s)
		}
		if need > limit {
			return fmt.Errorf("the prefix lists need about %d bytes of kernel memory, over RAMPART_MAX_TABLE_BYTES=%d: nothing was changed", need, limit)
		}
	}
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

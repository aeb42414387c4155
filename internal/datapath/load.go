package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"github.com/cilium/ebpf"
)

// Objects is one loaded policy: an XDP and a tc program over one set of maps,
// so that `auto` can fall back from XDP to tc without loading lists twice.
type Objects struct {
	XDP      *ebpf.Program
	TC       *ebpf.Program
	Counters *ebpf.Map
	// Tables are the prefix-list maps by their names in bpf/lists.h.
	Tables map[string]*ebpf.Map
}

// Names of the prefix-list maps.
const (
	mapPresent   = "v4_present"
	mapRank      = "v4_rank"
	mapTbl24     = "v4_tbl24"
	mapBitmaps   = "v4_bitmaps"
	mapTbl8s     = "v4_tbl8s"
	mapClasses   = "v4_classes"
	mapV6        = "v6_prefixes"
	MapOverlayV4 = "overlay_v4"
	MapOverlayV6 = "overlay_v6"
)

var tableMaps = []string{mapPresent, mapRank, mapTbl24, mapBitmaps, mapTbl8s, mapClasses, mapV6, MapOverlayV4, MapOverlayV6}

// Kind selects one of the two programs.
type Kind int

const (
	KindXDP Kind = iota
	KindTC
)

// Prog returns the program of the given kind.
func (o *Objects) Prog(k Kind) *ebpf.Program {
	if k == KindTC {
		return o.TC
	}
	return o.XDP
}

// Load builds a fresh program and fresh maps holding img. Nothing is attached.
// A verifier rejection is returned whole.
func Load(img *Image) (*Objects, error) {
	if len(img.Rules) > MaxRules {
		return nil, fmt.Errorf("%d rules: at most %d", len(img.Rules), MaxRules)
	}
	spec, err := loadFilter()
	if err != nil {
		return nil, fmt.Errorf("read embedded BPF object: %w", err)
	}
	var rules [MaxRules]Rule
	copy(rules[:], img.Rules)
	for name, v := range map[string]any{
		"rules":            rules,
		"rule_count":       uint32(len(img.Rules)),
		"default_action":   img.DefaultAction,
		"unparsed_action":  img.UnparsedAction,
		"malformed_action": img.MalformedAction,
		"need_src_lookup":  boolByte(img.NeedSrc),
		"need_dst_lookup":  boolByte(img.NeedDst),
		"need_l4":          boolByte(img.NeedL4),
	} {
		if err := spec.Variables[name].Set(v); err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
	}
	coll, err := NewTablesCollection(spec, &img.Tables)
	if err != nil {
		return nil, err
	}
	defer coll.Close()
	o := &Objects{XDP: coll.DetachProgram("rampart_xdp"), TC: coll.DetachProgram("rampart_tc"), Counters: coll.DetachMap("counters"), Tables: map[string]*ebpf.Map{}}
	for _, name := range tableMaps {
		o.Tables[name] = coll.DetachMap(name)
	}
	return o, nil
}

// NewTablesCollection loads spec (the filter or the benchmark, both built
// over bpf/lists.h) with its prefix-list maps sized for and filled with t.
// It refuses tables larger than the memory available before creating
// anything.
func NewTablesCollection(spec *ebpf.CollectionSpec, t *Tables) (*ebpf.Collection, error) {
	if err := checkMemory(t.KernelBytes()); err != nil {
		return nil, err
	}
	lens := [V6MaxLens]uint8{}
	copy(lens[:], t.V6Lens)
	if err := spec.Variables["v6_lens"].Set(lens); err != nil {
		return nil, err
	}
	if err := spec.Variables["v6_len_count"].Set(uint32(len(t.V6Lens))); err != nil {
		return nil, err
	}
	chunks := (len(t.V4Tbl24) + V4Chunk - 1) / V4Chunk
	for name, n := range map[string]int{mapPresent: len(t.V4Present), mapRank: len(t.V4Rank), mapTbl24: chunks, mapBitmaps: len(t.V4Bitmaps), mapTbl8s: len(t.V4Tbl8s), mapClasses: len(t.V4Classes), mapV6: len(t.V6)} {
		spec.Maps[name].MaxEntries = uint32(max(1, n))
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("the kernel's verifier rejected the program:\n%+v", ve)
		}
		return nil, fmt.Errorf("load BPF objects: %w", err)
	}
	if err := fillTables(coll.Maps, t); err != nil {
		coll.Close()
		return nil, fmt.Errorf("fill prefix-list tables: %w", err)
	}
	return coll, nil
}

func fillTables(maps map[string]*ebpf.Map, t *Tables) error {
	for name, data := range map[string]any{mapPresent: t.V4Present, mapRank: t.V4Rank, mapTbl24: t.V4Tbl24, mapBitmaps: t.V4Bitmaps, mapTbl8s: t.V4Tbl8s, mapClasses: t.V4Classes} {
		if err := writeArray(maps[name], data); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	keys := make([]LPMKeyV6, len(t.V6))
	vals := make([]uint64, len(t.V6))
	for i, e := range t.V6 {
		keys[i], vals[i] = e.Key, e.Mask
	}
	if err := putAll(maps[mapV6], keys, vals); err != nil {
		return fmt.Errorf("%s: %w", mapV6, err)
	}
	if err := PutOverlay(maps[MapOverlayV4], t.OverlayV4); err != nil {
		return err
	}
	return PutOverlay(maps[MapOverlayV6], t.OverlayV6)
}

// writeArray copies a slice into an mmap-able array map in one go: far
// faster than an update per element.
func writeArray(m *ebpf.Map, data any) error {
	var buf []byte
	switch d := data.(type) {
	case []uint32:
		buf = unsafeBytes(d)
	case []uint64:
		buf = unsafeBytes(d)
	case []V4Bitmap:
		buf = unsafeBytes(d)
	case []V4Tbl8:
		buf = unsafeBytes(d)
	}
	if len(buf) == 0 {
		return nil
	}
	mem, err := m.Memory()
	if err != nil {
		return err
	}
	_, err = mem.WriteAt(buf, 0)
	return err
}

// unsafeBytes views a slice of plain structs as bytes, without a copy of
// hundreds of megabytes. The element types have no padding the C side
// would not have too (they are generated from the same header).
func unsafeBytes[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(s[0])))
}

// PutOverlay writes overlay entries (an LPM trie: no batch updates).
func PutOverlay[K LPMKeyV4 | LPMKeyV6](m *ebpf.Map, entries []OverlayEntry[K]) error {
	for _, e := range entries {
		if err := m.Put(e.Key, e.Overlay); err != nil {
			return fmt.Errorf("overlay: %w", err)
		}
	}
	return nil
}

// checkMemory refuses tables that would not fit in the memory available
// (or over RAMPART_MAX_TABLE_BYTES, an operator's cap), before any map is
// created.
func checkMemory(need uint64) error {
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

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
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

// Close releases the file descriptors; pinned objects stay in the kernel.
func (o *Objects) Close() {
	for _, c := range []interface{ Close() error }{o.XDP, o.TC, o.Counters} {
		if c != nil {
			c.Close()
		}
	}
	for _, m := range o.Tables {
		if m != nil {
			m.Close()
		}
	}
}

// Pin places the objects under dir, which must not exist yet.
func (o *Objects) Pin(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	objs := map[string]interface{ Pin(string) error }{"xdp": o.XDP, "tc": o.TC, "counters": o.Counters}
	for name, m := range o.Tables {
		objs[name] = m
	}
	for name, p := range objs {
		if err := p.Pin(filepath.Join(dir, name)); err != nil {
			os.RemoveAll(dir)
			return fmt.Errorf("pin %s: %w", name, err)
		}
	}
	return nil
}

// ReadCounters sums the per-CPU counters of every slot.
func ReadCounters(m *ebpf.Map) ([]Counter, error) {
	out := make([]Counter, NumSlots)
	var percpu []Counter
	for slot := uint32(0); slot < NumSlots; slot++ {
		if err := m.Lookup(slot, &percpu); err != nil {
			return nil, fmt.Errorf("read counter %d: %w", slot, err)
		}
		for _, c := range percpu {
			out[slot].Packets += c.Packets
			out[slot].Bytes += c.Bytes
		}
	}
	return out, nil
}

// SumPerCPU adds up slot 0 of a per-CPU array of u64 counters.
func SumPerCPU(m *ebpf.Map) (uint64, error) {
	var percpu []uint64
	if err := m.Lookup(uint32(0), &percpu); err != nil {
		return 0, err
	}
	var n uint64
	for _, v := range percpu {
		n += v
	}
	return n, nil
}

func (k Kind) String() string {
	if k == KindTC {
		return "tc"
	}
	return "xdp"
}

// TablesMemlock is the kernel memory (memlock) of the prefix-list maps of a
// collection loaded by NewTablesCollection.
func TablesMemlock(coll *ebpf.Collection) uint64 {
	var n uint64
	for _, name := range tableMaps {
		n += Memlock(coll.Maps[name])
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

// BenchSpec is the lookup benchmark's BPF object (bpf/bench.c).
func BenchSpec() (*ebpf.CollectionSpec, error) { return loadBench() }

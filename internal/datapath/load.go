// Package datapath holds rampart's kernel objects: it loads the filter built
// from an image (through bpf2go's generated objects), fills its maps, pins
// it, attaches and swaps it on interfaces, and reads its counters. Where
// objects are pinned and what state says about them belongs to
// internal/engine.
package datapath

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/compile"
)

// Kind selects one of the two programs.
type Kind int

const (
	KindXDP Kind = iota
	KindTC
)

func (k Kind) String() string {
	if k == KindTC {
		return "tc"
	}
	return "xdp"
}

// Objects is one loaded policy: an XDP and a tc program over one set of
// maps, so that `auto` can fall back from XDP to tc without loading lists
// twice.
type Objects struct {
	filterPrograms
	filterMaps
}

// Program returns the program of the given kind.
func (o *Objects) Program(k Kind) *ebpf.Program {
	if k == KindTC {
		return o.RampartTc
	}
	return o.RampartXdp
}

// Load builds a fresh program and fresh maps holding img, under a fresh
// flood key. Nothing is attached. A verifier rejection is returned whole.
func Load(img *compile.Image) (*Objects, error) {
	key, err := NewFloodKey()
	if err != nil {
		return nil, err
	}
	return LoadKeyed(img, key)
}

// NewFloodKey draws a key for the flood tables and SYN cookies.
func NewFloodKey() ([2]uint64, error) {
	var key [2]uint64
	if err := binary.Read(rand.Reader, binary.LittleEndian, &key); err != nil {
		return key, fmt.Errorf("a key for the flood tables: %w", err)
	}
	return key, nil
}

// LoadKeyed is Load under a given flood key: a re-apply keeps the last
// one, so that the ACK to a SYN-ACK the old program sent still proves its
// cookie to the new one.
func LoadKeyed(img *compile.Image, key [2]uint64) (*Objects, error) {
	if len(img.Rules) > abi.MaxRules {
		return nil, fmt.Errorf("%d rules: at most %d", len(img.Rules), abi.MaxRules)
	}
	if err := CheckMemory(img.KernelBytes()); err != nil {
		return nil, err
	}
	spec, err := loadFilter()
	if err != nil {
		return nil, fmt.Errorf("read the embedded BPF object: %w", err)
	}
	var specs filterSpecs
	if err := spec.Assign(&specs); err != nil {
		return nil, err
	}
	cfg := abi.Config{FloodKey: key, LimitBuckets: uint32(limitBuckets(img)), DefaultAction: img.DefaultAction,
		UnparsedAction: img.UnparsedAction, MalformedAction: img.MalformedAction, NeedL4: b2u8(img.NeedL4)}
	copy(cfg.TreeRoots[:], img.Roots)
	v := &specs.filterVariableSpecs
	for _, set := range []struct {
		spec  *ebpf.VariableSpec
		value any
	}{
		{v.Cfg, cfg},
		{v.NumTrees, uint32(len(img.Roots))},
		{v.NeedSrcLookup, img.NeedSrc},
		{v.NeedDstLookup, img.NeedDst},
	} {
		if err := set.spec.Set(set.value); err != nil {
			return nil, fmt.Errorf("set %s: %w", set.spec.Name, err)
		}
	}
	m := &specs.filterMapSpecs
	ts := TableSpecs{V4Blocks: m.V4Blocks, V4Wide: m.V4Wide, V4Bitmaps: m.V4Bitmaps, V4Tbl8s: m.V4Tbl8s, V6Blocks: m.V6Blocks, V6Short: m.V6Short, V6Long: m.V6Long,
		Classes: m.Classes, V4Buckets: v.V4Buckets, V4WideBuckets: v.V4WideBuckets, V6Buckets: v.V6Buckets, V4BlockMul: v.V4BlockMul, V4WideMul: v.V4WideMul, V6BlockMul: v.V6BlockMul,
		V6ShortBuckets: v.V6ShortBuckets, V6LongBuckets: v.V6LongBuckets, V6ShortMul: v.V6ShortMul, V6LongMul: v.V6LongMul, V6HotLen: v.V6HotLen}
	if err := ts.Size(&img.Tables); err != nil {
		return nil, err
	}
	rules := max(1, len(img.Limits))
	for _, size := range []struct {
		spec *ebpf.MapSpec
		n    int
	}{
		{m.LimitSources, limitBuckets(img)}, {m.Rules, len(img.Rules)}, {m.Tree, (len(img.Tree) + 1) / 2}, {m.FieldEqs, (len(img.FieldEqs) + 1) / 2},
		{m.ClassEqs, len(img.ClassEqs)}, {m.Limits, rules}, {m.LimitState, rules}, {m.RuleEvents, rules}, {m.Counters, abi.SlotRule0 + rules},
	} {
		size.spec.MaxEntries = uint32(max(1, size.n))
	}
	o, err := loadParallel(spec, img.Syncookie)
	if err != nil {
		return nil, loadError(err)
	}
	if err := o.fill(img); err != nil {
		o.Close()
		return nil, err
	}
	return o, nil
}

// loadParallel creates the maps, then loads the programs over them each on
// a goroutine of its own: the verifier checks a program on the loading
// thread, and the programs' checks are most of an apply's time (0.11 s
// each here, against 0.02 s for every map). The SYN cookie check is loaded
// only for a policy that answers SYNs.
func loadParallel(spec *ebpf.CollectionSpec, syncookie bool) (*Objects, error) {
	coll, err := ebpf.NewCollection(&ebpf.CollectionSpec{Maps: spec.Maps, Variables: spec.Variables, Types: spec.Types, ByteOrder: spec.ByteOrder})
	if err != nil {
		return nil, err
	}
	defer coll.Close() // what Assign does not take: the data sections, which the programs hold
	o := &Objects{}
	progs := []struct {
		name string
		to   **ebpf.Program
	}{{filterProgRampartXdp, &o.RampartXdp}, {filterProgRampartTc, &o.RampartTc}}
	if syncookie {
		progs = append(progs, struct {
			name string
			to   **ebpf.Program
		}{filterProgRampartTcCookie, &o.RampartTcCookie})
	}
	errs := make([]error, len(progs))
	var wg sync.WaitGroup
	for i, p := range progs {
		wg.Go(func() {
			one := spec.Copy()
			for name := range one.Programs {
				if name != p.name {
					delete(one.Programs, name)
				}
			}
			c, err := ebpf.NewCollectionWithOptions(one, ebpf.CollectionOptions{MapReplacements: coll.Maps})
			if err != nil {
				errs[i] = err
				return
			}
			*p.to = c.DetachProgram(p.name)
			c.Close()
		})
	}
	wg.Wait()
	errs = append(errs, coll.Assign(&o.filterMaps))
	if err := errors.Join(errs...); err != nil {
		o.Close()
		return nil, err
	}
	return o, nil
}

// fill writes an image's rules, classifier and tables into fresh maps.
func (o *Objects) fill(img *compile.Image) error {
	for _, a := range []struct {
		m    *ebpf.Map
		data []byte
	}{
		{o.Rules, compile.AsBytes(img.Rules)}, {o.Tree, compile.AsBytes(img.Tree)}, {o.FieldEqs, compile.AsBytes(img.FieldEqs)},
		{o.ClassEqs, compile.AsBytes(img.ClassEqs)}, {o.Limits, compile.AsBytes(img.Limits)},
	} {
		if err := writeArray(a.m, a.data); err != nil {
			return fmt.Errorf("fill the rules: %w", err)
		}
	}
	if err := o.tables().Fill(&img.Tables); err != nil {
		return fmt.Errorf("fill the prefix-list tables: %w", err)
	}
	return o.addMaskEqs(img.OverlayV4, img.OverlayV6)
}

func b2u8(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// LimitSourceBuckets is the per-source limit table's size: 2^16 buckets of
// four schedules (4 MiB). A flood of random sources holds a schedule only
// while it is ahead of now: at 3 Mpps of sources limited to 200/s, some
// 15,000; the table keeps sources over their rate for far more.
const LimitSourceBuckets = 1 << 16

func limitBuckets(img *compile.Image) int {
	if img.PerSource {
		return LimitSourceBuckets
	}
	return 1
}

// loadError says what the kernel refused; a verifier log is given whole.
func loadError(err error) error {
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		return fmt.Errorf("the kernel's verifier rejected the program:\n%+v", ve)
	}
	return fmt.Errorf("load BPF objects: %w", err)
}

func (o *Objects) tables() TableMaps {
	return TableMaps{V4Blocks: o.V4Blocks, V4Wide: o.V4Wide, V4Bitmaps: o.V4Bitmaps, V4Tbl8s: o.V4Tbl8s, V6Blocks: o.V6Blocks, V6Short: o.V6Short, V6Long: o.V6Long,
		Classes: o.Classes, OverlayV4: o.OverlayV4, OverlayV6: o.OverlayV6, OverlayLengths: o.OverlayLengths}
}

// Close releases the file descriptors; pinned objects stay in the kernel.
func (o *Objects) Close() error {
	var errs []error
	for _, x := range o.objects() {
		if c := x.get(); c != nil {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// object is one program or map of a generation, under its name in bpf/.
type object struct {
	name     string
	prog     **ebpf.Program
	m        **ebpf.Map
	optional bool // loaded only for some policies
}

func (x object) get() interface {
	Pin(string) error
	Close() error
} {
	if x.prog != nil && *x.prog != nil {
		return *x.prog
	}
	if x.m != nil && *x.m != nil {
		return *x.m
	}
	return nil
}

// pin pins a duplicate of the object's descriptor: the object's own Pin
// moves a pin it already has (cilium/ebpf renames it), and one apply's
// objects are pinned once for every hook they go on.
func (x object) pin(path string) error {
	var dup interface {
		Pin(string) error
		Close() error
	}
	var err error
	if x.prog != nil {
		dup, err = (*x.prog).Clone()
	} else {
		dup, err = (*x.m).Clone()
	}
	if err != nil {
		return err
	}
	defer dup.Close()
	return dup.Pin(path)
}

// objects is the one list of what a generation pins, closes and opens again.
func (o *Objects) objects() []object {
	p := func(name string, x **ebpf.Program) object { return object{name: name, prog: x} }
	m := func(name string, x **ebpf.Map) object { return object{name: name, m: x} }
	return []object{
		p(filterProgRampartXdp, &o.RampartXdp), p(filterProgRampartTc, &o.RampartTc),
		{name: filterProgRampartTcCookie, prog: &o.RampartTcCookie, optional: true},
		m(filterMapCounters, &o.Counters), m(filterMapRuleEvents, &o.RuleEvents), m(filterMapLimitState, &o.LimitState), m(filterMapLimitSources, &o.LimitSources),
		m(filterMapLimits, &o.Limits), m(filterMapRules, &o.Rules), m(filterMapTree, &o.Tree), m(filterMapFieldEqs, &o.FieldEqs),
		m(filterMapClassEqs, &o.ClassEqs), m(filterMapMaskEqs, &o.MaskEqs),
		m(filterMapV4Blocks, &o.V4Blocks), m(filterMapV4Wide, &o.V4Wide), m(filterMapV4Bitmaps, &o.V4Bitmaps), m(filterMapV4Tbl8s, &o.V4Tbl8s),
		m(filterMapV6Blocks, &o.V6Blocks), m(filterMapV6Short, &o.V6Short), m(filterMapV6Long, &o.V6Long),
		m(filterMapClasses, &o.Classes), m(filterMapOverlayV4, &o.OverlayV4), m(filterMapOverlayV6, &o.OverlayV6),
		m(filterMapOverlayLengths, &o.OverlayLengths),
	}
}

// Pin places the objects in dir, which must not exist yet; on failure
// nothing is left.
func (o *Objects) Pin(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	for _, x := range o.objects() {
		if x.optional && x.get() == nil {
			continue
		}
		if err := x.pin(filepath.Join(dir, x.name)); err != nil {
			os.RemoveAll(dir)
			return fmt.Errorf("pin %s: %w", x.name, err)
		}
	}
	return nil
}

// LoadPinned opens the objects pinned in dir.
func LoadPinned(dir string) (*Objects, error) {
	o := &Objects{}
	for _, x := range o.objects() {
		var err error
		path := filepath.Join(dir, x.name)
		if x.prog != nil {
			*x.prog, err = ebpf.LoadPinnedProgram(path, nil)
		} else {
			*x.m, err = ebpf.LoadPinnedMap(path, nil)
		}
		if err != nil && !(x.optional && errors.Is(err, os.ErrNotExist)) {
			o.Close()
			return nil, fmt.Errorf("objects pinned in %s: %w", dir, err)
		}
	}
	return o, nil
}

// ReadEvents sums the per-CPU limit and cookie events of the first n rules.
func (o *Objects) ReadEvents(n int) ([]abi.RuleEvents, error) {
	return sumPerCPU(o.RuleEvents, n, func(to *abi.RuleEvents, e abi.RuleEvents) {
		to.Over += e.Over
		to.CookiesSent += e.CookiesSent
		to.CookiesOk += e.CookiesOk
		to.CookiesBad += e.CookiesBad
	})
}

// ReadCounters sums the per-CPU counters of the first n slots.
func (o *Objects) ReadCounters(n int) ([]abi.Counter, error) {
	return sumPerCPU(o.Counters, n, func(to *abi.Counter, c abi.Counter) {
		to.Packets += c.Packets
		to.Bytes += c.Bytes
	})
}

// sumPerCPU reads the first n elements of a per-CPU array (fewer if it has
// fewer), each summed over the CPUs with add, in batches: a policy of
// 100,000 rules is read in a few system calls, not one per rule.
func sumPerCPU[T any](m *ebpf.Map, n int, add func(*T, T)) ([]T, error) {
	n = min(n, int(m.MaxEntries()))
	out := make([]T, n)
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, err
	}
	batch := min(4096, max(1, n))
	keys := make([]uint32, batch)
	vals := make([]T, batch*cpus)
	var cursor ebpf.MapBatchCursor
	for done := 0; done < n; {
		got, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := range got {
			if k := int(keys[i]); k < n {
				for c := range cpus {
					add(&out[k], vals[i*cpus+c])
				}
			}
		}
		done += got
		if errors.Is(err, ebpf.ErrKeyNotExist) || got == 0 {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", m, err)
		}
	}
	return out, nil
}

// TablesMemlock is the kernel memory (memlock) of the prefix-list maps.
func (o *Objects) TablesMemlock() uint64 { return o.tables().Memlock() }

// SumPerCPU adds up slot 0 of a per-CPU array of u64 counters.
func SumPerCPU(m *ebpf.Map) (uint64, error) {
	sum, err := sumPerCPU(m, 1, func(to *uint64, v uint64) { *to += v })
	if err != nil || len(sum) == 0 {
		return 0, err
	}
	return sum[0], nil
}

// PinnedPrograms returns the IDs of the programs pinned in dir (a
// generation's), so that a link's program can be matched to its generation.
func PinnedPrograms(dir string) []ebpf.ProgramID {
	var ids []ebpf.ProgramID
	for _, name := range []string{filterProgRampartXdp, filterProgRampartTc, filterProgRampartTcCookie} {
		p, err := ebpf.LoadPinnedProgram(filepath.Join(dir, name), nil)
		if err != nil {
			continue
		}
		if info, err := p.Info(); err == nil {
			if id, ok := info.ID(); ok {
				ids = append(ids, id)
			}
		}
		p.Close()
	}
	return ids
}

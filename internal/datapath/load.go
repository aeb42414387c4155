// Package datapath holds rampart's kernel objects: it loads the filter built
// from an image (through bpf2go's generated objects), fills its maps, pins
// it, attaches and swaps it on interfaces, and reads its counters. Where
// objects are pinned and what state says about them belongs to
// internal/engine.
package datapath

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

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

// Objects is one generation of a policy: its own maps (genMaps), over the
// programs and outer maps of its shape, which generations share. An XDP and
// a tc program run over them, so that `auto` can fall back from XDP to tc
// without loading lists twice.
type Objects struct {
	filterPrograms
	shape filterMaps // the outer maps, live, and the programs' scratch
	genMaps
	pins string // the directory LoadPinned opened them from
}

// genMaps are a generation's maps (bpf/lists.h's GEN_MAP): what an apply
// fills, then swaps in under the loaded programs.
type genMaps struct {
	Configs, Rules, Tree, FieldEqs, ClassEqs, MaskEqs, Counters, RuleEvents, Limits, LimitState, LimitSources    *ebpf.Map
	V4Blocks, V4Wide, V4Dense, V4Tbl8s, V6Blocks, V6Short, V6Long, Classes, OverlayV4, OverlayV6, OverlayLengths *ebpf.Map
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

// kernelTick is the kernel's tick in ns, the coarse clock's resolution:
// the programs' clock is jiffies times it (bpf/flood.h's clock_ns).
func kernelTick() (uint64, error) {
	var res unix.Timespec
	if err := unix.ClockGetres(unix.CLOCK_MONOTONIC_COARSE, &res); err != nil {
		return 0, fmt.Errorf("read the kernel's tick (the coarse clock's resolution): %w", err)
	}
	return checkTick(res.Nano())
}

// checkTick refuses a tick no kernel has: one of 100 to 1000 Hz (the
// compiler's limits allow a tick of 10 ms at most).
func checkTick(ns int64) (uint64, error) {
	if ns < 1e6 || ns > 1e7 {
		return 0, fmt.Errorf("the kernel's tick (the coarse clock's resolution) is %d ns: not a tick of 100-1000 Hz", ns)
	}
	return uint64(ns), nil
}

// LoadKeyed is Load under a given flood key: a re-apply keeps the last
// one, so that the ACK to a SYN-ACK the old program sent still proves its
// cookie to the new one. The program's shape fits img with room to grow:
// LoadOver fills later policies into it without loading a program.
func LoadKeyed(img *compile.Image, key [2]uint64) (*Objects, error) {
	caps := map[string]uint32{}
	for name, n := range genSizes(img) {
		caps[name] = shapeCapacity(name, n, img)
	}
	spec, err := filterSpec(img, true, caps, nil)
	if err != nil {
		return nil, err
	}
	if err := spec.Variables["flood_key"].Set(key); err != nil {
		return nil, fmt.Errorf("set the flood key: %w", err)
	}
	rows := b2u8(img.RowWords > 0)
	if err := spec.Variables["static_rows"].Set(rows); err != nil {
		return nil, fmt.Errorf("set the rows' check: %w", err)
	}
	tick, err := kernelTick()
	if err != nil {
		return nil, err
	}
	if err := spec.Variables["tick_ns"].Set(tick); err != nil {
		return nil, fmt.Errorf("set the clock's tick: %w", err)
	}
	// The generation's maps come first: each outer map takes its
	// generation's map as the template of the maps it holds (outerMap).
	o := &Objects{}
	if err := o.makeGeneration(spec, nil); err != nil {
		o.Close()
		return nil, err
	}
	if err := o.loadParallel(spec, img.Syncookie); err != nil {
		o.Close()
		return nil, loadError(err)
	}
	if err := o.shape.Live.Put(uint32(0), abi.Live{Object: objectID(), StaticRows: rows}); err != nil {
		o.Close()
		return nil, fmt.Errorf("write the live generation: %w", err)
	}
	if err := o.fillGeneration(img); err != nil {
		o.Close()
		return nil, err
	}
	return o, nil
}

// LoadOver fills img into a new generation of shape's programs, when it
// fits their shape: no program is loaded or verified. The generation is
// not live until Activate. fits is false (and nothing made) when img needs
// a program of another shape (tables past their capacity or far below it,
// SYN cookies or static lists' rows added or removed) or the programs are
// another build's. The generation takes what it can of spare (nil: none),
// made from shape.
func LoadOver(shape *Objects, img *compile.Image, spare *Spare) (o *Objects, fits bool, err error) {
	live, ok := shape.loaded()
	if !ok || live.Object != objectID() {
		return nil, false, nil // another release's program: its code goes with it
	}
	if img.Syncookie != (shape.RampartTcCookie != nil) || (img.RowWords > 0) != (live.StaticRows != 0) {
		return nil, false, nil
	}
	need := genSizes(img)
	caps := map[string]uint32{}
	for _, g := range shape.generation() {
		n, sized := need[g.name]
		if !sized {
			continue
		}
		have := (*g.inner).MaxEntries()
		if uint32(max(1, n)) > have || oversized(have, shapeCapacity(g.name, n, img), (*g.inner).ValueSize()) {
			return nil, false, nil
		}
		caps[g.name] = have
	}
	spec, err := filterSpec(img, false, caps, spare)
	if err != nil {
		return nil, false, err
	}
	o = &Objects{}
	if err := shape.shareShape(o); err != nil {
		return nil, true, err
	}
	if err := o.newGeneration(spec, img, spare); err != nil {
		o.Close()
		return nil, true, err
	}
	return o, true, nil
}

// loaded is what the shape's live map says of how its programs were
// loaded (the object, whether they read static lists' rows); false for
// an earlier release's programs, which have no such map.
func (o *Objects) loaded() (abi.Live, bool) {
	var live abi.Live
	ok := o.shape.Live != nil && o.shape.Live.Lookup(uint32(0), &live) == nil
	return live, ok
}

// ours reports whether o's programs come from this build's object.
func (o *Objects) ours() bool {
	live, ok := o.loaded()
	return ok && live.Object == objectID()
}

// objectID names the embedded filter object: a hash of its bytes, kept in
// the live map of every program loaded from it.
var objectID = sync.OnceValue(func() uint64 {
	sum := sha256.Sum256(_FilterBytes)
	return binary.LittleEndian.Uint64(sum[:8])
})

// filterSpec is a copy of the embedded filter's spec, once img is known to
// fit the kernel's limits and memory (less what spare maps for it hold
// already): of its maps alone without programs, all a new generation of
// loaded programs needs (copying the programs' instructions too took 3
// ms). Its overlay tables are sized for img's (overlayCapacity), the maps
// in caps to their capacity there.
func filterSpec(img *compile.Image, programs bool, caps map[string]uint32, spare *Spare) (*ebpf.CollectionSpec, error) {
	if len(img.Rules) > abi.MaxRules {
		return nil, fmt.Errorf("%d rules: at most %d", len(img.Rules), abi.MaxRules)
	}
	spec, err := parsedFilter()
	if err != nil {
		return nil, fmt.Errorf("read the embedded BPF object: %w", err)
	}
	most := [2]uint32{spec.Maps[filterMapOverlayV4].InnerMap.MaxEntries, spec.Maps[filterMapOverlayV6].InnerMap.MaxEntries}
	if programs {
		spec = spec.Copy()
	} else {
		maps := &ebpf.CollectionSpec{Maps: make(map[string]*ebpf.MapSpec, len(spec.Maps))}
		for name, m := range spec.Maps {
			maps.Maps[name] = m.Copy()
		}
		spec = maps
	}
	spec.Maps[filterMapOverlayV4].InnerMap.MaxEntries = overlayCapacity(len(img.OverlayV4), most[0])
	spec.Maps[filterMapOverlayV6].InnerMap.MaxEntries = overlayCapacity(len(img.OverlayV6), most[1])
	for name, n := range caps {
		spec.Maps[name].InnerMap.MaxEntries = n
	}
	need := img.KernelBytes()
	if err := CheckMemory(need - min(need, spare.ready(spec))); err != nil {
		return nil, err
	}
	return spec, nil
}

// parsedFilter is the embedded object, parsed once: a service would parse
// it again at every reload (6-7 ms of CPU). Callers change copies of it.
var parsedFilter = sync.OnceValues(loadFilter)

// ParseAhead parses the embedded object on a goroutine, so that a command
// about to apply a policy has it parsed (6-8 ms) while it reads the policy.
func ParseAhead() { go parsedFilter() }

// genSizes are the entries img needs in each of a generation's maps that
// is sized to its policy; the others keep their size in bpf/.
func genSizes(img *compile.Image) map[string]int {
	rules := max(1, len(img.Limits))
	sizes := tableSizes(&img.Tables)
	for name, n := range map[string]int{
		filterMapRules: len(img.Rules), filterMapTree: (len(img.Tree) + 1) / 2, filterMapFieldEqs: (len(img.FieldEqs) + 1) / 2,
		filterMapClassEqs: len(img.ClassEqs), filterMapLimits: rules, filterMapLimitState: rules, filterMapRuleEvents: rules,
		filterMapCounters: abi.SlotRule0 + rules, filterMapLimitSources: limitBuckets(img),
	} {
		sizes[name] = n
	}
	return sizes
}

// oversized reports whether a map of have entries of size bytes is far
// past the capacity a new shape would give it, and big enough to matter: a
// list cut from ten million entries to ten gets tables of its size back.
func oversized(have, want, size uint32) bool {
	return have > 4*want && uint64(have)*uint64(size) >= 1<<20
}

// roomPerRule is how many entries of a map a feed's rule may take, about:
// FlowSpec routes of a prefix or two each, in trees of a few dozen words a
// rule (bench rules' 10,000-rule feed).
var roomPerRule = map[string]int{
	filterMapRules: 1, filterMapCounters: 1, filterMapLimits: 1, filterMapLimitState: 1, filterMapRuleEvents: 1,
	filterMapTree: 32, filterMapClassEqs: 2, filterMapClasses: 2, filterMapV4Blocks: 1, filterMapV6Blocks: 1, filterMapV6Short: 1, filterMapV6Long: 1,
}

// shapeCapacity is what a new shape for img gives the map of that name,
// which img fills n entries of.
func shapeCapacity(name string, n int, img *compile.Image) uint32 {
	return capacity(n + img.Room*roomPerRule[name])
}

// capacity is what a shape gives a map of n entries: a quarter more, and
// 64 at least, so that the next changes fit it, rounded up to an eighth of
// a power of two, so that a map wastes little.
func capacity(n int) uint32 {
	c := max(64, n+n/4)
	step := 1
	for step*16 <= c {
		step *= 2
	}
	return uint32((c + step - 1) / step * step)
}

// newGeneration creates o's own maps from spec's inner maps, or takes
// them from spare, and fills them with img, then makes them its shape's
// live generation if that has none (a program just loaded).
func (o *Objects) newGeneration(spec *ebpf.CollectionSpec, img *compile.Image, spare *Spare) error {
	if err := o.makeGeneration(spec, spare); err != nil {
		return err
	}
	return o.fillGeneration(img)
}

// makeGeneration creates o's own maps from spec's inner maps, or takes
// them from spare.
func (o *Objects) makeGeneration(spec *ebpf.CollectionSpec, spare *Spare) error {
	// The kernel allocates and zeroes every element of a map it creates:
	// a 10,000-rule policy's per-CPU counters took 12-16 ms each, the
	// overlays' hash tables 9 ms each, one after another (strace -T).
	// Created at once, they take every CPU.
	gens := o.generation()
	errs := make([]error, len(gens))
	var wg sync.WaitGroup
	for i, g := range gens {
		wg.Go(func() {
			if *g.inner = spare.take(g.name, spec.Maps[g.name].InnerMap); *g.inner != nil {
				return
			}
			m, err := ebpf.NewMap(spec.Maps[g.name].InnerMap)
			if err != nil {
				errs[i] = fmt.Errorf("create %s: %w", g.name, err)
				return
			}
			*g.inner = m
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// fillGeneration fills o's own maps with img, then makes them its shape's
// live generation if that has none (a program just loaded).
func (o *Objects) fillGeneration(img *compile.Image) error {
	if err := o.fill(img); err != nil {
		return err
	}
	if live, _, err := o.liveSlot(); err != nil || live >= 0 {
		return err
	}
	return o.Activate()
}

// loadParallel creates o's shape's maps (the outer ones over o's own
// generation, made before), then loads the programs over them each on a
// goroutine of its own: the verifier checks a program on the loading
// thread, and the programs' checks are most of an apply's time (0.11 s
// each here, against 0.02 s for every map). The SYN cookie check is loaded
// only for a policy that answers SYNs.
func (o *Objects) loadParallel(spec *ebpf.CollectionSpec, syncookie bool) error {
	outers := map[string]*ebpf.Map{}
	defer func() {
		for _, m := range outers {
			m.Close() // the collection holds clones
		}
	}()
	for _, g := range o.generation() {
		m, err := outerMap(spec.Maps[g.name], *g.inner)
		if err != nil {
			return fmt.Errorf("create %s: %w", g.name, err)
		}
		outers[g.name] = m
	}
	coll, err := ebpf.NewCollectionWithOptions(&ebpf.CollectionSpec{Maps: spec.Maps, Variables: spec.Variables, Types: spec.Types, ByteOrder: spec.ByteOrder},
		ebpf.CollectionOptions{MapReplacements: outers})
	if err != nil {
		return err
	}
	defer coll.Close() // what Assign does not take: the data sections, which the programs hold
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
	errs = append(errs, coll.Assign(&o.shape))
	return errors.Join(errs...)
}

// outerMap creates the array of maps of spec with inner as the template of
// the maps it holds. cilium/ebpf's NewMap makes a template of its own from
// the spec and takes none from outside: as big as the maps it will hold,
// that was a second allocation and zeroing of every table in a new shape
// (604 MB for ten million /128s, 0.1-1.5 s here).
func outerMap(spec *ebpf.MapSpec, inner *ebpf.Map) (*ebpf.Map, error) {
	attr := struct {
		mapType, keySize, valueSize, maxEntries, mapFlags, innerMapFD, numaNode uint32
		name                                                                    [unix.BPF_OBJ_NAME_LEN]byte
	}{uint32(spec.Type), spec.KeySize, spec.ValueSize, spec.MaxEntries, spec.Flags, uint32(inner.FD()), 0, [unix.BPF_OBJ_NAME_LEN]byte{}}
	copy(attr.name[:unix.BPF_OBJ_NAME_LEN-1], spec.Name)
	fd, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_MAP_CREATE, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	if errno != 0 {
		return nil, errno
	}
	return ebpf.NewMapFromFD(int(fd))
}

// fill writes an image's settings, rules, classifier and tables into the
// generation's fresh maps.
func (o *Objects) fill(img *compile.Image) error {
	cfg := abi.Config{Lists: listParams(&img.Tables), LimitBuckets: uint32(limitBuckets(img)), DefaultAction: img.DefaultAction,
		UnparsedAction: img.UnparsedAction, MalformedAction: img.MalformedAction, NeedL4: b2u8(img.NeedL4), NeedSrc: b2u8(img.NeedSrc),
		NeedDst: b2u8(img.NeedDst), NumTrees: uint32(len(img.Roots)), RowWords: img.RowWords, SetsBase: img.SetsBase}
	copy(cfg.TreeRoots[:], img.Roots)
	if err := o.Configs.Put(uint32(0), cfg); err != nil {
		return fmt.Errorf("write the settings: %w", err)
	}
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
	return TableMaps{V4Blocks: o.V4Blocks, V4Wide: o.V4Wide, V4Dense: o.V4Dense, V4Tbl8s: o.V4Tbl8s, V6Blocks: o.V6Blocks, V6Short: o.V6Short, V6Long: o.V6Long,
		Classes: o.Classes, OverlayV4: o.OverlayV4, OverlayV6: o.OverlayV6, OverlayLengths: o.OverlayLengths}
}

// Close releases the file descriptors; pinned objects stay in the kernel.
// A nil o has none.
func (o *Objects) Close() error {
	if o == nil {
		return nil
	}
	var errs []error
	if o.shape.CookieScratch != nil { // the programs' own: never pinned
		errs = append(errs, o.shape.CookieScratch.Close())
	}
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
	// Not in a generation an earlier release pinned, whose programs had
	// maps of their own: live, the outer maps, the settings' map.
	generational bool
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

// genMap is one of a generation's maps: its name in bpf/, the outer map
// of the shape that holds it, and its own.
type genMap struct {
	name         string
	outer, inner **ebpf.Map
}

// generation is the one list of a generation's maps.
func (o *Objects) generation() []genMap {
	s, g := &o.shape, &o.genMaps
	return []genMap{
		{filterMapConfigs, &s.Configs, &g.Configs}, {filterMapRules, &s.Rules, &g.Rules}, {filterMapTree, &s.Tree, &g.Tree},
		{filterMapFieldEqs, &s.FieldEqs, &g.FieldEqs}, {filterMapClassEqs, &s.ClassEqs, &g.ClassEqs}, {filterMapMaskEqs, &s.MaskEqs, &g.MaskEqs},
		{filterMapCounters, &s.Counters, &g.Counters}, {filterMapRuleEvents, &s.RuleEvents, &g.RuleEvents}, {filterMapLimits, &s.Limits, &g.Limits},
		{filterMapLimitState, &s.LimitState, &g.LimitState}, {filterMapLimitSources, &s.LimitSources, &g.LimitSources},
		{filterMapV4Blocks, &s.V4Blocks, &g.V4Blocks}, {filterMapV4Wide, &s.V4Wide, &g.V4Wide}, {filterMapV4Dense, &s.V4Dense, &g.V4Dense},
		{filterMapV4Tbl8s, &s.V4Tbl8s, &g.V4Tbl8s}, {filterMapV6Blocks, &s.V6Blocks, &g.V6Blocks}, {filterMapV6Short, &s.V6Short, &g.V6Short},
		{filterMapV6Long, &s.V6Long, &g.V6Long}, {filterMapClasses, &s.Classes, &g.Classes}, {filterMapOverlayV4, &s.OverlayV4, &g.OverlayV4},
		{filterMapOverlayV6, &s.OverlayV6, &g.OverlayV6}, {filterMapOverlayLengths, &s.OverlayLengths, &g.OverlayLengths},
	}
}

// outerPin is where a generation's directory pins the outer map of a map
// of its.
func outerPin(name string) string { return name + "_gens" } // bpffs refuses names with a dot

// objects is the one list of what a generation pins, closes and opens
// again: the shape's programs, live and outer maps, and its own maps.
func (o *Objects) objects() []object {
	p := func(name string, x **ebpf.Program) object { return object{name: name, prog: x} }
	list := []object{
		p(filterProgRampartXdp, &o.RampartXdp), p(filterProgRampartTc, &o.RampartTc),
		{name: filterProgRampartTcCookie, prog: &o.RampartTcCookie, optional: true},
		{name: filterMapLive, m: &o.shape.Live, generational: true},
	}
	for _, g := range o.generation() {
		list = append(list, object{name: outerPin(g.name), m: g.outer, generational: true},
			object{name: g.name, m: g.inner, generational: g.name == filterMapConfigs})
	}
	return list
}

// shareShape gives to duplicates of o's programs and outer maps: a new
// generation of the same shape.
func (o *Objects) shareShape(to *Objects) error {
	var errs []error
	dupProg := func(to **ebpf.Program, p *ebpf.Program) {
		if p != nil {
			var err error
			*to, err = p.Clone()
			errs = append(errs, err)
		}
	}
	dupMap := func(to **ebpf.Map, m *ebpf.Map) {
		var err error
		*to, err = m.Clone()
		errs = append(errs, err)
	}
	dupProg(&to.RampartXdp, o.RampartXdp)
	dupProg(&to.RampartTc, o.RampartTc)
	dupProg(&to.RampartTcCookie, o.RampartTcCookie)
	dupMap(&to.shape.Live, o.shape.Live)
	for i, g := range o.generation() {
		dupMap(to.generation()[i].outer, *g.outer)
	}
	if err := errors.Join(errs...); err != nil {
		to.Close()
		return err
	}
	return nil
}

// liveSlot is the slot of the shape's outer maps frames read (-1 when no
// generation was ever made live there) and the ID of the settings map in
// it.
func (o *Objects) liveSlot() (int, ebpf.MapID, error) {
	var live abi.Live
	if err := o.shape.Live.Lookup(uint32(0), &live); err != nil {
		return 0, 0, fmt.Errorf("read the live generation: %w", err)
	}
	var id ebpf.MapID
	if err := o.shape.Configs.Lookup(live.Gen&1, &id); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return -1, 0, nil
		}
		return 0, 0, fmt.Errorf("read the live generation: %w", err)
	}
	return int(live.Gen & 1), id, nil
}

// IsLive reports whether o's maps are those its programs read.
func (o *Objects) IsLive() (bool, error) {
	if o.shape.Live == nil {
		return true, nil // an earlier release's: its programs have maps of their own
	}
	_, id, err := o.liveSlot()
	if err != nil || id == 0 {
		return false, err
	}
	own, err := mapID(o.Configs)
	return err == nil && id == own, err
}

// Activate makes o's maps those its programs read, at once for every
// frame: they go into the slot no frame reads, then live flips to it.
// Frames already running finish on the generation they started with; once
// they have (an RCU grace period), the other slot is emptied, so that the
// old generation's memory goes with its pins. On an error o is not live:
// the generation before it is.
func (o *Objects) Activate() error {
	if live, err := o.IsLive(); err != nil || live {
		return err
	}
	// In a slot still (an activation cut short), its overlay tables may
	// have grown there past those o was opened with: the slot's are put
	// back (a pin not put right is on the next write).
	if _, err := o.readSlotOverlays(); err != nil {
		return err
	}
	cur, _, err := o.liveSlot()
	if err != nil {
		return err
	}
	next := uint32(0)
	if cur == 0 {
		next = 1
	}
	gens := o.generation()
	var id ebpf.MapID
	if (*gens[0].outer).Lookup(next, &id) == nil {
		// Left by an activation that did not finish: frames that read it
		// before it was live must be done with it.
		if err := o.graceperiod(next); err != nil {
			return err
		}
	}
	// The settings say their slot: in_row, a global function the
	// verifier checks once, has the generation through them. (An older
	// build's programs do not read it, and its settings may be smaller.)
	if o.ours() {
		var cfg abi.Config
		err := o.Configs.Lookup(uint32(0), &cfg)
		if cfg.Gen = next; err == nil {
			err = o.Configs.Put(uint32(0), cfg)
		}
		if err != nil {
			return fmt.Errorf("write the generation's slot into its settings: %w", err)
		}
	}
	if err := changeOuter(gens, next, true); err != nil {
		return fmt.Errorf("install the generation's maps: %w", err)
	}
	if err := o.setLive(next); err != nil {
		return err
	}
	if cur < 0 {
		return nil
	}
	if err := o.graceperiod(next); err != nil {
		// The last generation is whole still: it stays live.
		return errors.Join(err, o.setLive(uint32(cur)))
	}
	// What a failed delete leaves, the next activation replaces.
	changeOuter(gens, uint32(cur), false)
	return nil
}

// setLive points frames at slot gen, keeping the program's build.
func (o *Objects) setLive(gen uint32) error {
	var live abi.Live
	err := o.shape.Live.Lookup(uint32(0), &live)
	if err == nil {
		live.Gen = gen
		err = o.shape.Live.Put(uint32(0), live)
	}
	if err != nil {
		return fmt.Errorf("make generation slot %d live: %w", gen, err)
	}
	return nil
}

// graceperiod waits until every BPF program running now has returned, the
// way the kernel offers: after an update of an array of maps it waits for
// an RCU grace period (maybe_wait_bpf_programs), within which XDP and tc
// programs run, so that its caller knows no program still sees the old
// element. The update puts the settings map in slot where it is: frames
// see no change. (membarrier's global command waits likewise, but not on a
// kernel booted with nohz_full, nor on one CPU.)
func (o *Objects) graceperiod(slot uint32) error {
	var id ebpf.MapID
	err := o.shape.Configs.Lookup(slot, &id)
	if err == nil {
		var m *ebpf.Map
		if m, err = ebpf.NewMapFromID(id); err == nil {
			err = o.shape.Configs.Put(slot, m)
			m.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("wait for the programs running on the last generation: %w", err)
	}
	return nil
}

// changeOuter puts every generation map into slot of its outer map (put),
// or empties the slot, and returns once every outer map shows the change.
// The kernel waits for an RCU grace period after every change of an array
// of maps (8-20 ms here), so that the caller knows no program still sees
// the old element; these changes need no such wait (the slot put is not
// live yet; the frames of the slot emptied were waited for before), so
// the waits pass in the background, on duplicates of the descriptors that
// the caller may close meanwhile. In a row, three such waits were most of
// a flip; 22 changes one after another took 0.4 s.
//
// A goroutine blocked in a system call keeps its P until the runtime's
// monitor takes it back, which in a process idle for a millisecond sleeps
// up to 10 ms between looks: with the changes holding every P, the caller
// waited 3-60 ms for the puts to start and for a CPU after the deletes.
// The changes get Ps of their own (lendProcs) until the last returns.
func changeOuter(gens []genMap, slot uint32, put bool) error {
	type change struct {
		g            genMap
		outer, inner *ebpf.Map // duplicates, the goroutine's own
		want         ebpf.MapID
		done         chan error
	}
	var changes []change
	drop := func() {
		for _, c := range changes {
			c.outer.Close()
			c.inner.Close()
		}
	}
	// Every descriptor is duplicated before any change starts, so that a
	// failure leaves nothing changing behind the caller's back; a slot
	// already as wanted gets no change, so that a change seen is this
	// call's own.
	for _, g := range gens {
		c := change{g: g, done: make(chan error, 1)}
		var err error
		if put {
			c.want, err = mapID(*g.inner)
		}
		if err == nil && shows(g, slot, c.want, put) {
			continue
		}
		if err == nil {
			c.outer, err = (*g.outer).Clone()
		}
		if err == nil && put {
			c.inner, err = (*g.inner).Clone()
		}
		if err != nil {
			drop()
			return errors.Join(err, c.outer.Close())
		}
		changes = append(changes, c)
	}
	if len(changes) == 0 {
		return nil
	}
	var blocked sync.WaitGroup
	giveBack := lendProcs(len(changes))
	for _, c := range changes {
		blocked.Go(func() {
			defer c.outer.Close()
			defer c.inner.Close()
			if put {
				c.done <- c.outer.Put(slot, c.inner)
			} else {
				c.done <- c.outer.Delete(slot)
			}
		})
	}
	go func() {
		blocked.Wait()
		giveBack()
	}()
	var errs []error
	for _, c := range changes {
		errs = append(errs, awaitChange(c.g, slot, c.want, put, c.done))
	}
	return errors.Join(errs...)
}

// lent counts the Ps lendProcs has added to GOMAXPROCS and not yet given
// back.
var lent struct {
	sync.Mutex
	n int
}

// lendProcs adds n Ps for goroutines about to block in the kernel, and
// returns the function that takes them back. What it costs: changing
// GOMAXPROCS stops the world, after a collection under way if there is one
// (the flip's puts took 2-12 ms with it, 3-62 ms without); while lent, a
// collection gets more mark workers than there are CPUs; a change that
// never returns from the kernel keeps its P. Given back, GOMAXPROCS is the
// runtime's default again (following the CPU limit), unless the
// environment sets it.
func lendProcs(n int) (giveBack func()) {
	lent.Lock()
	defer lent.Unlock()
	runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + n)
	lent.n += n
	return func() {
		lent.Lock()
		defer lent.Unlock()
		lent.n -= n
		if lent.n == 0 && os.Getenv("GOMAXPROCS") == "" {
			runtime.SetDefaultGOMAXPROCS() // which also keeps following the CPU limit
			return
		}
		runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) - n)
	}
}

// shows: g's outer map holds want in slot (put), or nothing there.
func shows(g genMap, slot uint32, want ebpf.MapID, put bool) bool {
	var id ebpf.MapID
	err := (*g.outer).Lookup(slot, &id)
	return put && err == nil && id == want || !put && errors.Is(err, ebpf.ErrKeyNotExist)
}

// awaitChange returns once g's outer map shows the change (slot holds want,
// or is empty), or the change failed (done).
func awaitChange(g genMap, slot uint32, want ebpf.MapID, put bool, done <-chan error) error {
	for finished := false; !shows(g, slot, want, put); {
		if finished {
			return fmt.Errorf("%s: slot %d is not as it was just made", g.name, slot)
		}
		select {
		case err := <-done:
			if err != nil {
				return err
			}
			finished = true
		case <-time.After(20 * time.Microsecond):
		}
	}
	return nil
}

// mapID is the kernel's id of m.
func mapID(m *ebpf.Map) (ebpf.MapID, error) {
	info, err := m.Info()
	if err != nil {
		return 0, err
	}
	id, _ := info.ID()
	return id, nil
}

// programID is a program's ID, from its fdinfo: cilium/ebpf's
// Program.Info copies the program's instructions out of the kernel too
// (the filter's are 80 KB translated and 42 KB jited), 1-2 ms a call, where
// an apply and a status look up every generation's programs for their IDs.
func programID(p *ebpf.Program) (ebpf.ProgramID, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", p.FD()))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "prog_id:"); ok {
			id, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
			return ebpf.ProgramID(id), err
		}
	}
	return 0, fmt.Errorf("%s: no prog_id in its fdinfo", p)
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
	o := &Objects{pins: dir}
	_, err := os.Stat(filepath.Join(dir, filterMapLive))
	legacy := errors.Is(err, os.ErrNotExist)
	for _, x := range o.objects() {
		if legacy && x.generational {
			continue
		}
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

// Memlock is the kernel memory (memlock) of every map the objects pin:
// their generation's own and the outer maps holding them.
func (o *Objects) Memlock() uint64 {
	var n uint64
	for _, x := range o.objects() {
		if x.m != nil && *x.m != nil {
			n += Memlock(*x.m)
		}
	}
	return n
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

// PinnedLive reports whether the generation pinned in dir is the one its
// programs read. A generation an earlier release pinned, with programs of
// its own, always is.
func PinnedLive(dir string) bool {
	if _, err := os.Stat(filepath.Join(dir, filterMapLive)); errors.Is(err, os.ErrNotExist) {
		return true
	}
	o := &Objects{}
	defer o.Close()
	for _, p := range []struct {
		name string
		m    **ebpf.Map
	}{{filterMapLive, &o.shape.Live}, {outerPin(filterMapConfigs), &o.shape.Configs}, {filterMapConfigs, &o.Configs}} {
		var err error
		if *p.m, err = ebpf.LoadPinnedMap(filepath.Join(dir, p.name), nil); err != nil {
			return false
		}
	}
	live, err := o.IsLive()
	return err == nil && live
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
		if id, err := programID(p); err == nil {
			ids = append(ids, id)
		}
		p.Close()
	}
	return ids
}

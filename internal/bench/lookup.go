// Package bench measures the per-packet cost of prefix-list lookups through
// BPF_PROG_TEST_RUN: rampart's tables beside the kernel's LPM trie and the
// steps every lookup pays for (a bare drop, parsing, a random source).
package bench

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/compile"
	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/packet"
	"github.com/rampart-fw/rampart/internal/policy"
)

// Structures, in the order each adds to the one before.
const (
	XDPDrop   = "xdp-drop"
	Parse     = "parse"
	Baseline  = "baseline"
	OneRead   = "one-read" // one dependent random read from an array of rampart's table bytes
	KernelLPM = "kernel-lpm"
	Rampart   = "rampart"
)

// Mixes of prefix lengths. IPv6 draws them in 2000::/3 with the lengths in
// brackets.
const (
	MixEgress   = "egress"   // the egress study's: /24 10% [/64], /16 1% [/48], the rest /32 [/128]
	MixRandom32 = "random32" // all host prefixes, /32 [/128]
	MixNetworks = "networks" // reputation lists of networks: /16–/24 [/19–/64] and 15% hosts
	MixFlood    = "flood"    // lab drop's sources: hosts of 10.0.0.0/8 [/64s of fd10::/32], ~16 a /24 at 1M
)

// Traffic kinds: where the sources come from.
const (
	TrafficUniform = "uniform" // random addresses (IPv6: in 2000::/3): mostly misses
	TrafficListed  = "listed"  // addresses inside the listed prefixes: a flood from listed sources
)

// Options choose what to measure.
type Options struct {
	Families []int
	Mixes    []string
	Sizes    []int
	Traffic  []string
	Repeat   int // packets per run (BPF_PROG_TEST_RUN repeat)
	Runs     int // runs per measurement; the median is reported
	// NoKernelLPM leaves the kernel's trie out: past ~89M prefixes it cannot
	// be loaded, and loading it takes minutes well before.
	NoKernelLPM bool
	// Progress, if set, hears what is being done.
	Progress func(msg string)
}

// Result is one row: one structure at one list size under one traffic.
type Result struct {
	Structure   string  `json:"structure"`
	Family      int     `json:"family"`
	Mix         string  `json:"mix"`
	Size        int     `json:"size"`
	Traffic     string  `json:"traffic"`
	NsPerPacket float64 `json:"ns_per_packet"` // median over runs
	NsMin       float64 `json:"ns_min"`
	NsMax       float64 `json:"ns_max"`
	// VsBaseline is ns_per_packet over the baseline's in the same run, and
	// VsOneRead over the one-read row's.
	VsBaseline float64 `json:"vs_baseline"`
	VsOneRead  float64 `json:"vs_one_read"`
	// HitRate is the share of sources found in the list (lookups only).
	HitRate *float64 `json:"hit_rate,omitempty"`
	// Reads and Pages are the mean dependent memory reads (reads issued
	// together count once) and distinct 4 KiB pages a lookup touches, where they can be counted (rampart's
	// from compile.Tables.Lookup over the run's sources).
	Reads *float64 `json:"reads_per_lookup,omitempty"`
	Pages *float64 `json:"pages_per_lookup,omitempty"`
	// LoadSeconds is the time from prefixes in memory to a loaded, filled map
	// (lookups only); BytesPerPrefix the kernel memory (memlock) per prefix.
	LoadSeconds    *float64 `json:"load_seconds"`
	BytesPerPrefix *float64 `json:"bytes_per_prefix"`
	KernelBytes    uint64   `json:"kernel_bytes,omitempty"`
	Error          string   `json:"error,omitempty"`
}

// sourceCount is the number of sources a run cycles through: a power of two.
const sourceCount = 1 << 18

// Lookup runs every structure for every family, mix, size and traffic.
func Lookup(o Options) ([]Result, error) {
	var out []Result
	for _, fam := range o.Families {
		for _, mix := range o.Mixes {
			for _, size := range o.Sizes {
				rows, err := lookupOne(o, fam, mix, size)
				if err != nil {
					return out, err
				}
				out = append(out, rows...)
			}
		}
	}
	return out, nil
}

// A subject is one program to measure.
type subject struct {
	structure string
	prog      *ebpf.Program
	hits      *ebpf.Map // nil: no hit rate
}

func lookupOne(o Options, fam int, mix string, size int) ([]Result, error) {
	say := func(format string, args ...any) {
		if o.Progress != nil {
			o.Progress(fmt.Sprintf("IPv%d %s %d: ", fam, mix, size) + fmt.Sprintf(format, args...))
		}
	}
	structures := []string{XDPDrop, Parse, Baseline, OneRead, KernelLPM, Rampart}
	failed := map[string]string{}
	loaded := map[string]*Result{} // load time and memory, per structure

	// The steps before any lookup; their sources map is every program's.
	steps, err := load(fam, benchBenchStructureBENCH_BASELINE, &compile.Tables{}, 0, 1, nil)
	if err != nil {
		return nil, err
	}
	defer steps.Close()
	subjects := []subject{{XDPDrop, steps.BenchDrop, nil}, {Parse, steps.BenchParse, nil}, {Baseline, steps.BenchLookup, nil}}

	say("generating %d prefixes", size)
	prefixes := Prefixes(fam, mix, size)
	say("building rampart's tables")
	tables, rt, r := rampart(fam, prefixes, steps.Sources)
	loaded[Rampart] = &r
	if rt != nil {
		defer rt.Close()
		one, err := load(fam, benchBenchStructureBENCH_ONE_READ, &compile.Tables{}, 0, max(1, tables.KernelBytes()/4), steps.Sources)
		if err != nil {
			failed[OneRead] = err.Error()
		} else {
			defer one.Close()
			subjects = append(subjects, subject{OneRead, one.BenchLookup, nil})
		}
		subjects = append(subjects, subject{Rampart, rt.BenchLookup, rt.Hits})
	} else {
		failed[OneRead], failed[Rampart] = "rampart's tables did not load", r.Error
	}
	say("loading the kernel LPM trie")
	if o.NoKernelLPM {
		failed[KernelLPM] = "not measured (--no-kernel-lpm)"
	} else {
		lpm, r := kernelLPM(fam, prefixes, steps.Sources)
		loaded[KernelLPM] = &r
		if lpm != nil {
			defer lpm.Close()
			subjects = append(subjects, subject{KernelLPM, lpm.BenchLookup, lpm.Hits})
		} else {
			failed[KernelLPM] = r.Error
		}
	}

	var out []Result
	for _, traffic := range o.Traffic {
		srcs := sources(fam, traffic, prefixes)
		if err := writeSources(steps.Sources, srcs); err != nil {
			return nil, err
		}
		rows := map[string]*Result{}
		for _, s := range structures {
			r := Result{Structure: s, Family: fam, Mix: mix, Size: size, Traffic: traffic, Error: failed[s]}
			if l := loaded[s]; l != nil {
				r.LoadSeconds, r.BytesPerPrefix, r.KernelBytes = l.LoadSeconds, l.BytesPerPrefix, l.KernelBytes
			}
			rows[s] = &r
		}
		rows[OneRead].Reads, rows[OneRead].Pages = ptr(1), ptr(1)
		if rt != nil {
			rows[Rampart].Reads, rows[Rampart].Pages = readsAndPages(&tables, srcs)
		}
		if err := measure(o, udpFrame(fam), subjects, rows, func(run int) { say("%s traffic, run %d of %d", traffic, run+1, o.Runs) }); err != nil {
			return nil, err
		}
		for _, s := range structures {
			out = append(out, *rows[s])
		}
	}
	return out, nil
}

// measure runs every subject o.Runs times, interleaved so that noise from
// a shared machine falls on all of them alike, and fills their rows.
func measure(o Options, frame []byte, subjects []subject, rows map[string]*Result, progress func(run int)) error {
	before := make([][2]uint64, len(subjects))
	trials := make([]trial, len(subjects))
	for i, s := range subjects {
		before[i] = lookupsAndHits(s.hits)
		// XDP_DROP: the frame parsed and was not passed.
		trials[i] = trial{s.structure, s.prog, frame, xdpDrop}
	}
	ns, err := interleave(trials, o.Repeat, o.Runs, progress)
	if err != nil {
		return err
	}
	for i, s := range subjects {
		r := rows[s.structure]
		r.NsPerPacket, r.NsMin, r.NsMax = spread(ns[i])
		if s.hits != nil {
			after := lookupsAndHits(s.hits)
			r.HitRate = ptr(float64(after[1]-before[i][1]) / float64(max(1, after[0]-before[i][0])))
		}
	}
	base, one := rows[Baseline].NsPerPacket, rows[OneRead].NsPerPacket
	for _, r := range rows {
		if r.NsPerPacket > 0 && base > 0 {
			r.VsBaseline = r.NsPerPacket / base
		}
		if r.NsPerPacket > 0 && one > 0 {
			r.VsOneRead = r.NsPerPacket / one
		}
	}
	return nil
}

// readsAndPages walks the tables for the sources as the kernel does and
// averages the dependent reads (reads issued together count once) and the
// distinct pages per lookup.
func readsAndPages(t *compile.Tables, srcs []netip.Addr) (*float64, *float64) {
	var reads []compile.Read
	type page struct {
		table string
		n     uint64
	}
	pages := map[page]bool{}
	var nReads, nPages int
	for _, a := range srcs {
		reads = reads[:0]
		t.Lookup(a, &reads)
		clear(pages)
		for _, r := range reads {
			pages[page{r.Table, r.Offset >> 12}] = true
			if !r.Parallel {
				nReads++
			}
		}
		nPages += len(pages)
	}
	n := float64(max(1, len(srcs)))
	return ptr(float64(nReads) / n), ptr(float64(nPages) / n)
}

// load loads bench.c for a family and a structure over rampart's tables t,
// a kernel LPM trie of lpmEntries and a one-read array of oneReadWords,
// sharing shared as its sources when not nil.
func load(fam int, structure benchBenchStructure, t *compile.Tables, lpmEntries int, oneReadWords uint64, shared *ebpf.Map) (*benchLoaded, error) {
	spec, err := loadBench()
	if err != nil {
		return nil, err
	}
	var specs benchSpecs
	if err := spec.Assign(&specs); err != nil {
		return nil, err
	}
	if oneReadWords > 1<<31 {
		return nil, fmt.Errorf("one-read array of %d words: too big", oneReadWords)
	}
	v, m := &specs.benchVariableSpecs, &specs.benchMapSpecs
	for _, set := range []struct {
		spec  *ebpf.VariableSpec
		value any
	}{{v.Family, uint8(fam)}, {v.Structure, structure}, {v.SourceMask, uint32(sourceCount - 1)}, {v.OneReadWords, uint32(oneReadWords)}} {
		if err := set.spec.Set(set.value); err != nil {
			return nil, fmt.Errorf("set %s: %w", set.spec.Name, err)
		}
	}
	datapath.SizeLists(spec, t)
	m.KernelLpmV4.MaxEntries, m.KernelLpmV6.MaxEntries = uint32(max(1, lpmEntries)), uint32(max(1, lpmEntries))
	m.OneRead.MaxEntries, m.Sources.MaxEntries = uint32(oneReadWords), sourceCount
	if err := datapath.CheckMemory(t.KernelBytes() + 4*oneReadWords); err != nil {
		return nil, err
	}
	opts := &ebpf.CollectionOptions{}
	if shared != nil {
		opts.MapReplacements = map[string]*ebpf.Map{"sources": shared}
	}
	objs := &benchLoaded{}
	if err := spec.LoadAndAssign(&objs.benchObjects, opts); err != nil {
		return nil, err
	}
	o := &objs.benchObjects
	outers := map[string]*ebpf.Map{"configs": o.Configs, "v4_blocks": o.V4Blocks, "v4_wide": o.V4Wide, "v4_dense": o.V4Dense,
		"v4_tbl8s": o.V4Tbl8s, "v6_blocks": o.V6Blocks, "v6_short": o.V6Short, "v6_long": o.V6Long, "classes": o.Classes,
		"overlay_v4": o.OverlayV4, "overlay_v6": o.OverlayV6, "overlay_lengths": o.OverlayLengths}
	lists, err := datapath.ListGeneration(spec, outers, t)
	if err != nil {
		objs.Close()
		return nil, err
	}
	objs.lists = lists
	return objs, nil
}

// benchLoaded is the benchmark's objects and the generation of lists
// they read.
type benchLoaded struct {
	benchObjects
	lists *datapath.ListMaps
}

func (o *benchLoaded) Close() error {
	if o.lists != nil {
		o.lists.Close()
	}
	return o.benchObjects.Close()
}

// kernelLPM loads the benchmark over the kernel's LPM trie holding
// prefixes, with its load time and memory; nil objects when it failed (the
// error is in the result).
func kernelLPM(fam int, prefixes []netip.Prefix, sources *ebpf.Map) (*benchLoaded, Result) {
	var r Result
	start := time.Now()
	objs, err := load(fam, benchBenchStructureBENCH_KERNEL_LPM, &compile.Tables{}, len(prefixes), 1, sources)
	if err == nil {
		m := objs.KernelLpmV4
		if fam == 6 {
			m = objs.KernelLpmV6
		}
		if err = fillLPM(m, fam, prefixes); err == nil {
			r.LoadSeconds = ptr(time.Since(start).Seconds())
			r.KernelBytes = datapath.Memlock(m)
			r.BytesPerPrefix = ptr(float64(r.KernelBytes) / float64(max(1, len(prefixes))))
			return objs, r
		}
		objs.Close()
	}
	r.Error = err.Error()
	return nil, r
}

// fillLPM writes the prefixes into the kernel's LPM trie, one update each:
// the trie has no batch update.
func fillLPM(m *ebpf.Map, fam int, prefixes []netip.Prefix) error {
	var err error
	for i, p := range prefixes {
		if fam == 4 {
			err = m.Put(abi.LPMKeyV4{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As4()}, uint64(1))
		} else {
			err = m.Put(abi.LPMKeyV6{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As16()}, uint64(1))
		}
		if err != nil {
			return fmt.Errorf("kernel LPM trie, entry %d: %w", i, err)
		}
	}
	return nil
}

// rampart builds rampart's tables holding prefixes and loads the benchmark
// over them, timed from the prefixes in memory to filled maps; nil objects
// when it failed (the error is in the result).
func rampart(fam int, prefixes []netip.Prefix, sources *ebpf.Map) (compile.Tables, *benchLoaded, Result) {
	var r Result
	start := time.Now()
	var v4 []policy.Range4
	var v6 []policy.Range6
	if fam == 4 {
		v4 = make([]policy.Range4, len(prefixes))
		for i, p := range prefixes {
			v4[i] = policy.PrefixRange4(p)
		}
	} else {
		v6 = make([]policy.Range6, len(prefixes))
		for i, p := range prefixes {
			v6[i] = policy.PrefixRange6(p)
		}
	}
	list := policy.BuildList("bench", v4, v6)
	tables := compile.BuildTables([]*policy.List{list}, []uint64{1}, nil, nil)
	objs, err := load(fam, benchBenchStructureBENCH_RAMPART, &tables, 0, 1, sources)
	if err != nil {
		r.Error = err.Error()
		return tables, nil, r
	}
	r.LoadSeconds = ptr(time.Since(start).Seconds())
	r.KernelBytes = objs.lists.Memlock()
	r.BytesPerPrefix = ptr(float64(r.KernelBytes) / float64(max(1, len(prefixes))))
	return tables, objs, r
}

// lookupsAndHits reads a lookup program's counts; a baseline run has no
// map and no hits.
func lookupsAndHits(m *ebpf.Map) (n [2]uint64) {
	if m == nil {
		return n
	}
	for k := range n {
		var percpu []uint64
		if m.Lookup(uint32(k), &percpu) == nil {
			for _, v := range percpu {
				n[k] += v
			}
		}
	}
	return n
}

func ptr(f float64) *float64 { return &f }

// lengths returns a mix's prefix length for the i-th prefix of a family.
func lengths(fam int, mix string, i int, rng *rand.Rand) int {
	host := 32
	if fam == 6 {
		host = 128
	}
	switch mix {
	case MixEgress:
		switch {
		case i%100 == 0:
			return map[int]int{4: 16, 6: 48}[fam]
		case i%10 == 1:
			return map[int]int{4: 24, 6: 64}[fam]
		}
	case MixNetworks:
		if rng.IntN(100) < 15 {
			return host
		}
		if fam == 4 {
			return []int{16, 18, 19, 20, 21, 22, 22, 23, 24, 24, 24, 24}[rng.IntN(12)]
		}
		if rng.IntN(10000) == 0 {
			return 19
		}
		return []int{29, 32, 32, 32, 36, 40, 44, 48, 48, 48, 56, 64, 64}[rng.IntN(13)]
	}
	return host
}

// Prefixes draws size prefixes of the mix, deterministically: IPv4 anywhere,
// IPv6 in 2000::/3.
func Prefixes(fam int, mix string, size int) []netip.Prefix {
	out := make([]netip.Prefix, 0, size)
	eachPrefix(fam, mix, size, func(p netip.Prefix) { out = append(out, p) })
	return out
}

// eachPrefix gives Prefixes' prefixes one at a time.
func eachPrefix(fam int, mix string, size int, yield func(netip.Prefix)) {
	rng := rand.New(rand.NewPCG(uint64(fam), uint64(size)))
	if mix == MixFlood {
		eachFloodSource(fam, size, yield)
		return
	}
	for i := range size {
		yield(netip.PrefixFrom(randomAddr(fam, rng), lengths(fam, mix, i, rng)).Masked())
	}
}

// FloodSources is the most sources MixFlood holds: the hosts of a /8.
const FloodSources = 1 << 24

// eachFloodSource gives lab drop's sources (internal/lab's Traffic over
// its default ranges): size hosts of 10.0.0.0/8, or size /64s of
// fd10::/32 (bits 32-63), spread by an odd multiplier.
func eachFloodSource(fam int, size int, yield func(netip.Prefix)) {
	for i := range uint32(min(size, FloodSources)) {
		if fam == 4 {
			const mask = 1<<24 - 1
			yield(netip.PrefixFrom(policy.UintToV4(10<<24|i*(0x9e3779b1&mask|1)&mask), 32))
			continue
		}
		yield(netip.PrefixFrom(policy.U128{Hi: 0xfd10<<48 | uint64(i*0x9e3779b1)}.Addr(), 64))
	}
}

func randomAddr(fam int, rng *rand.Rand) netip.Addr {
	if fam == 4 {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], rng.Uint32())
		return netip.AddrFrom4(b)
	}
	return policy.U128{Hi: rng.Uint64()>>3 | 1<<61, Lo: rng.Uint64()}.Addr()
}

// sources draws a run's source addresses: random ones, or ones inside
// random listed prefixes.
func sources(fam int, traffic string, prefixes []netip.Prefix) []netip.Addr {
	rng := rand.New(rand.NewPCG(uint64(fam), 99))
	out := make([]netip.Addr, sourceCount)
	for i := range out {
		out[i] = randomAddr(fam, rng)
		if traffic != TrafficListed || len(prefixes) == 0 {
			continue
		}
		// The prefix's bits, the random address's below them.
		p := prefixes[rng.IntN(len(prefixes))]
		if fam == 4 {
			host := uint32(1)<<(32-p.Bits()) - 1
			out[i] = policy.UintToV4(policy.V4ToUint(p.Addr()) | policy.V4ToUint(out[i])&host)
			continue
		}
		a, r, host := policy.U128Of(p.Addr()), policy.U128Of(out[i]), policy.LowMask(128-p.Bits())
		out[i] = policy.U128{Hi: a.Hi | r.Hi&host.Hi, Lo: a.Lo | r.Lo&host.Lo}.Addr()
	}
	return out
}

// writeSources fills the shared sources map (IPv4 in the first 4 bytes).
func writeSources(m *ebpf.Map, srcs []netip.Addr) error {
	buf := make([]byte, 16*len(srcs))
	for i, a := range srcs {
		if a.Is4() {
			b := a.As4()
			copy(buf[16*i:], b[:])
		} else {
			b := a.As16()
			copy(buf[16*i:], b[:])
		}
	}
	mem, err := m.Memory()
	if err != nil {
		return err
	}
	_, err = mem.WriteAt(buf, 0)
	return err
}

// udpFrame is a minimal Ethernet + IP + UDP frame of the family, at least
// the 60-byte minimum frame; its source is replaced by the sources table's.
func udpFrame(fam int) []byte {
	f := packet.Frame{Src: netip.MustParseAddr("192.0.2.1"), Dst: netip.MustParseAddr("192.0.2.2"), Proto: 17, Sport: 12345, Dport: 53, Payload: 18}
	if fam == 6 {
		f.Src, f.Dst, f.Payload = netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2"), 0
	}
	return f.Bytes()
}

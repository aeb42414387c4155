// Package bench measures the per-packet cost of prefix-list lookups through
// BPF_PROG_TEST_RUN: rampart's tables beside the kernel's LPM trie and the
// steps every lookup pays for (a bare drop, parsing, a random source).
package bench

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
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
	KernelLPM = "kernel-lpm"
	Rampart   = "rampart"
)

// Mixes of prefix lengths.
const (
	MixEgress   = "egress"   // the egress study's: /24 10%, /16 1%, the rest /32
	MixRandom32 = "random32" // all host prefixes
)

// Options choose what to measure.
type Options struct {
	Families []int
	Mixes    []string
	Sizes    []int
	Repeat   int // packets per run (BPF_PROG_TEST_RUN repeat)
	Runs     int // runs per measurement; the median is reported
	// NoKernelLPM leaves the kernel's trie out: past ~89M prefixes it cannot
	// be loaded, and loading it takes minutes well before.
	NoKernelLPM bool
	// Progress, if set, hears what is being done.
	Progress func(msg string)
}

// Result is one row: one structure at one list size.
type Result struct {
	Structure   string  `json:"structure"`
	Family      int     `json:"family"`
	Mix         string  `json:"mix"`
	Size        int     `json:"size"`
	NsPerPacket float64 `json:"ns_per_packet"` // median over runs
	NsMin       float64 `json:"ns_min"`
	NsMax       float64 `json:"ns_max"`
	// VsBaseline is ns_per_packet over the baseline's in the same run.
	VsBaseline float64 `json:"vs_baseline"`
	// HitRate is the share of random sources found in the list (lookups only).
	HitRate *float64 `json:"hit_rate,omitempty"`
	// LoadSeconds is the time from prefixes in memory to a loaded, filled map
	// (lookups only); BytesPerPrefix the kernel memory (memlock) per prefix.
	LoadSeconds    *float64 `json:"load_seconds"`
	BytesPerPrefix *float64 `json:"bytes_per_prefix"`
	KernelBytes    uint64   `json:"kernel_bytes,omitempty"`
	Error          string   `json:"error,omitempty"`
}

// The IPv6 sources and prefixes live in 2001:db8::/96, so that random /128s
// hit as often as random /32s do in IPv4.
var v6Base = netip.MustParseAddr("2001:db8::").As16()

// Lookup runs every structure for every family, mix and size.
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

// A subject is one program to measure and the row it fills.
type subject struct {
	prog *ebpf.Program
	hits *ebpf.Map // nil: no hit rate
	row  *Result
}

func lookupOne(o Options, fam int, mix string, size int) ([]Result, error) {
	say := func(format string, args ...any) {
		if o.Progress != nil {
			o.Progress(fmt.Sprintf("IPv%d %s %d: ", fam, mix, size) + fmt.Sprintf(format, args...))
		}
	}
	rows := make([]Result, 5)
	for i, s := range []string{XDPDrop, Parse, Baseline, KernelLPM, Rampart} {
		rows[i] = Result{Structure: s, Family: fam, Mix: mix, Size: size}
	}

	// The steps before any lookup, loaded with empty tables.
	steps, err := load(fam, benchBenchStructureBENCH_BASELINE, &compile.Tables{}, 0)
	if err != nil {
		return nil, err
	}
	defer steps.Close()
	subjects := []subject{{steps.BenchDrop, nil, &rows[0]}, {steps.BenchParse, nil, &rows[1]}, {steps.BenchLookup, nil, &rows[2]}}

	say("generating %d prefixes", size)
	prefixes := generate(fam, mix, size)
	say("loading the kernel LPM trie")
	if o.NoKernelLPM {
		rows[3].Error = "not measured (--no-kernel-lpm)"
	} else if lpm := kernelLPM(fam, prefixes, &rows[3]); lpm != nil {
		defer lpm.Close()
		subjects = append(subjects, subject{lpm.BenchLookup, lpm.Hits, &rows[3]})
	}
	say("building rampart's tables")
	if rt := rampart(fam, prefixes, &rows[4]); rt != nil {
		defer rt.Close()
		subjects = append(subjects, subject{rt.BenchLookup, rt.Hits, &rows[4]})
	}
	prefixes = nil

	// Runs interleave the subjects, so that noise from a shared machine
	// falls on all of them alike.
	frame := udpFrame(fam)
	ns := make([][]float64, len(subjects))
	before := make([]uint64, len(subjects))
	for i, s := range subjects {
		before[i] = sumHits(s.hits)
	}
	for run := 0; run < o.Runs; run++ {
		say("run %d of %d", run+1, o.Runs)
		for i, s := range subjects {
			ret, d, err := s.prog.Benchmark(frame, o.Repeat, nil)
			if err == nil && ret != 1 { // XDP_DROP: the frame parsed and was not passed
				err = fmt.Errorf("program returned %d, not XDP_DROP", ret)
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w", s.row.Structure, err)
			}
			ns[i] = append(ns[i], float64(d.Nanoseconds()))
		}
	}
	for i, s := range subjects {
		slices.Sort(ns[i])
		s.row.NsPerPacket, s.row.NsMin, s.row.NsMax = ns[i][len(ns[i])/2], ns[i][0], ns[i][len(ns[i])-1]
		if s.hits != nil {
			s.row.HitRate = ptr(float64(sumHits(s.hits)-before[i]) / float64(o.Runs*o.Repeat))
		}
	}
	base := rows[2].NsPerPacket
	for i := range rows {
		if base > 0 && rows[i].NsPerPacket > 0 {
			rows[i].VsBaseline = rows[i].NsPerPacket / base
		}
	}
	return rows, nil
}

// load loads bench.c for a family and a structure over rampart's tables t
// (and a kernel LPM trie of lpmEntries).
func load(fam int, structure benchBenchStructure, t *compile.Tables, lpmEntries int) (*benchObjects, error) {
	spec, err := loadBench()
	if err != nil {
		return nil, err
	}
	var specs benchSpecs
	if err := spec.Assign(&specs); err != nil {
		return nil, err
	}
	v, m := &specs.benchVariableSpecs, &specs.benchMapSpecs
	for _, set := range []struct {
		spec  *ebpf.VariableSpec
		value any
	}{{v.Family, uint8(fam)}, {v.Structure, structure}, {v.V6BaseAddr, v6Base}} {
		if err := set.spec.Set(set.value); err != nil {
			return nil, fmt.Errorf("set %s: %w", set.spec.Name, err)
		}
	}
	ts := datapath.TableSpecs{V4Dir: m.V4Dir, V4Entries: m.V4Entries, V4Bitmaps: m.V4Bitmaps, V4Tbl8s: m.V4Tbl8s, V6Dir: m.V6Dir,
		V6Nodes: m.V6Nodes, V6Short: m.V6Short, V6Long: m.V6Long, Classes: m.Classes, V6ShortBits: v.V6ShortBits, V6LongBits: v.V6LongBits, V6Seed: v.V6Seed}
	if err := ts.Size(t); err != nil {
		return nil, err
	}
	m.KernelLpmV4.MaxEntries, m.KernelLpmV6.MaxEntries = uint32(max(1, lpmEntries)), uint32(max(1, lpmEntries))
	if err := datapath.CheckMemory(t.KernelBytes()); err != nil {
		return nil, err
	}
	var objs benchObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return nil, err
	}
	if err := tableMaps(&objs).Fill(t); err != nil {
		objs.Close()
		return nil, err
	}
	return &objs, nil
}

func tableMaps(o *benchObjects) datapath.TableMaps {
	return datapath.TableMaps{V4Dir: o.V4Dir, V4Entries: o.V4Entries, V4Bitmaps: o.V4Bitmaps, V4Tbl8s: o.V4Tbl8s, V6Dir: o.V6Dir,
		V6Nodes: o.V6Nodes, V6Short: o.V6Short, V6Long: o.V6Long, Classes: o.Classes, OverlayV4: o.OverlayV4, OverlayV6: o.OverlayV6, OverlayEntries: o.OverlayEntries}
}

// kernelLPM loads the benchmark over the kernel's LPM trie holding
// prefixes, recording load time and memory in r; nil when it failed (the
// error is in r).
func kernelLPM(fam int, prefixes []netip.Prefix, r *Result) *benchObjects {
	start := time.Now()
	objs, err := load(fam, benchBenchStructureBENCH_KERNEL_LPM, &compile.Tables{}, len(prefixes))
	if err == nil {
		m := objs.KernelLpmV4
		if fam == 6 {
			m = objs.KernelLpmV6
		}
		if err = fillLPM(m, fam, prefixes); err == nil {
			r.LoadSeconds = ptr(time.Since(start).Seconds())
			r.KernelBytes = datapath.Memlock(m)
			r.BytesPerPrefix = ptr(float64(r.KernelBytes) / float64(max(1, len(prefixes))))
			return objs
		}
		objs.Close()
	}
	r.Error = err.Error()
	return nil
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

// rampart loads the benchmark over rampart's tables holding prefixes, timed
// from the prefixes in memory to filled maps; nil when it failed.
func rampart(fam int, prefixes []netip.Prefix, r *Result) *benchObjects {
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
	tables := compile.BuildTables([]*policy.List{list}, []uint64{1})
	objs, err := load(fam, benchBenchStructureBENCH_RAMPART, &tables, 0)
	if err != nil {
		r.Error = err.Error()
		return nil
	}
	r.LoadSeconds = ptr(time.Since(start).Seconds())
	r.KernelBytes = tableMaps(objs).Memlock()
	r.BytesPerPrefix = ptr(float64(r.KernelBytes) / float64(max(1, len(prefixes))))
	return objs
}

// sumHits is the hit count of a rampart or kernel-LPM run; a baseline run
// has no map and no hits.
func sumHits(m *ebpf.Map) uint64 {
	if m == nil {
		return 0
	}
	n, _ := datapath.SumPerCPU(m)
	return n
}

func ptr(f float64) *float64 { return &f }

// generate draws size prefixes of the mix, deterministically.
func generate(fam int, mix string, size int) []netip.Prefix {
	rng := rand.New(rand.NewPCG(uint64(fam), uint64(size)))
	out := make([]netip.Prefix, size)
	for i := range out {
		host := 32
		if mix == MixEgress {
			switch {
			case i%100 == 0:
				host = 16
			case i%10 == 1:
				host = 24
			}
		}
		r := rng.Uint32()
		if fam == 4 {
			var b [4]byte
			binary.BigEndian.PutUint32(b[:], r)
			out[i] = netip.PrefixFrom(netip.AddrFrom4(b), host).Masked()
		} else {
			b := v6Base
			binary.BigEndian.PutUint32(b[12:], r)
			out[i] = netip.PrefixFrom(netip.AddrFrom16(b), 96+host).Masked()
		}
	}
	return out
}

// udpFrame is a minimal Ethernet + IP + UDP frame of the family, at least
// the 60-byte minimum frame.
func udpFrame(fam int) []byte {
	f := packet.Frame{Src: netip.MustParseAddr("192.0.2.1"), Dst: netip.MustParseAddr("192.0.2.2"), Proto: 17, Sport: 12345, Dport: 53, Payload: 18}
	if fam == 6 {
		f.Src, f.Dst, f.Payload = netip.AddrFrom16(v6Base), netip.AddrFrom16(v6Base), 0
	}
	return f.Bytes()
}

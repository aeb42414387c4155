package bench

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/rampart-fw/rampart/internal/compile"
	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/packet"
	"github.com/rampart-fw/rampart/internal/policy"
)

// Rule kinds `bench rules` compares, each a one-rule policy that drops the
// benchmark's frame: a plain drop, and limits the frame is far over.
const (
	RuleDrop        = "drop"
	RuleLimit       = "limit"            // per rule
	RuleLimitSource = "limit-per-source" // per source: the frame's one source, its schedule in cache
)

var rulePolicies = []struct{ kind, yaml string }{
	{RuleDrop, "rules:\n  - {name: r, proto: udp, dport: 53, action: drop}\n"},
	{RuleLimit, "rules:\n  - {name: r, proto: udp, dport: 53, action: limit, rate: 1/s, burst: 1}\n"},
	{RuleLimitSource, "rules:\n  - {name: r, proto: udp, dport: 53, action: limit, rate: 1/s, burst: 1, per: source}\n"},
}

// RuleResult is one rule kind's cost in one family.
type RuleResult struct {
	Rule        string  `json:"rule"`
	Family      int     `json:"family"`
	NsPerPacket float64 `json:"ns_per_packet"` // median over runs
	NsMin       float64 `json:"ns_min"`
	NsMax       float64 `json:"ns_max"`
	VsDrop      float64 `json:"vs_drop"` // ns_per_packet over the drop rule's in the same run
}

// Rules measures what rampart's XDP program costs per packet with each rule
// kind, the frame dropped by it, through BPF_PROG_TEST_RUN: runs rounds of
// repeat packets, interleaved across kinds so that a shared machine's noise
// falls on all alike.
func Rules(families []int, repeat, runs int, progress func(string)) ([]RuleResult, error) {
	var out []RuleResult
	for _, fam := range families {
		progs := make([]*ebpf.Program, len(rulePolicies))
		for i, rp := range rulePolicies {
			pol, err := policy.Parse(rp.kind+".yaml", []byte(rp.yaml))
			if err != nil {
				return nil, err
			}
			objs, err := datapath.Load(compile.Build(pol))
			if err != nil {
				return nil, fmt.Errorf("load the %s policy: %w", rp.kind, err)
			}
			defer objs.Close()
			progs[i] = objs.Program(datapath.KindXDP)
		}
		frame := udpFrame(fam)
		ns := make([][]float64, len(progs))
		for run := range runs {
			if progress != nil {
				progress(fmt.Sprintf("IPv%d: run %d/%d", fam, run+1, runs))
			}
			for i, p := range progs {
				ret, d, err := p.Benchmark(frame, repeat, nil)
				if err == nil && ret != 1 {
					err = fmt.Errorf("program returned %d, not XDP_DROP", ret)
				}
				if err != nil {
					return nil, fmt.Errorf("%s: %w", rulePolicies[i].kind, err)
				}
				ns[i] = append(ns[i], float64(d.Nanoseconds()))
			}
		}
		var drop float64
		for i, rp := range rulePolicies {
			slices.Sort(ns[i])
			r := RuleResult{Rule: rp.kind, Family: fam, NsPerPacket: ns[i][len(ns[i])/2], NsMin: ns[i][0], NsMax: ns[i][len(ns[i])-1]}
			if rp.kind == RuleDrop {
				drop = r.NsPerPacket
			}
			if drop > 0 {
				r.VsDrop = r.NsPerPacket / drop
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// ScaleResult is the cost of one policy size for one frame: a frame no rule
// matches, or one only the last rule matches.
type ScaleResult struct {
	Rules       int     `json:"rules"`
	Family      int     `json:"family"`
	Frame       string  `json:"frame"` // "no-match" or "last-rule"
	NsPerPacket float64 `json:"ns_per_packet"`
	NsMin       float64 `json:"ns_min"`
	NsMax       float64 `json:"ns_max"`
	VsFewest    float64 `json:"vs_fewest"`    // over the smallest policy's, same frame, same run
	LoadSeconds float64 `json:"load_seconds"` // compile and load the policy
	KernelBytes uint64  `json:"kernel_bytes"` // the rules and the classifier's maps
	TreeWords   int     `json:"tree_words"`
}

// scaleLists are the source lists the scale policies' rules spread over.
const scaleLists = 32

// scalePolicy is n rules as a feed sends them: each a source list, UDP and
// its own destination port (and source port past 60,000 rules), dropped.
func scalePolicy(n, fam int) string {
	var b strings.Builder
	b.WriteString("lists:\n")
	for k := range scaleLists {
		if fam == 6 {
			fmt.Fprintf(&b, "  l%d: {prefixes: [\"2001:db8:%x::/48\"]}\n", k, k)
		} else {
			fmt.Fprintf(&b, "  l%d: {prefixes: [198.18.%d.0/24]}\n", k, k)
		}
	}
	b.WriteString("rules:\n")
	for i := range n {
		sport, dport := scalePorts(i)
		fmt.Fprintf(&b, "  - {name: r%d, src: l%d, proto: udp, sport: %d, dport: %d, action: drop}\n", i, i%scaleLists, sport, dport)
	}
	b.WriteString("default: pass\n")
	return b.String()
}

func scalePorts(i int) (sport, dport int) {
	return 10000 + i/60000, 1 + i%60000
}

// scaleFrame is a UDP frame from the last rule's list: matched by the last
// rule, or (dport past every rule's) by none.
func scaleFrame(n, fam int, match bool) []byte {
	k := (n - 1) % scaleLists
	f := packet.Frame{Src: netip.AddrFrom4([4]byte{198, 18, byte(k), 7}), Dst: netip.MustParseAddr("192.0.2.2"), Proto: 17, Payload: 18}
	if fam == 6 {
		f.Src, f.Dst, f.Payload = netip.MustParseAddr(fmt.Sprintf("2001:db8:%x::7", k)), netip.MustParseAddr("2001:db8::2"), 0
	}
	sport, dport := scalePorts(n - 1)
	f.Sport, f.Dport = uint16(sport), uint16(dport)
	if !match {
		f.Dport = 65000
	}
	return f.Bytes()
}

// Scale measures what rampart's XDP program costs per packet under policies
// of each size in counts, for a frame no rule matches and one only the last
// rule matches, through BPF_PROG_TEST_RUN in rounds interleaved across sizes.
func Scale(counts []int, families []int, repeat, runs int, progress func(string)) ([]ScaleResult, error) {
	var out []ScaleResult
	for _, fam := range families {
		type subject struct {
			res   ScaleResult
			prog  *ebpf.Program
			frame []byte
			want  uint32
		}
		var subjects []*subject
		for _, n := range counts {
			if progress != nil {
				progress(fmt.Sprintf("IPv%d: compiling and loading %d rules", fam, n))
			}
			start := time.Now()
			pol, err := policy.Parse(fmt.Sprintf("rules-%d.yaml", n), []byte(scalePolicy(n, fam)))
			if err != nil {
				return nil, err
			}
			img := compile.Build(pol)
			objs, err := datapath.Load(img)
			if err != nil {
				return nil, fmt.Errorf("load %d rules: %w", n, err)
			}
			defer objs.Close()
			took := time.Since(start).Seconds()
			for _, match := range []bool{false, true} {
				s := &subject{prog: objs.Program(datapath.KindXDP), frame: scaleFrame(n, fam, match), want: 2 /* XDP_PASS */}
				s.res = ScaleResult{Rules: n, Family: fam, Frame: "no-match", LoadSeconds: took, KernelBytes: img.KernelBytes(), TreeWords: len(img.Tree)}
				if match {
					s.res.Frame, s.want = "last-rule", 1 // XDP_DROP
				}
				subjects = append(subjects, s)
			}
		}
		ns := make([][]float64, len(subjects))
		for run := range runs {
			if progress != nil {
				progress(fmt.Sprintf("IPv%d: run %d/%d", fam, run+1, runs))
			}
			for i, s := range subjects {
				ret, d, err := s.prog.Benchmark(s.frame, repeat, nil)
				if err == nil && ret != s.want {
					err = fmt.Errorf("program returned %d, not %d", ret, s.want)
				}
				if err != nil {
					return nil, fmt.Errorf("%d rules, %s frame: %w", s.res.Rules, s.res.Frame, err)
				}
				ns[i] = append(ns[i], float64(d.Nanoseconds()))
			}
		}
		fewest := map[string]float64{}
		for i, s := range subjects {
			slices.Sort(ns[i])
			r := s.res
			r.NsPerPacket, r.NsMin, r.NsMax = ns[i][len(ns[i])/2], ns[i][0], ns[i][len(ns[i])-1]
			if _, ok := fewest[r.Frame]; !ok {
				fewest[r.Frame] = r.NsPerPacket
			}
			r.VsFewest = r.NsPerPacket / fewest[r.Frame]
			out = append(out, r)
		}
	}
	return out, nil
}

package bench

import (
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

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
		trials := make([]trial, len(rulePolicies))
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
			trials[i] = trial{rp.kind, objs.Program(datapath.KindXDP), udpFrame(fam), xdpDrop}
		}
		ns, err := interleave(trials, repeat, runs, runProgress(progress, fam, runs))
		if err != nil {
			return nil, err
		}
		var drop float64
		for i, rp := range rulePolicies {
			r := RuleResult{Rule: rp.kind, Family: fam}
			r.NsPerPacket, r.NsMin, r.NsMax = spread(ns[i])
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

// runProgress says which run of a family's is under way.
func runProgress(progress func(string), fam, runs int) func(int) {
	if progress == nil {
		return nil
	}
	return func(run int) { progress(fmt.Sprintf("IPv%d: run %d/%d", fam, run+1, runs)) }
}

// ScaleLists is how many source lists the scale policies' rules spread
// over by default.
const ScaleLists = 32

// MaxScaleLists bounds them: the ways a policy names lists in, one a
// list here.
const MaxScaleLists = policy.MaxListWays

// scalePolicy is n rules as a feed sends them: each one of lists source
// lists, UDP and its own destination port (and source port past 60,000
// rules), dropped. With victims, each rule's destination is a prefix of
// its own instead of a source list, as BGP FlowSpec routes name the
// addresses under attack.
func scalePolicy(n, fam int, victims bool, lists int) string {
	var b strings.Builder
	writeScalePolicy(&b, n, fam, victims, lists)
	return b.String()
}

// writeScalePolicy writes scalePolicy's text to w, a rule at a time.
func writeScalePolicy(b io.Writer, n, fam int, victims bool, lists int) {
	io.WriteString(b, "lists:\n")
	bits := 24 // a /24 of 10.0.0.0/8, a /48 of 2001:db8::/32
	if fam == 6 {
		bits = 48
	}
	for k := range lists {
		fmt.Fprintf(b, "  l%d: {prefixes: [%q]}\n", k, netip.PrefixFrom(scaleSource(k, fam), bits).Masked())
	}
	io.WriteString(b, "rules:\n")
	for i := range n {
		sport, dport := scalePorts(i)
		match := fmt.Sprintf("src: l%d", i%lists)
		if victims {
			match = fmt.Sprintf("dst: %q", victim(i, fam))
		}
		fmt.Fprintf(b, "  - {name: r%d, %s, proto: udp, sport: %d, dport: %d, action: drop}\n", i, match, sport, dport)
	}
	io.WriteString(b, "default: pass\n")
}

// victim is the destination of a victims policy's rule i: a /32 (/128) of
// 198.18.0.0/15 (2001:db8:ff::/48).
func victim(i, fam int) netip.Addr {
	if fam == 6 {
		return netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 0xff, 12: byte(i >> 24), 13: byte(i >> 16), 14: byte(i >> 8), 15: byte(i)})
	}
	return netip.AddrFrom4([4]byte{198, 18 + byte(i>>16), byte(i >> 8), byte(i)})
}

func scalePorts(i int) (sport, dport int) {
	return 10000 + i/60000, 1 + i%60000
}

// scaleSource is an address of source list k: in 10.0.0.0/8 (a /24
// each), or 2001:db8::/32 (a /48 each).
func scaleSource(k, fam int) netip.Addr {
	if fam == 6 {
		return netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, byte(k >> 8), byte(k), 15: 7})
	}
	return netip.AddrFrom4([4]byte{10, byte(k >> 8), byte(k), 7})
}

// scaleFrame is a UDP frame from the last rule's list (to its victim):
// matched by the last rule, or (dport past every rule's) by none.
func scaleFrame(n, fam int, victims, match bool, lists int) []byte {
	f := packet.Frame{Src: scaleSource((n-1)%lists, fam), Dst: netip.MustParseAddr("192.0.2.2"), Proto: 17, Payload: 18}
	if fam == 6 {
		f.Dst, f.Payload = netip.MustParseAddr("2001:db8::2"), 0
	}
	if victims {
		f.Dst = victim(n-1, fam)
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
// With victims, each rule names a destination of its own (scalePolicy).
func Scale(counts []int, families []int, victims bool, lists, repeat, runs int, progress func(string)) ([]ScaleResult, error) {
	var out []ScaleResult
	for _, fam := range families {
		var trials []trial
		var results []ScaleResult
		for _, n := range counts {
			if progress != nil {
				progress(fmt.Sprintf("IPv%d: compiling and loading %d rules", fam, n))
			}
			start := time.Now()
			pol, err := policy.Parse(fmt.Sprintf("rules-%d.yaml", n), []byte(scalePolicy(n, fam, victims, lists)))
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
				r := ScaleResult{Rules: n, Family: fam, Frame: "no-match", LoadSeconds: took, KernelBytes: img.KernelBytes(), TreeWords: len(img.Tree)}
				want := uint32(xdpPass)
				if match {
					r.Frame, want = "last-rule", xdpDrop
				}
				results = append(results, r)
				trials = append(trials, trial{fmt.Sprintf("%d rules, %s frame", n, r.Frame), objs.Program(datapath.KindXDP), scaleFrame(n, fam, victims, match, lists), want})
			}
		}
		ns, err := interleave(trials, repeat, runs, runProgress(progress, fam, runs))
		if err != nil {
			return nil, err
		}
		fewest := map[string]float64{}
		for i, r := range results {
			r.NsPerPacket, r.NsMin, r.NsMax = spread(ns[i])
			if _, ok := fewest[r.Frame]; !ok {
				fewest[r.Frame] = r.NsPerPacket
			}
			r.VsFewest = r.NsPerPacket / fewest[r.Frame]
			out = append(out, r)
		}
	}
	return out, nil
}

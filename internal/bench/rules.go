package bench

import (
	"fmt"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/rampart-fw/rampart/internal/compile"
	"github.com/rampart-fw/rampart/internal/datapath"
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

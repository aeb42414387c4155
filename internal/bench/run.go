package bench

import (
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
)

// trial is one program and the frame it is benchmarked with, and the XDP
// action the frame must take.
type trial struct {
	name  string
	prog  *ebpf.Program
	frame []byte
	want  uint32
}

const (
	xdpDrop = 1
	xdpPass = 2
)

// interleave runs every trial runs times, repeat packets each through
// BPF_PROG_TEST_RUN, round by round so that a shared machine's noise falls
// on all of them alike. It returns each trial's ns per packet, sorted.
func interleave(trials []trial, repeat, runs int, progress func(run int)) ([][]float64, error) {
	ns := make([][]float64, len(trials))
	for run := range runs {
		if progress != nil {
			progress(run)
		}
		for i, t := range trials {
			ret, d, err := t.prog.Benchmark(t.frame, repeat, nil)
			if err == nil && ret != t.want {
				err = fmt.Errorf("program returned %d, not %d", ret, t.want)
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w", t.name, err)
			}
			ns[i] = append(ns[i], float64(d.Nanoseconds()))
		}
	}
	for i := range ns {
		slices.Sort(ns[i])
	}
	return ns, nil
}

// spread is the median, least and most of sorted runs.
func spread(sorted []float64) (median, least, most float64) {
	return sorted[len(sorted)/2], sorted[0], sorted[len(sorted)-1]
}

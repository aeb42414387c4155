package lab

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// CPUPlan says where the generator, the receive path and the application
// run.
type CPUPlan struct{ Gen, Rx, App int }

// CPUs picks where things run: the generator on CPU 0, the receive path on
// CPU 1, the recvmmsg application on a CPU of its own when there is a third
// (as in the study) and else beside the receive path, never beside the
// generator, whose rate it would take. One CPU runs everything.
func CPUs() CPUPlan {
	switch n := runtime.NumCPU(); {
	case n >= 3:
		return CPUPlan{Gen: 0, Rx: 1, App: 2}
	case n == 2:
		return CPUPlan{Gen: 0, Rx: 1, App: 1}
	}
	return CPUPlan{}
}

// Receivers are the CPUs whose busy time a dropped packet costs.
func (c CPUPlan) Receivers() []int {
	if c.App != c.Rx && c.App != c.Gen {
		return []int{c.Rx, c.App}
	}
	return []int{c.Rx}
}

// CPUTimes is one CPU's line of /proc/stat, in clock ticks.
type CPUTimes struct {
	busy, total uint64
}

// ReadCPU reads the times of one CPU. Busy is user, nice, system, irq and
// softirq (the receive path runs in the last three); total adds idle,
// iowait and steal, time the CPU was not ours to use.
func ReadCPU(cpu int) (CPUTimes, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return CPUTimes{}, err
	}
	defer f.Close()
	return parseCPU(bufio.NewScanner(f), cpu)
}

func parseCPU(sc *bufio.Scanner, cpu int) (CPUTimes, error) {
	want := "cpu" + strconv.Itoa(cpu)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 9 || fields[0] != want {
			continue
		}
		var v [8]uint64
		for i := range v {
			n, err := strconv.ParseUint(fields[1+i], 10, 64)
			if err != nil {
				return CPUTimes{}, fmt.Errorf("/proc/stat %s: %w", want, err)
			}
			v[i] = n
		}
		user, nice, system, idle, iowait, irq, softirq, steal := v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]
		busy := user + nice + system + irq + softirq
		return CPUTimes{busy: busy, total: busy + idle + iowait + steal}, nil
	}
	return CPUTimes{}, fmt.Errorf("/proc/stat has no line for %s", want)
}

// BusySince is the fraction of the interval since prev the CPU was busy.
func (c CPUTimes) BusySince(prev CPUTimes) float64 {
	if c.total <= prev.total {
		return 0
	}
	return float64(c.busy-prev.busy) / float64(c.total-prev.total)
}

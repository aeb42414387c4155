package lab

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// cpuTimes is one CPU's line of /proc/stat, in clock ticks.
type cpuTimes struct {
	busy, total uint64
}

// readCPU reads the times of one CPU. Busy is user, nice, system, irq and
// softirq (the receive path runs in the last three); total adds idle,
// iowait and steal, time the CPU was not ours to use.
func readCPU(cpu int) (cpuTimes, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return cpuTimes{}, err
	}
	defer f.Close()
	return parseCPU(bufio.NewScanner(f), cpu)
}

func parseCPU(sc *bufio.Scanner, cpu int) (cpuTimes, error) {
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
				return cpuTimes{}, fmt.Errorf("/proc/stat %s: %w", want, err)
			}
			v[i] = n
		}
		user, nice, system, idle, iowait, irq, softirq, steal := v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]
		busy := user + nice + system + irq + softirq
		return cpuTimes{busy: busy, total: busy + idle + iowait + steal}, nil
	}
	return cpuTimes{}, fmt.Errorf("/proc/stat has no line for %s", want)
}

// busySince is the fraction of the interval since prev the CPU was busy.
func (c cpuTimes) busySince(prev cpuTimes) float64 {
	if c.total <= prev.total {
		return 0
	}
	return float64(c.busy-prev.busy) / float64(c.total-prev.total)
}

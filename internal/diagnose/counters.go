// Package diagnose finds where the kernel loses packets and why: counters
// from /proc and netlink, drop reasons from the kfree_skb tracepoint, and
// rules that turn what moves into named findings.
package diagnose

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/rampart-fw/rampart/internal/snmp"
)

// Counters maps a counter's name to its value (nstat's names; see snmp).
type Counters = snmp.Counters

// Softnet is one CPU's line of /proc/net/softnet_stat.
type Softnet struct {
	CPU         int    `json:"cpu"`
	Processed   uint64 `json:"processed"`
	Dropped     uint64 `json:"dropped"`      // backlog full: netdev_max_backlog
	TimeSqueeze uint64 `json:"time_squeeze"` // softirq ran out of budget or time with work left
	ReceivedRPS uint64 `json:"received_rps"`
	FlowLimit   uint64 `json:"flow_limit"`
}

// ParseSoftnet reads /proc/net/softnet_stat: hex columns, one line per
// online CPU. The CPU number is column 13 on kernels that print it (4.18+),
// else the line's position.
func ParseSoftnet(r io.Reader) ([]Softnet, error) {
	sc := bufio.NewScanner(r)
	var out []Softnet
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) < 11 {
			return nil, fmt.Errorf("line %d: %d columns, want at least 11", line, len(f))
		}
		col := make([]uint64, len(f))
		for i, s := range f {
			v, err := strconv.ParseUint(s, 16, 64)
			if err != nil {
				return nil, fmt.Errorf("line %d column %d: %w", line, i+1, err)
			}
			col[i] = v
		}
		s := Softnet{CPU: line - 1, Processed: col[0], Dropped: col[1], TimeSqueeze: col[2], ReceivedRPS: col[9], FlowLimit: col[10]}
		if len(col) >= 13 {
			s.CPU = int(col[12])
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

// Rates gives, per counter that moved, its increase per second from prev
// to cur over seconds. A counter that went backwards (a reset) is left out.
func Rates(prev, cur Counters, seconds float64) map[string]float64 {
	out := map[string]float64{}
	if seconds <= 0 {
		return out
	}
	for k, v := range cur {
		if p, ok := prev[k]; ok && v > p {
			out[k] = float64(v-p) / seconds
		}
	}
	return out
}

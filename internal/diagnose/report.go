package diagnose

import (
	"fmt"
	"sort"
	"time"
)

// Report is one diagnosis over a sampling window.
type Report struct {
	Time        time.Time    `json:"time"`
	Netns       string       `json:"netns,omitempty"`
	Window      float64      `json:"window_seconds"`
	Findings    []Finding    `json:"findings"`
	Counters    []Counter    `json:"counters"`
	DropReasons []DropReason `json:"drop_reasons"`
	Tracing     Tracing      `json:"tracing"`
	Qdiscs      []Qdisc      `json:"qdiscs"`
	Missing     []string     `json:"missing,omitempty"`
}

// Counter is one counter's value at the end of the window and its rate per
// second over it; a gauge is a level (its rate is 0).
type Counter struct {
	Name  string  `json:"name"`
	Value uint64  `json:"value"`
	Rate  float64 `json:"rate"`
	Gauge bool    `json:"gauge,omitempty"`
}

// DropReason is one kind of drop seen by the tracer during the window.
type DropReason struct {
	Reason   string  `json:"reason"`
	Function string  `json:"function"` // the kernel function that freed the skb
	Location string  `json:"location"` // function+offset of the call site
	Iface    string  `json:"iface"`
	Protocol string  `json:"protocol"` // ipv4/udp, ipv6/tcp, arp…
	Count    uint64  `json:"count"`
	Rate     float64 `json:"rate"`
}

// Tracing says whether drop reasons were traced, and at what cost.
type Tracing struct {
	Enabled bool   `json:"enabled"`
	Error   string `json:"error,omitempty"`
	// Lost counts drops not counted because the tracer's table was full.
	Lost uint64 `json:"lost,omitempty"`
	// The tracer's own cost over the window, as the kernel measured it.
	Events     uint64  `json:"events,omitempty"`
	NsPerEvent float64 `json:"ns_per_event,omitempty"`
	// CPUPercent is the share of one CPU the tracer took.
	CPUPercent float64 `json:"cpu_percent,omitempty"`
}

// Drops is what the tracer counted at the start and the end of a window.
type Drops struct {
	Before, After        map[DropKey]uint64
	Reasons              map[uint32]string
	Symbols              *Symbols
	Lost                 uint64
	Overhead0, Overhead1 Overhead
	// When the counts were read. A snapshot of counters takes a while
	// (iptables-save, netlink dumps), longer under load: drop reasons are
	// rated over their own window, not the snapshots', or conntrack's
	// drops and the tracer's disagree by the difference.
	Began, Ended time.Time
}

// Build turns two snapshots (and, when tracing ran, the drops counted
// between them) into a report. all keeps counters that did not move.
func Build(prev, cur *Snapshot, drops *Drops, all bool) *Report {
	secs := cur.Time.Sub(prev.Time).Seconds()
	r := &Report{Time: cur.Time, Window: secs, Missing: cur.Missing, Qdiscs: cur.Qdiscs,
		Findings: []Finding{}, Counters: []Counter{}, DropReasons: []DropReason{}}
	rates := Rates(prev.Counters, cur.Counters, secs)
	for name, v := range cur.Counters {
		if rates[name] > 0 || all {
			r.Counters = append(r.Counters, Counter{Name: name, Value: v, Rate: rates[name]})
		}
	}
	for name, v := range cur.Gauges {
		// A level shows when it changed or holds something; the table's
		// size is configuration, quoted by conntrack-full when it matters.
		if all || v != prev.Gauges[name] || (v > 0 && name != "conntrack/max") {
			r.Counters = append(r.Counters, Counter{Name: name, Value: v, Gauge: true})
		}
	}
	sort.Slice(r.Counters, func(i, j int) bool { return r.Counters[i].Name < r.Counters[j].Name })
	if drops != nil {
		r.Tracing = Tracing{Enabled: true, Lost: drops.Lost}
		tsecs := secs
		if !drops.Began.IsZero() && drops.Ended.After(drops.Began) {
			tsecs = drops.Ended.Sub(drops.Began).Seconds()
		}
		r.DropReasons = drops.reasons(cur, tsecs)
		if ev := drops.Overhead1.Events - drops.Overhead0.Events; ev > 0 && secs > 0 {
			t := drops.Overhead1.Time - drops.Overhead0.Time
			r.Tracing.Events = ev
			r.Tracing.NsPerEvent = float64(t.Nanoseconds()) / float64(ev)
			r.Tracing.CPUPercent = 100 * t.Seconds() / secs
		}
	}
	w := &window{prev: prev, cur: cur, secs: secs, rates: rates, drops: r.DropReasons}
	for _, rule := range rules {
		r.Findings = append(r.Findings, rule(w)...)
	}
	return r
}

func (d *Drops) reasons(cur *Snapshot, secs float64) []DropReason {
	out := []DropReason{}
	for k, n := range d.After {
		n -= d.Before[k] // a key absent before counts from zero
		if n == 0 {
			continue
		}
		dr := DropReason{Reason: d.Reasons[k.Reason], Iface: cur.ifname(int(k.Ifindex)),
			Protocol: protocolName(k.L3proto, k.L4proto), Count: n}
		if dr.Reason == "" {
			dr.Reason = fmt.Sprintf("reason %d", k.Reason)
		}
		if dr.Iface == "" {
			dr.Iface = "-"
			if k.Ifindex != 0 {
				dr.Iface = fmt.Sprintf("ifindex %d", k.Ifindex)
			}
		}
		fn, off := d.Symbols.Lookup(k.Location)
		dr.Function, dr.Location = fn, fmt.Sprintf("%s+0x%x", fn, off)
		if secs > 0 {
			dr.Rate = float64(n) / secs
		}
		out = append(out, dr)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Location < out[j].Location
	})
	return out
}

func protocolName(l3 uint16, l4 uint8) string {
	names3 := map[uint16]string{0x0800: "ipv4", 0x86dd: "ipv6", 0x0806: "arp"}
	names4 := map[uint8]string{1: "icmp", 6: "tcp", 17: "udp", 58: "icmpv6"}
	p, ok := names3[l3]
	if !ok {
		return fmt.Sprintf("0x%04x", l3)
	}
	if l3 == 0x0806 || l4 == 0 {
		return p
	}
	if n, ok := names4[l4]; ok {
		return p + "/" + n
	}
	return fmt.Sprintf("%s/%d", p, l4)
}

// Next starts the following window where this one ended.
func (d *Drops) Next() *Drops {
	if d == nil {
		return nil
	}
	return &Drops{Before: d.After, Reasons: d.Reasons, Symbols: d.Symbols, Overhead0: d.Overhead1, Began: d.Ended}
}

package diagnose

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Finding is one named cause of loss, with the counters that show it and
// what to change. IDs are stable: scripts and docs refer to them.
type Finding struct {
	ID       string     `json:"id"`
	Summary  string     `json:"summary"`
	Evidence []Evidence `json:"evidence"`
	Fix      string     `json:"fix"`
	Commands []string   `json:"commands,omitempty"`
}

// Evidence is one counter (or drop reason) behind a finding: its value at
// the end of the window (for a drop reason, its count in the window) and
// its rate per second.
type Evidence struct {
	Name   string  `json:"name"`
	Value  uint64  `json:"value"`
	Rate   float64 `json:"rate"`
	Detail string  `json:"detail,omitempty"`
}

// window is what the rules look at.
type window struct {
	prev, cur *Snapshot
	secs      float64
	rates     map[string]float64
	drops     []DropReason
}

// moving returns the evidence of those counters that moved.
func (w *window) moving(names ...string) []Evidence {
	var out []Evidence
	for _, n := range names {
		if r := w.rates[n]; r > 0 {
			out = append(out, Evidence{Name: n, Value: w.cur.Counters[n], Rate: r})
		}
	}
	return out
}

// matching returns the moving counters whose names match re, sorted.
func (w *window) matching(re *regexp.Regexp) []Evidence {
	var names []string
	for n := range w.rates {
		if re.MatchString(n) {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return w.moving(names...)
}

func (w *window) gauge(name string) Evidence {
	return Evidence{Name: name, Value: w.cur.Gauges[name]}
}

// reasons returns the traced drops with these reasons as evidence.
func (w *window) reasons(reasons ...string) []Evidence {
	var out []Evidence
	for _, d := range w.drops {
		for _, r := range reasons {
			if d.Reason == r {
				out = append(out, Evidence{Name: "drop_reason/" + d.Reason, Value: d.Count, Rate: d.Rate,
					Detail: fmt.Sprintf("%s on %s (%s)", d.Location, d.Iface, d.Protocol)})
			}
		}
	}
	return out
}

func total(ev []Evidence) float64 {
	s := 0.0
	for _, e := range ev {
		s += e.Rate
	}
	return s
}

// pps prints a rate for a summary: "1.2M/s" reads as "1.2 million a second".
func pps(r float64) string {
	switch {
	case r >= 1e6:
		return fmt.Sprintf("%.2fM/s", r/1e6)
	case r >= 1e3:
		return fmt.Sprintf("%.1fk/s", r/1e3)
	}
	return fmt.Sprintf("%.3g/s", r)
}

// rules turn a window into findings, in the order a report lists them:
// from the wire inwards, then the send side.
var rules = []func(*window) []Finding{
	rxRing, xdpDrop, backlogDrops, softnetSqueeze, conntrackFull, netfilterDrop,
	noListener, udpRcvbuf, listenOverflow, udpSndbufQdisc, qdiscDrops,
}

var rxRingCounter = regexp.MustCompile(`^(link/[^/]+/(rx_missed_errors|rx_fifo_errors|rx_over_errors)|ethtool/[^/]+/.*(rx.*(missed|no_?buf|fifo|discard|over|ring)|(missed|no_?buf|fifo|discard|ring).*rx).*)$`)

// rxRing: frames refused before the stack saw them, because the receive
// ring (or, on veth, the peer's ptr_ring) had no room.
func rxRing(w *window) []Finding {
	ev := w.matching(rxRingCounter)
	// veth has no ring registers: frames refused by a full receive
	// ptr_ring count in the receiving device's rx_dropped, which also counts
	// the stack's backlog and unhandled-protocol drops. Only what those do
	// not explain is the ring's.
	backlog := total(w.matching(softnetDropped))
	for _, l := range w.cur.Links {
		name := "link/" + l.Name + "/rx_dropped"
		// softnet's dropped and CPU_BACKLOG count the same drops.
		traced, unhandled := 0.0, 0.0
		for _, d := range w.drops {
			switch {
			case d.Iface != l.Name:
			case d.Reason == "CPU_BACKLOG":
				traced += d.Rate
			case d.Reason == "UNHANDLED_PROTO":
				unhandled += d.Rate
			}
		}
		stack := max(backlog, traced) + unhandled
		if l.Kind == "veth" && w.rates[name] > 1.05*stack {
			e := w.moving(name)[0]
			e.Detail = fmt.Sprintf("the stack explains %.0f/s of it (backlog, unhandled protocol)", stack)
			ev = append(ev, e)
		}
	}
	if len(ev) == 0 {
		return nil
	}
	devs := devicesOf(ev)
	f := Finding{ID: "rx-ring", Evidence: ev,
		Summary: fmt.Sprintf("frames refused at the receive ring of %[2]s at %[1]s: the CPU does not empty it as fast as the wire fills it", pps(total(ev)), strings.Join(devs, ", ")),
		Fix:     "Give the ring more slots, spread receive over more queues and CPUs, and make each packet cheaper: drop the flood at XDP with rampart, before any skb is built. A veth's ring is fixed (256 frames); give it more queues instead."}
	for _, d := range devs {
		for _, l := range w.cur.Links {
			if l.Name == d && l.RxMax > l.Rx {
				f.Commands = append(f.Commands, fmt.Sprintf("ethtool -G %s rx %d", d, l.RxMax))
			}
		}
		f.Commands = append(f.Commands, fmt.Sprintf("ethtool -l %s   # then: ethtool -L %s combined <number of CPUs>", d, d))
	}
	return []Finding{f}
}

// devicesOf gives the interfaces named in link/ and ethtool/ counters.
func devicesOf(ev []Evidence) []string {
	seen := map[string]bool{}
	var out []string
	for _, e := range ev {
		p := strings.Split(e.Name, "/")
		if len(p) >= 3 && (p[0] == "link" || p[0] == "ethtool" || p[0] == "qdisc") && !seen[p[1]] {
			seen[p[1]] = true
			out = append(out, p[1])
		}
	}
	return out
}

var xdpDropCounter = regexp.MustCompile(`^ethtool/[^/]+/.*xdp.*drop.*$`)

// xdpDrop: XDP programs dropping. Drivers recycle the pages of dropped
// frames without an skb, so kfree_skb does not see them (veth, which runs
// XDP on skbs from its peer, is the exception): they come from rampart's
// rule counters and the drivers' XDP statistics.
// rampart at tc is reported as tc-drop.
func xdpDrop(w *window) []Finding {
	var xdp, tc []Evidence
	for name, rule := range w.cur.Rules {
		if rule.Owner != "rampart" {
			continue
		}
		for _, e := range w.moving(name) {
			e.Detail = fmt.Sprintf("rampart rule %q on %s (%s)", rule.Text, rule.Chain, rule.Table)
			if strings.HasPrefix(rule.Table, "xdp") {
				xdp = append(xdp, e)
			} else {
				tc = append(tc, e)
			}
		}
	}
	xdp = append(xdp, w.matching(xdpDropCounter)...)
	sort.Slice(xdp, func(i, j int) bool { return xdp[i].Name < xdp[j].Name })
	sort.Slice(tc, func(i, j int) bool { return tc[i].Name < tc[j].Name })
	fix := "Expected when these are the flood. rampart stats --watch shows which rule drops what; a rule that drops wanted traffic is changed in the policy and re-applied with rampart apply."
	var out []Finding
	if len(xdp) > 0 {
		out = append(out, Finding{ID: "xdp-drop", Evidence: xdp, Fix: fix, Commands: []string{"rampart stats --watch"},
			Summary: fmt.Sprintf("XDP programs drop packets at %s before the stack sees them", pps(rampartOrDriver(xdp)))})
	}
	if len(tc) > 0 {
		out = append(out, Finding{ID: "tc-drop", Evidence: tc, Fix: fix + " XDP would drop them cheaper: rampart apply --mode auto picks it where the driver has it.",
			Commands: []string{"rampart stats --watch"},
			Summary:  fmt.Sprintf("rampart's tc programs drop packets at %s", pps(total(tc)))})
	}
	return out
}

// rampartOrDriver avoids counting one drop twice when both rampart's
// counter and the driver's XDP statistics saw it.
func rampartOrDriver(ev []Evidence) float64 {
	var r, d float64
	for _, e := range ev {
		if strings.HasPrefix(e.Name, "rampart/") {
			r += e.Rate
		} else {
			d += e.Rate
		}
	}
	return max(r, d)
}

var softnetDropped = regexp.MustCompile(`^softnet/cpu\d+/(dropped|flow_limit)$`)
var softnetSqueezed = regexp.MustCompile(`^softnet/cpu\d+/time_squeeze$`)

// backlogDrops: the per-CPU backlog queue (RPS, netif_rx, veth without
// NAPI) was full: netdev_max_backlog.
func backlogDrops(w *window) []Finding {
	ev := w.matching(softnetDropped)
	if len(ev) == 0 {
		return nil
	}
	rate := total(ev)
	ev = append(ev, w.reasons("CPU_BACKLOG")...)
	cur := w.cur.Sysctl["net.core.netdev_max_backlog"]
	return []Finding{{ID: "backlog-drops", Evidence: ev,
		Summary: fmt.Sprintf("a CPU's input backlog was full: packets dropped at %s (net.core.netdev_max_backlog = %d)", pps(rate), cur),
		Fix:     "Let the backlog hold more, and spread the work: a longer backlog absorbs bursts; RPS or more RSS queues share the load between CPUs.",
		Commands: []string{fmt.Sprintf("sysctl -w net.core.netdev_max_backlog=%d", max(2*cur, 10000)),
			"echo <cpu mask> > /sys/class/net/<iface>/queues/rx-0/rps_cpus"}}}
}

// softnetSqueeze: the receive softirq ran out of budget or time with
// packets left.
func softnetSqueeze(w *window) []Finding {
	ev := w.matching(softnetSqueezed)
	if len(ev) == 0 {
		return nil
	}
	budget, usecs := w.cur.Sysctl["net.core.netdev_budget"], w.cur.Sysctl["net.core.netdev_budget_usecs"]
	return []Finding{{ID: "softnet-squeeze", Evidence: ev,
		Summary: fmt.Sprintf("the receive softirq ran out of budget with packets left, %s times (net.core.netdev_budget = %d, netdev_budget_usecs = %d); the rings fill meanwhile", pps(total(ev)), budget, usecs),
		Fix:     "Give the softirq more budget per run, spread receive over more CPUs (RSS queues, RPS), or make each packet cheaper by dropping the flood at XDP with rampart.",
		Commands: []string{fmt.Sprintf("sysctl -w net.core.netdev_budget=%d net.core.netdev_budget_usecs=%d", max(2*budget, 600), max(2*usecs, 8000)),
			"echo <cpu mask> > /sys/class/net/<iface>/queues/rx-0/rps_cpus"}}}
}

// conntrackFull: new flows refused because the connection tracking table
// was full.
func conntrackFull(w *window) []Finding {
	ev := w.moving("conntrack/drop", "conntrack/early_drop", "conntrack/insert_failed")
	count, limit := w.cur.Gauges["conntrack/count"], w.cur.Gauges["conntrack/max"]
	if len(ev) == 0 && (limit == 0 || count*100 < limit*95) {
		return nil
	}
	ev = append(ev, w.gauge("conntrack/count"), w.gauge("conntrack/max"))
	ev = append(ev, w.reasons("NETFILTER_DROP")...)
	return []Finding{{ID: "conntrack-full", Evidence: ev,
		Summary: fmt.Sprintf("the conntrack table is full (%d of %d entries): new flows are dropped (%s)", count, limit, pps(w.rates["conntrack/drop"])),
		Fix:     "Do not track the flooded service: a flood of new flows fills any table. Exempt it in the raw table (or nft: notrack in a prerouting chain at priority raw). Or raise the table's size, and its hash with it.",
		Commands: []string{"iptables -t raw -A PREROUTING -p udp --dport <port> -j CT --notrack",
			fmt.Sprintf("sysctl -w net.netfilter.nf_conntrack_max=%d", 2*max(limit, 1)),
			fmt.Sprintf("echo %d > /sys/module/nf_conntrack/parameters/hashsize", max(limit, 1)/2)}}}
}

// netfilterDrop: iptables rules (or chain policies) dropping, and
// NETFILTER_DROP drops that conntrack does not account for.
func netfilterDrop(w *window) []Finding {
	var ev []Evidence
	for name, rule := range w.cur.Rules {
		if rule.Owner == "rampart" {
			continue
		}
		for _, e := range w.moving(name) {
			e.Detail = fmt.Sprintf("%s -t %s: %s", rule.Owner, rule.Table, rule.Text)
			ev = append(ev, e)
		}
	}
	sort.Slice(ev, func(i, j int) bool { return ev[i].Rate > ev[j].Rate })
	// NETFILTER_DROP also counts conntrack's own drops: a full table's, and
	// the inserts that lose a race (insert_failed, frequent when two CPUs
	// take new flows of one tuple at once).
	reasons := w.reasons("NETFILTER_DROP")
	ct := w.rates["conntrack/drop"] + w.rates["conntrack/insert_failed"]
	byRules, byReason := total(ev), total(reasons)-ct
	if byReason < 0.05*total(reasons) { // the tracer and the counters are read moments apart
		byReason = 0
	}
	if byRules == 0 && byReason <= 0 {
		return nil
	}
	summary := fmt.Sprintf("netfilter drops packets at %s", pps(max(byRules, byReason)))
	var cmds []string
	if len(ev) > 0 {
		top := w.cur.Rules[ev[0].Name]
		summary += fmt.Sprintf(", most in %s table %s chain %s: %s", top.Owner, top.Table, top.Chain, top.Text)
		if n := strings.Split(ev[0].Name, "/"); n[len(n)-1] != "policy" {
			cmds = append(cmds, fmt.Sprintf("%s -t %s -D %s %s   # if the rule drops wanted traffic", strings.TrimSuffix(top.Owner, "-legacy"), top.Table, top.Chain, n[len(n)-1]))
		}
	} else {
		summary += " (nf_hook_slow: an nftables rule, or an iptables rule whose counters were not readable)"
		cmds = append(cmds, "nft list ruleset")
	}
	return []Finding{{ID: "netfilter-drop", Evidence: append(ev, reasons...), Summary: summary, Commands: cmds,
		Fix: "If these packets are the flood, drop them before netfilter: rampart at XDP costs a fraction of an iptables rule per packet. If they are wanted, remove or narrow the rule."}}
}

// noListener: packets for ports nothing listens on; each costs a lookup and
// an ICMP port unreachable or a RST.
func noListener(w *window) []Finding {
	counters, reasons := w.moving("UdpNoPorts", "Udp6NoPorts"), w.reasons("NO_SOCKET")
	if len(counters)+len(reasons) == 0 {
		return nil
	}
	// UdpNoPorts and NO_SOCKET count the same UDP datagrams; NO_SOCKET
	// adds TCP segments.
	return []Finding{{ID: "no-listener", Evidence: append(counters, reasons...),
		Summary:  fmt.Sprintf("packets arrive at %s for ports nothing listens on", pps(max(total(counters), total(reasons)))),
		Fix:      "If this traffic is unwanted (a flood, a scan), drop it with a rampart rule for those ports before the stack looks up a socket and answers each packet; if a service should be listening, start it.",
		Commands: []string{"ss -lunp   # what listens", "rampart apply <policy with: {proto: udp, dport: <ports>, action: drop}>"}}}
}

// udpRcvbuf: datagrams dropped because the socket's receive queue was full.
func udpRcvbuf(w *window) []Finding {
	ev := w.moving("UdpRcvbufErrors", "Udp6RcvbufErrors")
	if len(ev) == 0 {
		return nil
	}
	rate := total(ev)
	ev = append(ev, w.moving("UdpInErrors", "Udp6InErrors", "UdpInDatagrams", "Udp6InDatagrams")...)
	ev = append(ev, w.reasons("SOCKET_RCVBUFF")...)
	rmax := w.cur.Sysctl["net.core.rmem_max"]
	want := max(4*rmax, 8<<20)
	return []Finding{{ID: "udp-rcvbuf", Evidence: ev,
		Summary: fmt.Sprintf("UDP sockets drop datagrams at %s: their receive buffers are full (net.core.rmem_max = %d)", pps(rate), rmax),
		Fix:     "The application reads slower than datagrams arrive. Give its socket a bigger SO_RCVBUF (capped by net.core.rmem_max), read faster (more threads with SO_REUSEPORT, recvmmsg), or drop the unwanted part of the traffic earlier with rampart so the socket only gets what it must read.",
		Commands: []string{fmt.Sprintf("sysctl -w net.core.rmem_max=%d net.core.rmem_default=%d", want, want),
			"ss -lump   # each socket's receive queue (Recv-Q) and buffer (rb)"}}}
}

// listenOverflow: TCP connections refused because the listener's accept
// queue was full.
func listenOverflow(w *window) []Finding {
	ev := w.moving("TcpExtListenOverflows", "TcpExtListenDrops")
	if len(ev) == 0 {
		return nil
	}
	ev = append(ev, w.reasons("TCP_LISTEN_OVERFLOW")...)
	somax := w.cur.Sysctl["net.core.somaxconn"]
	return []Finding{{ID: "listen-overflow", Evidence: ev,
		Summary: fmt.Sprintf("TCP listeners drop connection attempts at %s: their accept queues are full (net.core.somaxconn = %d)", pps(max(w.rates["TcpExtListenDrops"], w.rates["TcpExtListenOverflows"])), somax),
		Fix:     "The application accepts slower than connections arrive, or its listen() backlog is small. Raise the backlog (the application's listen() argument, capped by net.core.somaxconn) and accept faster. Under a SYN flood, keep net.ipv4.tcp_syncookies=1 and drop the flood's sources with rampart.",
		Commands: []string{fmt.Sprintf("sysctl -w net.core.somaxconn=%d net.ipv4.tcp_max_syn_backlog=%d", max(2*somax, 4096), max(2*somax, 4096)),
			"ss -lnt   # Recv-Q: connections waiting for accept(), Send-Q: the backlog"}}}
}

// udpSndbufQdisc: sends failing with ENOBUFS because the egress qdisc
// refused the packet — the socket buffer is not the problem.
func udpSndbufQdisc(w *window) []Finding {
	snd := w.moving("UdpSndbufErrors", "Udp6SndbufErrors")
	if len(snd) == 0 {
		return nil
	}
	qs := w.droppingQdiscs()
	if len(qs) == 0 {
		return []Finding{{ID: "udp-sndbuf", Evidence: snd,
			Summary:  fmt.Sprintf("UDP sends fail (%s) because socket send buffers are full (net.core.wmem_max = %d)", pps(total(snd)), w.cur.Sysctl["net.core.wmem_max"]),
			Fix:      "The application sends faster than the device drains: pace the sender, or give its socket a bigger SO_SNDBUF (capped by net.core.wmem_max).",
			Commands: []string{fmt.Sprintf("sysctl -w net.core.wmem_max=%d", max(4*w.cur.Sysctl["net.core.wmem_max"], 8<<20))}}}
	}
	ev := append(snd, w.moving("IpOutDiscards", "Ip6OutDiscards")...)
	var where []string
	var cmds []string
	for _, q := range qs {
		ev = append(ev, w.qdiscEvidence(q)...)
		where = append(where, qdiscWhy(w, q))
		cmds = append(cmds, qdiscCommand(w, q))
	}
	ev = append(ev, w.reasons("QDISC_DROP", "QDISC_OVERLIMIT", "QDISC_CONGESTED", "FQ_FLOW_LIMIT", "FQ_BAND_LIMIT", "FQ_HORIZON_LIMIT")...)
	return []Finding{{ID: "udp-sndbuf-qdisc", Evidence: ev, Commands: cmds,
		Summary: fmt.Sprintf("UDP sends fail with ENOBUFS (UdpSndbufErrors %s) — not for want of socket buffer: %s", pps(total(snd)), strings.Join(where, "; ")),
		Fix:     "The egress qdisc refuses packets the socket buffer still allows. Make the qdisc's limit (per flow, for fq) hold at least what one socket's send buffer can queue, or pace the sender."}}
}

// qdiscDrops: qdiscs dropping where no UDP send failed (forwarded traffic,
// TCP, raw sockets).
func qdiscDrops(w *window) []Finding {
	if len(w.moving("UdpSndbufErrors", "Udp6SndbufErrors")) > 0 {
		return nil // udp-sndbuf-qdisc covers these
	}
	var out []Finding
	for _, q := range w.droppingQdiscs() {
		ev := append(w.qdiscEvidence(q), w.reasons("QDISC_DROP", "QDISC_OVERLIMIT", "QDISC_CONGESTED", "FQ_FLOW_LIMIT", "FQ_BAND_LIMIT", "FQ_HORIZON_LIMIT")...)
		out = append(out, Finding{ID: "qdisc-drops", Evidence: ev, Commands: []string{qdiscCommand(w, q)},
			Summary: qdiscWhy(w, q),
			Fix:     "The queue overflows: raise its limit if the bursts are legitimate, or find what sends faster than the link (or the shaper's rate) drains."})
	}
	return out
}

func (w *window) droppingQdiscs() []Qdisc {
	var out []Qdisc
	for _, q := range w.cur.Qdiscs {
		if w.rates[qdiscPrefix(q)+"drops"] > 0 {
			out = append(out, q)
		}
	}
	return out
}

func qdiscPrefix(q Qdisc) string { return "qdisc/" + q.Iface + "/" + q.Handle + "/" }

func (w *window) qdiscEvidence(q Qdisc) []Evidence {
	p := qdiscPrefix(q)
	ev := w.moving(p+"drops", p+"overlimits", p+"requeues", p+"flows_plimit", p+"drop_overlimit", p+"horizon_drops")
	return append(ev, w.gauge(p+"backlog"), w.gauge(p+"qlen"))
}

func qdiscWhy(w *window, q Qdisc) string {
	p := qdiscPrefix(q)
	s := fmt.Sprintf("qdisc %s %s on %s drops packets at %s", q.Kind, q.Handle, q.Iface, pps(w.rates[p+"drops"]))
	if r := w.rates[p+"flows_plimit"]; r > 0 {
		s += fmt.Sprintf(", %s of them because one flow had flow_limit = %d packets queued (flows_plimit)", pps(r), q.FlowLimit)
	} else if q.Limit > 0 {
		s += fmt.Sprintf(" at its limit of %d %s", q.Limit, q.LimitUnit)
	}
	return s
}

// qdiscCommand proposes a limit that holds one full send buffer of the
// qdisc's average packet, at least twice the current one.
func qdiscCommand(w *window, q Qdisc) string {
	where := fmt.Sprintf("dev %s root", q.Iface)
	if q.Parent != "root" {
		where = fmt.Sprintf("dev %s parent %s handle %s", q.Iface, q.Parent, q.Handle)
	}
	avg := uint64(1500)
	if q.Packets > 0 && q.Bytes/q.Packets > 0 {
		avg = q.Bytes / q.Packets
	}
	sndbuf := max(w.cur.Sysctl["net.core.wmem_max"], w.cur.Sysctl["net.core.wmem_default"], 212992)
	packets := func(cur uint64) uint64 { return max(2*cur, (sndbuf+avg-1)/avg) }
	switch q.Kind {
	case "fq":
		return fmt.Sprintf("tc qdisc change %s fq flow_limit %d limit %d", where, packets(q.FlowLimit), max(q.Limit, 2*packets(q.FlowLimit)))
	case "pfifo":
		return fmt.Sprintf("tc qdisc change %s pfifo limit %d", where, packets(q.Limit))
	case "bfifo":
		return fmt.Sprintf("tc qdisc change %s bfifo limit %d", where, max(2*q.Limit, sndbuf))
	case "tbf":
		return fmt.Sprintf("tc qdisc change %s tbf limit %d rate <its rate> burst <its burst>   # tc -s qdisc show dev %s", where, max(2*q.Limit, sndbuf), q.Iface)
	case "pfifo_fast", "pfifo_head_drop":
		return fmt.Sprintf("ip link set dev %s txqueuelen %d", q.Iface, packets(1000))
	}
	return fmt.Sprintf("tc -s qdisc show dev %s   # then raise the limit of %s %s", q.Iface, q.Kind, q.Handle)
}

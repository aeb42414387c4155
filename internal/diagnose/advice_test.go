package diagnose

import (
	"strings"
	"testing"
	"time"
)

// pair builds two snapshots one second apart: before holds the counters'
// first values, after their second. Everything else comes from cur.
func pair(before, after Counters, cur Snapshot) (*Snapshot, *Snapshot) {
	t0 := time.Unix(1000, 0)
	prev := &Snapshot{Time: t0, Counters: before, Gauges: cur.Gauges}
	cur.Time, cur.Counters = t0.Add(time.Second), after
	if cur.Gauges == nil {
		cur.Gauges = Counters{}
	}
	return prev, &cur
}

func ids(r *Report) []string {
	var out []string
	for _, f := range r.Findings {
		out = append(out, f.ID)
	}
	return out
}

func only(t *testing.T, r *Report, id string) Finding {
	t.Helper()
	if len(r.Findings) != 1 || r.Findings[0].ID != id {
		t.Fatalf("findings %v, want only %s", ids(r), id)
	}
	return r.Findings[0]
}

// The incident of the blog post "UDP SndbufErrors & ENOBUFS": fq's flow_limit of 100 below what a 212,992
// byte send buffer of 1,400-byte packets queues; UdpSndbufErrors in step
// with IpOutDiscards and flows_plimit.
func TestAdviceFqFlowLimit(t *testing.T) {
	fq := Qdisc{Ifindex: 2, Iface: "eth0", Kind: "fq", Handle: "8001:", Parent: "root",
		Packets: 1_000_000, Bytes: 1_400_000_000, Limit: 10000, LimitUnit: "packets", FlowLimit: 100}
	prev, cur := pair(
		Counters{"UdpSndbufErrors": 1000, "IpOutDiscards": 1000, "qdisc/eth0/8001:/drops": 1000, "qdisc/eth0/8001:/flows_plimit": 1000},
		Counters{"UdpSndbufErrors": 6000, "IpOutDiscards": 6000, "qdisc/eth0/8001:/drops": 6000, "qdisc/eth0/8001:/flows_plimit": 6000},
		Snapshot{Qdiscs: []Qdisc{fq}, Sysctl: map[string]uint64{"net.core.wmem_max": 212992, "net.core.wmem_default": 212992}})
	f := only(t, Build(prev, cur, nil, false), "udp-sndbuf-qdisc")
	if !strings.Contains(f.Summary, "flow_limit = 100") || !strings.Contains(f.Summary, "5.0k/s") {
		t.Errorf("summary %q", f.Summary)
	}
	// 212992 / 1400 = 152.1: the proposal holds a whole buffer, and at
	// least doubles the limit.
	if len(f.Commands) != 1 || f.Commands[0] != "tc qdisc change dev eth0 root fq flow_limit 200 limit 10000" {
		t.Errorf("commands %q", f.Commands)
	}
	names := map[string]float64{}
	for _, e := range f.Evidence {
		names[e.Name] = e.Rate
	}
	for _, n := range []string{"UdpSndbufErrors", "IpOutDiscards", "qdisc/eth0/8001:/drops", "qdisc/eth0/8001:/flows_plimit"} {
		if names[n] != 5000 {
			t.Errorf("evidence %s at %v/s, want 5000", n, names[n])
		}
	}
}

func TestAdviceQuiet(t *testing.T) {
	c := Counters{"UdpInDatagrams": 10, "UdpRcvbufErrors": 3, "softnet/cpu0/dropped": 7}
	prev, cur := pair(c, Counters{"UdpInDatagrams": 500, "UdpRcvbufErrors": 3, "softnet/cpu0/dropped": 7},
		Snapshot{Gauges: Counters{"conntrack/count": 10, "conntrack/max": 1000}})
	r := Build(prev, cur, nil, false)
	if len(r.Findings) != 0 {
		t.Fatalf("findings %v from traffic without drops", ids(r))
	}
	if len(r.Counters) != 2 || r.Counters[0].Name != "UdpInDatagrams" || r.Counters[0].Rate != 490 {
		t.Errorf("moving counters %+v, want UdpInDatagrams and the conntrack count", r.Counters)
	}
	if all := Build(prev, cur, nil, true); len(all.Counters) != 5 {
		t.Errorf("--all shows %d counters, want 5", len(all.Counters))
	}
}

// A table at 95% is reported before it drops.
func TestAdviceConntrackNearlyFull(t *testing.T) {
	prev, cur := pair(Counters{}, Counters{}, Snapshot{Gauges: Counters{"conntrack/count": 980, "conntrack/max": 1000}})
	f := only(t, Build(prev, cur, nil, false), "conntrack-full")
	if !strings.Contains(f.Summary, "980 of 1000") || !strings.Contains(strings.Join(f.Commands, " "), "nf_conntrack_max=2000") {
		t.Errorf("finding %+v", f)
	}
}

// NETFILTER_DROP that conntrack's own drops explain is not a netfilter
// finding; the rest is, even without an iptables rule to name.
func TestAdviceNetfilterResidue(t *testing.T) {
	drop := func(rate float64) []DropReason {
		return []DropReason{{Reason: "NETFILTER_DROP", Location: "nf_hook_slow+0x7d", Iface: "eth0", Protocol: "ipv4/udp", Count: uint64(rate), Rate: rate}}
	}
	prev, cur := pair(Counters{"conntrack/drop": 0}, Counters{"conntrack/drop": 1000},
		Snapshot{Gauges: Counters{"conntrack/count": 64, "conntrack/max": 64}})
	w := &window{prev: prev, cur: cur, secs: 1, rates: Rates(prev.Counters, cur.Counters, 1), drops: drop(1020)}
	if f := netfilterDrop(w); f != nil {
		t.Errorf("conntrack's drops reported as netfilter-drop: %+v", f)
	}
	w.drops = drop(3000)
	f := netfilterDrop(w)
	if len(f) != 1 || !strings.Contains(f[0].Summary, "2.0k/s") || f[0].Commands[0] != "nft list ruleset" {
		t.Errorf("unexplained NETFILTER_DROP: %+v", f)
	}
}

// A veth's rx_dropped that backlog drops explain is not the ring's.
func TestAdviceVethRxDropped(t *testing.T) {
	links := []Link{{Name: "veth0", Index: 2, Kind: "veth"}}
	prev, cur := pair(Counters{"link/veth0/rx_dropped": 0, "softnet/cpu1/dropped": 0},
		Counters{"link/veth0/rx_dropped": 500, "softnet/cpu1/dropped": 500}, Snapshot{Links: links})
	only(t, Build(prev, cur, nil, false), "backlog-drops")

	prev, cur = pair(Counters{"link/veth0/rx_dropped": 0}, Counters{"link/veth0/rx_dropped": 500}, Snapshot{Links: links})
	f := only(t, Build(prev, cur, nil, false), "rx-ring")
	if !strings.Contains(f.Summary, "veth0") {
		t.Errorf("summary %q", f.Summary)
	}
}

// A NIC's ring: the driver's own counter, and a command to grow the ring
// to the maximum the driver reports.
func TestAdviceNICRing(t *testing.T) {
	links := []Link{{Name: "eth0", Index: 2, Kind: "device", Rx: 512, RxMax: 4096}}
	prev, cur := pair(Counters{"ethtool/eth0/rx_missed_errors": 10, "ethtool/eth0/rx_packets": 0},
		Counters{"ethtool/eth0/rx_missed_errors": 110, "ethtool/eth0/rx_packets": 1e6}, Snapshot{Links: links})
	f := only(t, Build(prev, cur, nil, false), "rx-ring")
	if f.Commands[0] != "ethtool -G eth0 rx 4096" {
		t.Errorf("commands %q", f.Commands)
	}
}

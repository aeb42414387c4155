package diagnose

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/safchain/ethtool"
	"github.com/vishvananda/netlink"

	"github.com/rampart-fw/rampart/internal/engine"
	"github.com/rampart-fw/rampart/internal/netns"
	"github.com/rampart-fw/rampart/internal/snmp"
)

// Snapshot is everything diagnose reads, at one instant. Counters only grow
// and are compared as rates; Gauges are levels read as they are.
//
// Counter names: the /proc/net/{snmp,netstat,snmp6} ones as nstat prints
// them (UdpRcvbufErrors); the others as source/subject/field:
// softnet/cpu0/dropped, link/eth0/rx_dropped, qdisc/eth0/8001:/drops,
// ethtool/eth0/rx_missed, conntrack/drop,
// iptables-legacy/filter/INPUT/1, rampart/eth0/ingress/flood.
type Snapshot struct {
	Time     time.Time
	Counters Counters
	Gauges   Counters
	Qdiscs   []Qdisc
	Links    []Link
	Softnet  []Softnet
	Sysctl   map[string]uint64
	// Rules are the firewall rules that drop (iptables DROP and REJECT
	// targets and DROP policies) and rampart's, keyed by counter name.
	Rules map[string]Rule
	// Missing says which sources could not be read, and why.
	Missing []string
}

// Link is one interface.
type Link struct {
	Name  string `json:"name"`
	Index int    `json:"index"`
	Kind  string `json:"kind"`          // veth, device, bond…
	XDP   string `json:"xdp,omitempty"` // attach mode of an XDP program: native, generic, offload
	RxMax uint32 `json:"rx_ring_max,omitempty"`
	Rx    uint32 `json:"rx_ring,omitempty"`
}

// Rule is a firewall rule that drops, as its owner prints it.
type Rule struct {
	Owner string `json:"owner"` // iptables-legacy, ip6tables-nft, rampart, …
	Table string `json:"table"` // filter, raw…; rampart: the hook mode
	Chain string `json:"chain"` // INPUT…; rampart: iface/direction
	Text  string `json:"rule"`
}

// Options chooses what a snapshot covers.
type Options struct {
	Netns string // named network namespace, "" for the current one
	Iface string // only this interface's link, qdisc and ethtool counters
	// Rampart, when set, is the firewall of the namespace, for its rule
	// counters.
	Rampart *engine.Firewall
}

// sysctls the advice quotes. The per-namespace ones are read inside the
// namespace; the host-wide ones (net.core.netdev_*, rmem_max…) exist only
// in the initial one and are read from there.
var sysctls = []string{
	"net.core.rmem_default", "net.core.rmem_max", "net.core.wmem_default", "net.core.wmem_max",
	"net.core.netdev_max_backlog", "net.core.netdev_budget", "net.core.netdev_budget_usecs",
	"net.core.somaxconn", "net.ipv4.tcp_max_syn_backlog",
	"net.netfilter.nf_conntrack_max", "net.netfilter.nf_conntrack_buckets",
}

// Collect takes one snapshot. A source that cannot be read is named in
// Missing; only a failure to enter the namespace is an error.
func Collect(o Options) (*Snapshot, error) {
	s := &Snapshot{Counters: Counters{}, Gauges: Counters{}, Sysctl: map[string]uint64{}, Rules: map[string]Rule{}}
	miss := func(what string, err error) { s.Missing = append(s.Missing, fmt.Sprintf("%s: %v", what, err)) }
	err := netns.Run(o.Netns, func() error {
		s.Time = time.Now()
		// thread-self: the namespace of this (locked) thread, not of the
		// process's first thread as /proc/self/net would give.
		if err := snmp.ReadThread(s.Counters); err != nil {
			miss("protocol counters", err)
		}
		if f, err := os.Open("/proc/thread-self/net/softnet_stat"); err != nil {
			miss("softnet_stat", err)
		} else {
			s.Softnet, err = ParseSoftnet(f)
			f.Close()
			if err != nil {
				miss("softnet_stat", err)
			}
			for _, c := range s.Softnet {
				p := fmt.Sprintf("softnet/cpu%d/", c.CPU)
				s.Counters[p+"dropped"], s.Counters[p+"time_squeeze"], s.Counters[p+"flow_limit"] = c.Dropped, c.TimeSqueeze, c.FlowLimit
			}
		}
		s.collectLinks(o.Iface, miss)
		if qs, err := Qdiscs(); err != nil {
			miss("qdiscs", err)
		} else {
			s.addQdiscs(qs, o.Iface)
		}
		s.collectConntrack(miss)
		s.readSysctls()
		return nil
	})
	if err != nil {
		return nil, err
	}
	if o.Iface != "" && len(s.Links) == 0 && !s.missing("links") {
		return nil, fmt.Errorf("no interface %q here (ip link lists them; --netns chooses the namespace)", o.Iface)
	}
	s.readSysctls() // the host-wide ones the namespace does not show
	s.collectIptables(o.Netns)
	if o.Rampart != nil {
		if err := s.addRampart(o.Rampart); err != nil {
			miss("rampart counters", err)
		}
	}
	return s, nil
}

func (s *Snapshot) missing(source string) bool {
	for _, m := range s.Missing {
		if strings.HasPrefix(m, source+":") {
			return true
		}
	}
	return false
}

func (s *Snapshot) collectLinks(only string, miss func(string, error)) {
	links, err := netlink.LinkList()
	if err != nil {
		miss("links", err)
		return
	}
	et, err := ethtool.NewEthtool()
	if err != nil {
		miss("ethtool", err)
	} else {
		defer et.Close()
	}
	for _, l := range links {
		a := l.Attrs()
		if only != "" && a.Name != only {
			continue
		}
		link := Link{Name: a.Name, Index: a.Index, Kind: l.Type()}
		if a.Xdp != nil && a.Xdp.Attached {
			link.XDP = map[uint32]string{1: "generic", 2: "native", 3: "offload", 4: "multi"}[a.Xdp.AttachMode]
		}
		if st := a.Statistics; st != nil {
			p := "link/" + a.Name + "/"
			for name, v := range map[string]uint64{
				"rx_packets": st.RxPackets, "tx_packets": st.TxPackets,
				"rx_dropped": st.RxDropped, "tx_dropped": st.TxDropped,
				"rx_errors": st.RxErrors, "tx_errors": st.TxErrors,
				"rx_fifo_errors": st.RxFifoErrors, "tx_fifo_errors": st.TxFifoErrors,
				"rx_missed_errors": st.RxMissedErrors, "rx_over_errors": st.RxOverErrors,
				"rx_crc_errors": st.RxCrcErrors, "rx_length_errors": st.RxLengthErrors,
				"tx_carrier_errors": st.TxCarrierErrors, "tx_aborted_errors": st.TxAbortedErrors,
			} {
				s.Counters[p+name] = v
			}
		}
		// Driver statistics (ethtool -S): a device without them is not an
		// error, so failures are silent.
		if et != nil && a.Name != "lo" {
			if st, err := et.Stats(a.Name); err == nil {
				for name, v := range st {
					s.Counters["ethtool/"+a.Name+"/"+name] = v
				}
			}
			if r, err := et.GetRing(a.Name); err == nil {
				link.Rx, link.RxMax = r.RxPending, r.RxMaxPending
			}
		}
		s.Links = append(s.Links, link)
	}
}

func (s *Snapshot) ifname(index int) string {
	for _, l := range s.Links {
		if l.Index == index {
			return l.Name
		}
	}
	return ""
}

func (s *Snapshot) addQdiscs(qs []Qdisc, only string) {
	for _, q := range qs {
		q.Iface = s.ifname(q.Ifindex)
		if q.Iface == "" { // filtered out, or gone since the link dump
			continue
		}
		p := "qdisc/" + q.Iface + "/" + q.Handle + "/"
		s.Counters[p+"drops"], s.Counters[p+"overlimits"], s.Counters[p+"requeues"] = q.Drops, q.Overlimits, q.Requeues
		s.Counters[p+"packets"] = q.Packets
		for k, v := range q.Extra {
			s.Counters[p+k] = v
		}
		s.Gauges[p+"backlog"], s.Gauges[p+"qlen"] = q.Backlog, q.Qlen
		s.Qdiscs = append(s.Qdiscs, q)
	}
}

// collectConntrack reads the table's fill and, from
// /proc/net/stat/nf_conntrack, its per-CPU event counters summed. Nothing
// is missing when conntrack is not loaded.
func (s *Snapshot) collectConntrack(miss func(string, error)) {
	count, err := readUint("/proc/sys/net/netfilter/nf_conntrack_count")
	if err != nil {
		return
	}
	s.Gauges["conntrack/count"] = count
	if max, err := readUint("/proc/sys/net/netfilter/nf_conntrack_max"); err == nil {
		s.Gauges["conntrack/max"] = max
	}
	f, err := os.Open("/proc/thread-self/net/stat/nf_conntrack")
	if err != nil {
		miss("conntrack statistics", err)
		return
	}
	defer f.Close()
	if err := ParseConntrackStat(f, s.Counters); err != nil {
		miss("conntrack statistics", err)
	}
}

// ParseConntrackStat sums the per-CPU lines of /proc/net/stat/nf_conntrack
// (a header of names, then hex columns) into conntrack/<name> counters.
// "entries" is a level, repeated on every line, and is left out.
func ParseConntrackStat(r io.Reader, into Counters) error {
	sc := bufio.NewScanner(r)
	if !sc.Scan() {
		return fmt.Errorf("no header: %w", sc.Err())
	}
	names := strings.Fields(sc.Text())
	sums := make([]uint64, len(names))
	for line := 2; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) != len(names) {
			return fmt.Errorf("line %d: %d columns for %d names", line, len(f), len(names))
		}
		for i, v := range f {
			n, err := strconv.ParseUint(v, 16, 64)
			if err != nil {
				return fmt.Errorf("line %d %s: %w", line, names[i], err)
			}
			sums[i] += n
		}
	}
	for i, n := range names {
		if n != "entries" {
			into["conntrack/"+n] = sums[i]
		}
	}
	return sc.Err()
}

func (s *Snapshot) readSysctls() {
	for _, name := range sysctls {
		if _, ok := s.Sysctl[name]; ok {
			continue
		}
		if v, err := readUint(filepath.Join("/proc/sys", strings.ReplaceAll(name, ".", "/"))); err == nil {
			s.Sysctl[name] = v
		}
	}
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("%s is empty", path)
	}
	return strconv.ParseUint(f[0], 10, 64)
}

// collectIptables reads the counters of every rule that drops, from each
// iptables variant installed (legacy and nft keep separate rule sets).
func (s *Snapshot) collectIptables(netns string) {
	for _, tool := range []string{"iptables-legacy-save", "ip6tables-legacy-save", "iptables-nft-save", "ip6tables-nft-save"} {
		path, err := exec.LookPath(tool)
		if err != nil {
			continue
		}
		args := []string{path, "-c"}
		if netns != "" {
			args = append([]string{"ip", "netns", "exec", netns}, args...)
		}
		out, err := exec.Command(args[0], args[1:]...).Output()
		if err != nil {
			s.Missing = append(s.Missing, fmt.Sprintf("%s: %v", tool, err))
			continue
		}
		owner := strings.TrimSuffix(tool, "-save")
		for name, r := range ParseIptablesSave(owner, string(out)) {
			s.Counters[name] = r.packets
			s.Rules[name] = r.Rule
		}
	}
}

type countedRule struct {
	Rule
	packets uint64
}

// ParseIptablesSave reads `iptables-save -c` output and returns the rules
// that drop (DROP or REJECT targets, DROP chain policies) with their packet
// counters, named owner/table/chain/N (N counts the chain's rules from 1,
// as --line-numbers does; "policy" for the chain's policy).
func ParseIptablesSave(owner, text string) map[string]countedRule {
	out := map[string]countedRule{}
	table := ""
	index := map[string]int{}
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			table = line[1:]
			index = map[string]int{}
		case strings.HasPrefix(line, ":"): // :INPUT DROP [12:345]
			f := strings.Fields(line[1:])
			if len(f) == 3 && f[1] == "DROP" {
				out[owner+"/"+table+"/"+f[0]+"/policy"] = countedRule{
					Rule{owner, table, f[0], "policy DROP"}, counterOf(f[2])}
			}
		case strings.HasPrefix(line, "["): // [12:345] -A INPUT … -j DROP
			counter, rule, ok := strings.Cut(line, " ")
			f := strings.Fields(rule)
			if !ok || len(f) < 2 || f[0] != "-A" {
				continue
			}
			chain := f[1]
			index[chain]++
			target := ""
			for i := 2; i+1 < len(f); i++ {
				if f[i] == "-j" {
					target = f[i+1]
				}
			}
			if target == "DROP" || target == "REJECT" {
				name := fmt.Sprintf("%s/%s/%s/%d", owner, table, chain, index[chain])
				out[name] = countedRule{Rule{owner, table, chain, rule}, counterOf(counter)}
			}
		}
	}
	return out
}

func counterOf(s string) uint64 {
	p, _, _ := strings.Cut(strings.Trim(s, "[]"), ":")
	n, _ := strconv.ParseUint(p, 10, 64)
	return n
}

func (s *Snapshot) addRampart(fw *engine.Firewall) error {
	hooks, err := fw.Status()
	if err != nil {
		return err
	}
	snap, err := fw.Stats()
	if err != nil {
		return err
	}
	mode := map[string]string{}
	for _, h := range hooks {
		mode[h.Iface+"/"+h.Direction] = string(h.Mode)
	}
	for _, r := range snap.Rows {
		if r.Action != "drop" {
			continue
		}
		chain := r.Iface + "/" + r.Direction
		name := "rampart/" + chain + "/" + r.Name
		s.Counters[name] = r.Packets
		s.Rules[name] = Rule{Owner: "rampart", Table: mode[chain], Chain: chain, Text: r.Name}
	}
	return nil
}

// NetnsInode is the nsfs inode of a named namespace ("" for this process's),
// which is how the tracer recognises it.
func NetnsInode(name string) (uint32, error) {
	path := "/proc/self/ns/net"
	if name != "" {
		path = filepath.Join("/run/netns", name)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("network namespace %q: %w", name, err)
	}
	return uint32(st.Ino), nil
}

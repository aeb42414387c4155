package drop

import (
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/lab"
	"github.com/rampart-fw/rampart/internal/netns"
	"github.com/rampart-fw/rampart/internal/stats"
)

// A layer is one row of the study: what to set up in the receiving
// namespace so that the flood is dropped there, and the layer's own count of
// what it dropped.
type layer struct {
	name  string
	study float64 // Mpps the study measured (IPv4), 0 when it has no such row
	tools []string
	setup func(r *row) (*active, error)
}

// active is a layer while it runs.
type active struct {
	count    func() (uint64, error)
	teardown func() error
	mode     string // where the drop happens, when it is worth saying
}

// row is what a layer's setup works with: one family's flood into a fresh
// topology.
type row struct {
	topo    *lab.Topology
	family  int
	objs    *lab.Objects
	appCPU  int
	traffic *lab.Traffic
	list    string // the flood's sources as a list file
	dir     string // the run's work directory
	ipt     string // iptables binary for the family
}

// layers are the study's rows in its order (slowest first), then the ones
// it did not have.
var layers = []layer{
	{"app", 0.175, []string{"iptables"}, setupApp(true)},
	{"app-notrack", 0.333, []string{"iptables"}, setupApp(false)},
	{"socket-bpf", 0.512, []string{"iptables"}, setupSocketBPF},
	{"iptables-input", 0.608, []string{"iptables"}, setupIptablesInput},
	{"iptables-raw", 1.688, []string{"iptables"}, setupIptablesRaw},
	{"nft-ingress", 1.53, []string{"nft"}, setupNft},
	{"tc-u32", 1.8, []string{"tc"}, setupU32},
	{"tc-bpf", 0, nil, setupTCBPF},
	{"xdp-generic", 0, nil, setupXDP(link.XDPGenericMode)},
	{"xdp-native", 10.1, nil, setupXDP(link.XDPDriverMode)},
	{"ipset", 0, []string{"ipset", "iptables"}, setupIpset},
	{"nft-set", 0, []string{"nft"}, setupNftSet},
	{"xdp-lpm", 0, nil, setupXDPLPM},
	{"xdp-filter", 0, []string{"xdp-filter", "nsenter"}, setupXDPFilter},
	{"rampart", 0, nil, setupRampart},
	{floorLayer, 0, nil, setupXDPFloor},
}

func (r *row) dst() string {
	if r.family == 6 {
		return lab.RxAddr6.String()
	}
	return lab.RxAddr4.String()
}

// rule adds the study's rule for the flood to table/chain with a target.
func (r *row) rule(table, chain string, extra ...string) error {
	args := []string{r.ipt, "-w", "-t", table, "-I", chain, "-d", r.dst(), "-p", "udp", "--dport", strconv.Itoa(lab.DstPort)}
	return lab.InNs(r.topo.RxNs, append(args, extra...)...)
}

// Every rule lives in the receiving namespace, which goes away with the row:
// the iptables layers need no teardown of their own.
func noTeardown() error { return nil }

func setupApp(conntrack bool) func(r *row) (*active, error) {
	return func(r *row) (*active, error) {
		// The study's accept rules, so that iptables is loaded but decides
		// nothing. In a namespace conntrack tracks only once some rule needs
		// it, so "conntrack on" asks for the state of every flood packet.
		steps := [][]string{{"mangle", "PREROUTING", "-j", "ACCEPT"}, {"raw", "PREROUTING", "-j", "ACCEPT"}}
		if conntrack {
			steps = append(steps, []string{"filter", "INPUT", "-m", "conntrack", "--ctstate", "NEW,ESTABLISHED", "-j", "ACCEPT"})
		} else {
			steps = append(steps, []string{"filter", "INPUT", "-j", "ACCEPT"}, []string{"raw", "PREROUTING", "-j", "NOTRACK"})
		}
		for _, s := range steps {
			if err := r.rule(s[0], s[1], s[2:]...); err != nil {
				return nil, err
			}
		}
		conn, err := r.listen()
		if err != nil {
			return nil, err
		}
		app := &reader{conn: conn, family: r.family}
		app.start(r.appCPU)
		return &active{count: app.received, teardown: app.stop}, nil
	}
}

// listen opens the flood's UDP socket in the receiving namespace.
func (r *row) listen() (*net.UDPConn, error) {
	var c *net.UDPConn
	err := netns.Run(r.topo.RxNs, func() (err error) {
		c, err = net.ListenUDP(fmt.Sprintf("udp%d", r.family), &net.UDPAddr{IP: net.ParseIP(r.dst()), Port: lab.DstPort})
		return err
	})
	return c, err
}

// reader drains a socket with recvmmsg, 64 datagrams a call, as the study's
// recvmmsg-loop, counting what it gets.
type reader struct {
	conn   *net.UDPConn
	family int
	n      atomic.Uint64
	wg     sync.WaitGroup
}

func (a *reader) start(cpu int) {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		// Left locked: the thread dies with the goroutine instead of going
		// back to the pool pinned to one CPU. Unpinned (an error), the
		// application still reads, wherever the scheduler puts it.
		_ = lab.PinSelf(cpu)
		msgs := make([]ipv4.Message, lab.BatchSize)
		for i := range msgs {
			msgs[i].Buffers = [][]byte{make([]byte, 2048)}
		}
		read := ipv4.NewPacketConn(a.conn).ReadBatch
		if a.family == 6 {
			read = ipv6.NewPacketConn(a.conn).ReadBatch
		}
		for {
			n, err := read(msgs, 0)
			if err != nil {
				return
			}
			a.n.Add(uint64(n))
		}
	}()
}

func (a *reader) received() (uint64, error) { return a.n.Load(), nil }

func (a *reader) stop() error {
	err := a.conn.Close()
	a.wg.Wait()
	return err
}

func setupSocketBPF(r *row) (*active, error) {
	if err := r.rule("raw", "PREROUTING", "-j", "NOTRACK"); err != nil {
		return nil, err
	}
	conn, err := r.listen()
	if err != nil {
		return nil, err
	}
	raw, err := conn.SyscallConn()
	if err == nil {
		cerr := raw.Control(func(fd uintptr) {
			err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_BPF, r.objs.LabSockDrop.FD())
		})
		if cerr != nil {
			err = cerr
		}
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("SO_ATTACH_BPF: %w", err)
	}
	return &active{count: r.dropCount, teardown: conn.Close}, nil
}

func (r *row) dropCount() (uint64, error) { return datapath.SumPerCPU(r.objs.LabDrops) }

func setupIptablesInput(r *row) (*active, error) {
	if err := r.rule("raw", "PREROUTING", "-j", "NOTRACK"); err != nil {
		return nil, err
	}
	if err := r.rule("filter", "INPUT", "-j", "DROP"); err != nil {
		return nil, err
	}
	return &active{count: lab.IptablesCounter(r.topo.RxNs, r.ipt, "filter", "INPUT", "DROP"), teardown: noTeardown}, nil
}

func setupIptablesRaw(r *row) (*active, error) {
	if err := r.rule("raw", "PREROUTING", "-j", "DROP"); err != nil {
		return nil, err
	}
	return &active{count: lab.IptablesCounter(r.topo.RxNs, r.ipt, "raw", "PREROUTING", "DROP"), teardown: noTeardown}, nil
}

func setupNft(r *row) (*active, error) {
	// The study's chain: netdev ingress at priority -500, both families.
	script := fmt.Sprintf(`table netdev %[1]s {
	chain input {
		type filter hook ingress device %[2]q priority -500; policy accept;
		ip daddr %[3]s udp dport %[5]d counter drop
		ip6 daddr %[4]s udp dport %[5]d counter drop
	}
}
`, lab.NftTable, r.topo.RxIf, lab.DstNet4, lab.DstNet6, lab.DstPort)
	if err := lab.RestoreIn(r.topo.RxNs, script, "nft", "-f", "-"); err != nil {
		return nil, err
	}
	return &active{count: r.nftCount, teardown: noTeardown}, nil
}

// parseNftCounters sums the packets of every counter in `nft -j list` output.
func parseNftCounters(out []byte) (uint64, error) {
	var doc struct {
		Nftables []struct {
			Rule *struct {
				Expr []map[string]json.RawMessage `json:"expr"`
			} `json:"rule"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return 0, fmt.Errorf("nft -j output: %w", err)
	}
	var sum uint64
	found := false
	for _, o := range doc.Nftables {
		if o.Rule == nil {
			continue
		}
		for _, e := range o.Rule.Expr {
			raw, ok := e["counter"]
			if !ok {
				continue
			}
			var c struct{ Packets uint64 }
			if err := json.Unmarshal(raw, &c); err != nil {
				return 0, fmt.Errorf("nft counter: %w", err)
			}
			sum += c.Packets
			found = true
		}
	}
	if !found {
		return 0, fmt.Errorf("no counter in nft output")
	}
	return sum, nil
}

func setupU32(r *row) (*active, error) {
	dev := r.topo.RxIf
	match := []string{"protocol", "ip", "u32", "match", "ip", "protocol", "17", "0xff", "match", "ip", "dport", strconv.Itoa(lab.DstPort), "0xffff",
		"match", "ip", "dst", lab.DstNet4.String()}
	if r.family == 6 {
		match = []string{"protocol", "ipv6", "u32", "match", "ip6", "dport", strconv.Itoa(lab.DstPort), "0xffff", "match", "ip6", "dst", lab.DstNet6.String()}
	}
	if err := lab.Run("tc", "-n", r.topo.RxNs, "qdisc", "add", "dev", dev, "ingress"); err != nil {
		return nil, err
	}
	args := append([]string{"tc", "-n", r.topo.RxNs, "filter", "add", "dev", dev, "parent", "ffff:", "prio", "4"}, match...)
	if err := lab.Run(append(args, "flowid", "1:1", "action", "drop")...); err != nil {
		if strings.Contains(err.Error(), "Failed to load TC action module") {
			return nil, lab.SkipError{Reason: "the kernel has no gact action (CONFIG_NET_ACT_GACT), so tc cannot drop here"}
		}
		return nil, err
	}
	count := func() (uint64, error) {
		out, err := lab.Output("tc", "-n", r.topo.RxNs, "-s", "-j", "qdisc", "show", "dev", dev, "ingress")
		if err != nil {
			return 0, err
		}
		return parseTCDrops(out)
	}
	return &active{count: count, teardown: noTeardown}, nil
}

// parseTCDrops reads the drops of the ingress qdisc from `tc -s -j qdisc`:
// every packet the u32 filter's drop action takes is counted there.
func parseTCDrops(out []byte) (uint64, error) {
	var qdiscs []struct {
		Kind  string `json:"kind"`
		Drops uint64 `json:"drops"`
	}
	if err := json.Unmarshal(out, &qdiscs); err != nil {
		return 0, fmt.Errorf("tc -j output: %w", err)
	}
	for _, q := range qdiscs {
		if q.Kind == "ingress" || q.Kind == "clsact" {
			return q.Drops, nil
		}
	}
	return 0, fmt.Errorf("no ingress qdisc in tc output: %s", out)
}

// setupTCBPF attaches the bare drop program as the study would have: a
// clsact qdisc and a cls_bpf filter in direct-action mode.
func setupTCBPF(r *row) (*active, error) {
	if err := lab.AttachTC(r.topo.RxNs, r.topo.RxIndex, false, r.objs.LabTcDrop, "lab_tc_drop"); err != nil {
		return nil, err
	}
	return &active{count: r.dropCount, teardown: noTeardown, mode: "cls_bpf"}, nil
}

func setupXDP(mode link.XDPAttachFlags) func(r *row) (*active, error) {
	return func(r *row) (*active, error) { return r.attachXDP(r.objs.LabXdpDrop, mode) }
}

// attachXDP attaches a lab program to the receiving veth; its drops are
// the lab's drop counter.
func (r *row) attachXDP(prog *ebpf.Program, mode link.XDPAttachFlags) (*active, error) {
	var l link.Link
	var got string
	err := netns.Run(r.topo.RxNs, func() (err error) {
		l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: r.topo.RxIndex, Flags: mode})
		if err != nil {
			return fmt.Errorf("attach XDP: %w", err)
		}
		got, err = xdpMode(r.topo.RxIndex)
		return err
	})
	if err != nil {
		if l != nil {
			l.Close()
		}
		return nil, err
	}
	return &active{count: r.dropCount, teardown: l.Close, mode: got}, nil
}

// xdpMode reports the XDP mode the kernel says is attached to ifindex (in
// the calling thread's namespace).
func xdpMode(ifindex int) (string, error) {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return "", err
	}
	x := l.Attrs().Xdp
	if x == nil || !x.Attached {
		return "", fmt.Errorf("no XDP program attached to %s", l.Attrs().Name)
	}
	switch x.AttachMode {
	case 1: // XDP_ATTACHED_DRV
		return "xdp-native", nil
	case 2: // XDP_ATTACHED_SKB
		return "xdp-generic", nil
	case 3: // XDP_ATTACHED_HW
		return "xdp-offload", nil
	}
	return fmt.Sprintf("xdp-mode-%d", x.AttachMode), nil
}

// The rampart layer's policy: the flood's sources as a 1M-prefix blocklist.
const rampartPolicy = `# rampart lab drop: the flood's sources as a blocklist.
lists:
  flood: {files: [%q]}
rules:
  - {name: drop-flood, src: flood, proto: udp, dport: %d, action: drop}
default: pass
`

// With --unlisted, the list holds none of the flood's sources: every
// frame is looked up, passes the list's rule, and is dropped by the next.
const rampartPolicyUnlisted = `# rampart lab drop --unlisted: a blocklist the flood's sources are not in.
lists:
  flood: {files: [%q]}
rules:
  - {name: drop-listed, src: flood, proto: udp, dport: %[2]d, action: drop}
  - {name: drop-flood, proto: udp, dport: %[2]d, action: drop}
default: pass
`

const rampartRule = "drop-flood"

// setupRampart applies the real policy through the engine, as `rampart
// apply` does, on roots of the run's own: the host's rampart state is never
// touched.
func setupRampart(r *row) (*active, error) {
	file := strings.TrimSuffix(r.list, ".txt") + ".yaml"
	text := rampartPolicy
	if r.traffic.ListFrom != 0 {
		text = rampartPolicyUnlisted
	}
	h, err := lab.ApplyRampart(r.dir, r.topo.RxNs, r.topo.RxIf, file, fmt.Sprintf(text, r.list, lab.DstPort), false)
	if err != nil {
		return nil, err
	}
	count := h.Counter(rampartRule, func(x stats.Row) uint64 { return x.Packets })
	return &active{count: count, teardown: h.Detach, mode: h.Mode}, nil
}

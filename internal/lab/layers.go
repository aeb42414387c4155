package lab

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
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
	"github.com/rampart-fw/rampart/internal/engine"
	"github.com/rampart-fw/rampart/internal/netns"
	"github.com/rampart-fw/rampart/internal/policy"
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
	topo   *topology
	family int
	objs   *labObjects
	appCPU int
	flood  *flood
	list   string // the flood's sources as a list file
	dir    string // the run's work directory
	ipt    string // iptables binary for the family
}

// Layers are the study's rows in its order (slowest first), then the ones
// it did not have.
var Layers = []layer{
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
}

// packages name the Debian package of each tool a layer needs.
var packages = map[string]string{
	"iptables": "iptables", "ip6tables": "iptables", "iptables-legacy": "iptables", "ip6tables-legacy": "iptables",
	"nft": "nftables", "tc": "iproute2", "ip": "iproute2", "ethtool": "ethtool", "ipset": "ipset",
	"iperf3": "iperf3", "ping": "iputils-ping", "taskset": "util-linux", "sysctl": "procps",
	"xdp-filter": "xdp-tools", "nsenter": "util-linux",
}

// missingTool names the first tool a layer needs that is not installed,
// with the package to install.
func missingTool(tools []string) string {
	for _, t := range tools {
		if _, err := exec.LookPath(t); err != nil {
			return fmt.Sprintf("%s not found: install the Debian package %s (apt-get install %s)", t, packages[t], packages[t])
		}
	}
	return ""
}

// iptablesFor picks the study's iptables: the legacy (xtables) one when it
// is installed, else whatever iptables is.
func iptablesFor(family int) string {
	name := "iptables"
	if family == 6 {
		name = "ip6tables"
	}
	if _, err := exec.LookPath(name + "-legacy"); err == nil {
		return name + "-legacy"
	}
	return name
}

func (r *row) dst() string {
	if r.family == 6 {
		return rxAddr6.String()
	}
	return rxAddr4.String()
}

// in runs a command inside the receiving namespace.
// rule adds the study's rule for the flood to table/chain with a target.
func (r *row) rule(table, chain string, extra ...string) error {
	args := []string{r.ipt, "-w", "-t", table, "-I", chain, "-d", r.dst(), "-p", "udp", "--dport", strconv.Itoa(floodPort)}
	return inNs(r.topo.rxNs, append(args, extra...)...)
}

// iptablesCounter reads, in ns, the packet counter of the first rule in
// table/chain whose target is target.
func iptablesCounter(ns, ipt, table, chain, target string) func() (uint64, error) {
	return func() (uint64, error) {
		out, err := output("ip", "netns", "exec", ns, ipt, "-w", "-t", table, "-L", chain, "-v", "-x", "-n")
		if err != nil {
			return 0, err
		}
		return parseIptablesCount(string(out), target)
	}
}

// parseIptablesCount finds the rule with the target in `iptables -L -v -x -n`
// output and returns its packet count.
func parseIptablesCount(out, target string) (uint64, error) {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[2] != target {
			continue
		}
		if n, err := strconv.ParseUint(f[0], 10, 64); err == nil {
			return n, nil
		}
	}
	return 0, fmt.Errorf("no %s rule in:\n%s", target, out)
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
	err := netns.Run(r.topo.rxNs, func() (err error) {
		c, err = net.ListenUDP(fmt.Sprintf("udp%d", r.family), &net.UDPAddr{IP: net.ParseIP(r.dst()), Port: floodPort})
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
		_ = pinSelf(cpu)
		msgs := make([]ipv4.Message, batchSize)
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
	return &active{count: iptablesCounter(r.topo.rxNs, r.ipt, "filter", "INPUT", "DROP"), teardown: noTeardown}, nil
}

func setupIptablesRaw(r *row) (*active, error) {
	if err := r.rule("raw", "PREROUTING", "-j", "DROP"); err != nil {
		return nil, err
	}
	return &active{count: iptablesCounter(r.topo.rxNs, r.ipt, "raw", "PREROUTING", "DROP"), teardown: noTeardown}, nil
}

const nftTable = "rampart_lab"

func setupNft(r *row) (*active, error) {
	// The study's chain: netdev ingress at priority -500, both families.
	script := fmt.Sprintf(`table netdev %[1]s {
	chain input {
		type filter hook ingress device %[2]q priority -500; policy accept;
		ip daddr %[3]s udp dport %[5]d counter drop
		ip6 daddr %[4]s udp dport %[5]d counter drop
	}
}
`, nftTable, r.topo.rxIf, dstNet4, dstNet6, floodPort)
	cmd := exec.Command("ip", "netns", "exec", r.topo.rxNs, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("nft -f: %w: %s", err, out)
	}
	count := func() (uint64, error) {
		out, err := output("ip", "netns", "exec", r.topo.rxNs, "nft", "-j", "list", "table", "netdev", nftTable)
		if err != nil {
			return 0, err
		}
		return parseNftCounters(out)
	}
	return &active{count: count, teardown: noTeardown}, nil
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
	dev := r.topo.rxIf
	match := []string{"protocol", "ip", "u32", "match", "ip", "protocol", "17", "0xff", "match", "ip", "dport", strconv.Itoa(floodPort), "0xffff",
		"match", "ip", "dst", dstNet4.String()}
	if r.family == 6 {
		match = []string{"protocol", "ipv6", "u32", "match", "ip6", "dport", strconv.Itoa(floodPort), "0xffff", "match", "ip6", "dst", dstNet6.String()}
	}
	if err := run("tc", "-n", r.topo.rxNs, "qdisc", "add", "dev", dev, "ingress"); err != nil {
		return nil, err
	}
	args := append([]string{"tc", "-n", r.topo.rxNs, "filter", "add", "dev", dev, "parent", "ffff:", "prio", "4"}, match...)
	if err := run(append(args, "flowid", "1:1", "action", "drop")...); err != nil {
		if strings.Contains(err.Error(), "Failed to load TC action module") {
			return nil, skipError{"the kernel has no gact action (CONFIG_NET_ACT_GACT), so tc cannot drop here"}
		}
		return nil, err
	}
	count := func() (uint64, error) {
		out, err := output("tc", "-n", r.topo.rxNs, "-s", "-j", "qdisc", "show", "dev", dev, "ingress")
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
	err := netns.Run(r.topo.rxNs, func() error {
		q := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: r.topo.rxIndex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
		if err := netlink.QdiscAdd(q); err != nil {
			return fmt.Errorf("add clsact: %w", err)
		}
		f := &netlink.BpfFilter{
			FilterAttrs:  netlink.FilterAttrs{LinkIndex: r.topo.rxIndex, Parent: netlink.HANDLE_MIN_INGRESS, Handle: 1, Protocol: unix.ETH_P_ALL, Priority: 1},
			Fd:           r.objs.LabTcDrop.FD(),
			Name:         "lab_tc_drop",
			DirectAction: true,
		}
		if err := netlink.FilterAdd(f); err != nil {
			return fmt.Errorf("add cls_bpf filter: %w", err)
		}
		return nil
	})
	if err != nil {
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
	err := netns.Run(r.topo.rxNs, func() (err error) {
		l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: r.topo.rxIndex, Flags: mode})
		if err != nil {
			return fmt.Errorf("attach XDP: %w", err)
		}
		got, err = xdpMode(r.topo.rxIndex)
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

const rampartRule = "drop-flood"

// setupRampart applies the real policy through the engine, as `rampart
// apply` does, on roots of the run's own: the host's rampart state is never
// touched.
func setupRampart(r *row) (*active, error) {
	file := strings.TrimSuffix(r.list, ".txt") + ".yaml"
	h, err := applyRampart(r.dir, r.topo.rxNs, r.topo.rxIf, file, fmt.Sprintf(rampartPolicy, r.list, floodPort), false)
	if err != nil {
		return nil, err
	}
	count := h.counter(rampartRule, func(x stats.Row) uint64 { return x.Packets })
	return &active{count: count, teardown: h.detach, mode: h.mode}, nil
}

// rampartHook is a policy applied through the engine, as `rampart apply`
// does, on roots of the run's own (a bpffs directory rampart-lab-<pid> and
// the run's work directory): a lab run never touches the host's rampart
// state.
type rampartHook struct {
	fw    *engine.Firewall
	iface string
	mode  string
}

// applyRampart writes text to file and applies it on iface in ns, at its
// egress when egress is set.
func applyRampart(dir, ns, iface, file, text string, egress bool) (*rampartHook, error) {
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		return nil, err
	}
	fw, err := engine.New(engine.Options{PinRoot: PinRoot(), StateRoot: filepath.Join(dir, "rampart-state"), Netns: ns})
	if err != nil {
		return nil, err
	}
	pol, err := policy.Load(file, policy.Options{})
	if err != nil {
		return nil, err
	}
	res, err := fw.Apply(engine.ApplyRequest{Policy: pol, Ifaces: []string{iface}, Egress: egress})
	if err != nil {
		return nil, fmt.Errorf("rampart apply: %w", err)
	}
	return &rampartHook{fw: fw, iface: iface, mode: string(res.Applied[0].Mode)}, nil
}

// detach removes the hook and its state; the namespace would take the
// link, but not the state.
func (h *rampartHook) detach() error {
	if _, err := h.fw.Detach([]string{h.iface}); err != nil {
		return fmt.Errorf("rampart detach: %w", err)
	}
	return nil
}

// counter reads one of a rule's counters.
func (h *rampartHook) counter(rule string, pick func(stats.Row) uint64) func() (uint64, error) {
	return func() (uint64, error) {
		snap, err := h.fw.Stats()
		if err != nil {
			return 0, err
		}
		for _, row := range snap.Rows {
			if row.Name == rule {
				return pick(row), nil
			}
		}
		return 0, fmt.Errorf("rampart has no rule %s on %s", rule, h.iface)
	}
}

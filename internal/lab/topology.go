package lab

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/netns"
)

// NetnsPrefix starts the name of every namespace the lab creates; with the
// lab's pid after it, stale ones from a killed run are found and removed.
const NetnsPrefix = "rampart-lab-"

// The traffic's destination, as in the study: 198.18.0.12 and fd00::12 in
// the on-link /24 and /64 the drop rules match, UDP port 1234.
var (
	RxAddr4  = netip.MustParseAddr("198.18.0.12")
	GenAddr4 = netip.MustParseAddr("198.18.0.1")
	RxAddr6  = netip.MustParseAddr("fd00::12")
	GenAddr6 = netip.MustParseAddr("fd00::1")
)

// The prefixes the study's drop rules match.
var (
	DstNet4 = netip.PrefixFrom(RxAddr4, 24).Masked()
	DstNet6 = netip.PrefixFrom(RxAddr6, 64).Masked()
)

// DstPort is the traffic's destination port unless a study picks another.
const DstPort = 1234

// The legitimate clients' network, routed through the generator's
// namespace (the Internet), so that their traffic and the flood reach the
// receiving interface together; lab_sink passes what is sent back to it.
var (
	ClientNet4 = netip.MustParsePrefix("198.19.0.0/24")
	ClientNet6 = netip.MustParsePrefix("fd01::/64")
)

// The ranges the traffic's sources are spread over unless a study is told
// otherwise.
var (
	DefaultSrc4 = netip.MustParsePrefix("10.0.0.0/8")
	DefaultSrc6 = netip.MustParsePrefix("fd10::/32")
)

// Topology is two namespaces joined by a veth pair: the generator transmits
// on GenIf, the side under test receives on RxIf.
type Topology struct {
	GenNs, RxNs   string
	GenIf, RxIf   string
	GenIndex      int // in GenNs
	RxIndex       int // in RxNs
	GenMAC, RxMAC net.HardwareAddr
	RxCPU         int
	NAPIPIDs      []int
}

// NewTopology creates the namespaces and the veth pair and readies the
// receive side: GRO on (which gives the veth a NAPI context, without which
// frames redirected into it are dropped), NAPI threaded and its thread
// pinned to rxCPU. On error everything created so far is removed.
func NewTopology(seq, rxCPU int) (t *Topology, err error) {
	pid := os.Getpid()
	t = &Topology{
		GenNs: fmt.Sprintf("%s%d-%d-gen", NetnsPrefix, pid, seq),
		RxNs:  fmt.Sprintf("%s%d-%d-rx", NetnsPrefix, pid, seq),
		// Interfaces are created inside the lab's namespaces, never in the
		// host's, so short fixed names cannot collide with the user's.
		GenIf: "lab-gen", RxIf: "lab-rx",
		RxCPU: rxCPU,
	}
	defer func() {
		if err != nil {
			t.Close()
		}
	}()
	steps := [][]string{
		{"ip", "netns", "add", t.GenNs},
		{"ip", "netns", "add", t.RxNs},
		{"ip", "-n", t.GenNs, "link", "add", t.GenIf, "type", "veth", "peer", "name", t.RxIf, "netns", t.RxNs},
		{"ip", "-n", t.GenNs, "addr", "add", GenAddr4.String() + "/24", "dev", t.GenIf},
		{"ip", "-n", t.GenNs, "addr", "add", GenAddr6.String() + "/64", "dev", t.GenIf, "nodad"},
		{"ip", "-n", t.RxNs, "addr", "add", RxAddr4.String() + "/24", "dev", t.RxIf},
		{"ip", "-n", t.RxNs, "addr", "add", RxAddr6.String() + "/64", "dev", t.RxIf, "nodad"},
		{"ip", "-n", t.GenNs, "link", "set", t.GenIf, "up"},
		{"ip", "-n", t.RxNs, "link", "set", t.RxIf, "up"},
		{"ip", "-n", t.RxNs, "link", "set", "lo", "up"},
		// Replies to the flood's random sources (ICMP errors, if any) go
		// back to the generator's side instead of failing a route lookup.
		{"ip", "-n", t.RxNs, "route", "add", "default", "via", GenAddr4.String()},
		{"ip", "-n", t.RxNs, "-6", "route", "add", "default", "via", GenAddr6.String()},
		{"ip", "netns", "exec", t.RxNs, "ethtool", "-K", t.RxIf, "gro", "on"},
	}
	for _, s := range steps {
		if err := Run(s...); err != nil {
			return t, err
		}
	}
	// The NAPI threads appear when threaded mode is switched on; their names
	// (napi/<ifname>-<id>, cut to 15 characters) do not say which namespace
	// they serve, so the new ones are found by difference.
	before := NAPIThreads()
	if err := Run("ip", "netns", "exec", t.RxNs, "sh", "-c", "echo 1 > /sys/class/net/"+t.RxIf+"/threaded"); err != nil {
		return t, err
	}
	for _, pid := range NAPIThreads() {
		if !slices.Contains(before, pid) {
			t.NAPIPIDs = append(t.NAPIPIDs, pid)
		}
	}
	// Sources are random and off-link: reverse-path filtering would drop
	// them before any layer under test sees them.
	if err := netns.Run(t.RxNs, func() error {
		for _, k := range []string{"all", "default", t.RxIf} {
			if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+k+"/rp_filter", []byte("0"), 0); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return t, fmt.Errorf("turn off rp_filter: %w", err)
	}
	if err := netns.Run(t.GenNs, func() error {
		i, err := net.InterfaceByName(t.GenIf)
		if err == nil {
			t.GenIndex, t.GenMAC = i.Index, i.HardwareAddr
		}
		return err
	}); err != nil {
		return t, err
	}
	if err := netns.Run(t.RxNs, func() error {
		i, err := net.InterfaceByName(t.RxIf)
		if err == nil {
			t.RxIndex, t.RxMAC = i.Index, i.HardwareAddr
		}
		return err
	}); err != nil {
		return t, err
	}
	return t, t.PinNAPI()
}

// PinNAPI moves the receive interface's NAPI threads to the receive CPU.
func (t *Topology) PinNAPI() error {
	if len(t.NAPIPIDs) == 0 {
		return fmt.Errorf("no threaded NAPI for %s: the kernel did not start a napi/%s-* thread", t.RxIf, t.RxIf)
	}
	for _, pid := range t.NAPIPIDs {
		if err := PinThread(pid, t.RxCPU); err != nil {
			return fmt.Errorf("pin napi thread %d to CPU %d: %w", pid, t.RxCPU, err)
		}
	}
	return nil
}

// NAPIThreads lists the kernel's threaded-NAPI threads.
func NAPIThreads() []int {
	dirs, _ := filepath.Glob("/proc/[0-9]*/comm")
	var pids []int
	for _, d := range dirs {
		comm, err := os.ReadFile(d)
		if err != nil || !bytes.HasPrefix(comm, []byte("napi/")) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		pids = append(pids, pid)
	}
	return pids
}

// PinThread binds thread tid (0: the calling one) to cpu.
func PinThread(tid, cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	return unix.SchedSetaffinity(tid, &set)
}

// PinSelf locks the calling goroutine to its thread and the thread to cpu.
func PinSelf(cpu int) error {
	runtime.LockOSThread()
	return PinThread(0, cpu)
}

// Close removes both namespaces; the veth pair goes with them.
func (t *Topology) Close() {
	for _, ns := range []string{t.RxNs, t.GenNs} {
		if ns != "" {
			exec.Command("ip", "netns", "del", ns).Run()
		}
	}
}

// IfaceCounter reads the receiving veth's own packet counter over netlink.
type IfaceCounter struct {
	h     *netlink.Handle
	index int
}

// RxCounter opens the receiving veth's counter.
func RxCounter(t *Topology) (*IfaceCounter, error) {
	ns, err := netns.Open(t.RxNs)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, err
	}
	return &IfaceCounter{h: h, index: t.RxIndex}, nil
}

// RxPackets is what the interface has received so far.
func (c *IfaceCounter) RxPackets() (uint64, error) {
	l, err := c.h.LinkByIndex(c.index)
	if err != nil {
		return 0, fmt.Errorf("read %d's counters: %w", c.index, err)
	}
	if l.Attrs().Statistics == nil {
		return 0, nil
	}
	return l.Attrs().Statistics.RxPackets, nil
}

// Close releases the netlink handle.
func (c *IfaceCounter) Close() { c.h.Close() }

// PinRoot is the bpffs directory of this run's rampart layer; the pins of
// every run live under PinRootPrefix followed by its process id.
func PinRoot() string { return fmt.Sprintf("%s%d", PinRootPrefix, os.Getpid()) }

// PinRootPrefix starts the pin root of every lab run.
const PinRootPrefix = "/sys/fs/bpf/rampart-lab-"

// SweepStale removes namespaces and rampart pins left by lab runs whose
// process is gone (killed with SIGKILL, or the machine's power).
func SweepStale() {
	stale := func(rest string) bool {
		pid, err := strconv.Atoi(strings.SplitN(rest, "-", 2)[0])
		return err == nil && pid != os.Getpid() && unix.Kill(pid, 0) != nil
	}
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		if rest, ok := strings.CutPrefix(e.Name(), NetnsPrefix); ok && stale(rest) {
			// The namespace takes its interfaces, and so rampart's links.
			exec.Command("ip", "netns", "del", e.Name()).Run()
		}
	}
	roots, _ := filepath.Glob(PinRootPrefix + "*")
	for _, root := range roots {
		if stale(strings.TrimPrefix(root, PinRootPrefix)) {
			os.RemoveAll(root)
		}
	}
}

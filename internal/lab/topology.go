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

	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/netns"
)

// NetnsPrefix starts the name of every namespace the lab creates; with the
// lab's pid after it, stale ones from a killed run are found and removed.
const NetnsPrefix = "rampart-lab-"

// The flood's destination, as in the study: 198.18.0.12 and fd00::12 in the
// on-link /24 and /64 the drop rules match, UDP port 1234.
var (
	rxAddr4  = netip.MustParseAddr("198.18.0.12")
	genAddr4 = netip.MustParseAddr("198.18.0.1")
	rxAddr6  = netip.MustParseAddr("fd00::12")
	genAddr6 = netip.MustParseAddr("fd00::1")
)

// The prefixes the study's drop rules match.
var (
	dstNet4 = netip.PrefixFrom(rxAddr4, 24).Masked()
	dstNet6 = netip.PrefixFrom(rxAddr6, 64).Masked()
)

const floodPort = 1234

// topology is two namespaces joined by a veth pair: the generator transmits
// on genIf, the layer under test receives on rxIf.
type topology struct {
	genNs, rxNs   string
	genIf, rxIf   string
	genIndex      int // in genNs
	rxIndex       int // in rxNs
	genMAC, rxMAC net.HardwareAddr
	rxCPU         int
	napiPIDs      []int
}

// newTopology creates the namespaces and the veth pair and readies the
// receive side: GRO on (which gives the veth a NAPI context, without which
// frames redirected into it are dropped), NAPI threaded and its thread
// pinned to rxCPU. On error everything created so far is removed.
func newTopology(seq, rxCPU int) (t *topology, err error) {
	pid := os.Getpid()
	t = &topology{
		genNs: fmt.Sprintf("%s%d-%d-gen", NetnsPrefix, pid, seq),
		rxNs:  fmt.Sprintf("%s%d-%d-rx", NetnsPrefix, pid, seq),
		// Interfaces are created inside the lab's namespaces, never in the
		// host's, so short fixed names cannot collide with the user's.
		genIf: "lab-gen", rxIf: "lab-rx",
		rxCPU: rxCPU,
	}
	defer func() {
		if err != nil {
			t.close()
		}
	}()
	steps := [][]string{
		{"ip", "netns", "add", t.genNs},
		{"ip", "netns", "add", t.rxNs},
		{"ip", "-n", t.genNs, "link", "add", t.genIf, "type", "veth", "peer", "name", t.rxIf, "netns", t.rxNs},
		{"ip", "-n", t.genNs, "addr", "add", genAddr4.String() + "/24", "dev", t.genIf},
		{"ip", "-n", t.genNs, "addr", "add", genAddr6.String() + "/64", "dev", t.genIf, "nodad"},
		{"ip", "-n", t.rxNs, "addr", "add", rxAddr4.String() + "/24", "dev", t.rxIf},
		{"ip", "-n", t.rxNs, "addr", "add", rxAddr6.String() + "/64", "dev", t.rxIf, "nodad"},
		{"ip", "-n", t.genNs, "link", "set", t.genIf, "up"},
		{"ip", "-n", t.rxNs, "link", "set", t.rxIf, "up"},
		{"ip", "-n", t.rxNs, "link", "set", "lo", "up"},
		// Replies to the flood's random sources (ICMP errors, if any) go
		// back to the generator's side instead of failing a route lookup.
		{"ip", "-n", t.rxNs, "route", "add", "default", "via", genAddr4.String()},
		{"ip", "-n", t.rxNs, "-6", "route", "add", "default", "via", genAddr6.String()},
		{"ip", "netns", "exec", t.rxNs, "ethtool", "-K", t.rxIf, "gro", "on"},
	}
	for _, s := range steps {
		if err := run(s...); err != nil {
			return t, err
		}
	}
	// The NAPI threads appear when threaded mode is switched on; their names
	// (napi/<ifname>-<id>, cut to 15 characters) do not say which namespace
	// they serve, so the new ones are found by difference.
	before := napiThreads()
	if err := run("ip", "netns", "exec", t.rxNs, "sh", "-c", "echo 1 > /sys/class/net/"+t.rxIf+"/threaded"); err != nil {
		return t, err
	}
	for _, pid := range napiThreads() {
		if !slices.Contains(before, pid) {
			t.napiPIDs = append(t.napiPIDs, pid)
		}
	}
	// Sources are random and off-link: reverse-path filtering would drop
	// them before any layer under test sees them.
	if err := netns.Run(t.rxNs, func() error {
		for _, k := range []string{"all", "default", t.rxIf} {
			if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+k+"/rp_filter", []byte("0"), 0); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return t, fmt.Errorf("turn off rp_filter: %w", err)
	}
	if err := netns.Run(t.genNs, func() error {
		i, err := net.InterfaceByName(t.genIf)
		if err == nil {
			t.genIndex, t.genMAC = i.Index, i.HardwareAddr
		}
		return err
	}); err != nil {
		return t, err
	}
	if err := netns.Run(t.rxNs, func() error {
		i, err := net.InterfaceByName(t.rxIf)
		if err == nil {
			t.rxIndex, t.rxMAC = i.Index, i.HardwareAddr
		}
		return err
	}); err != nil {
		return t, err
	}
	return t, t.pinNAPI()
}

// pinNAPI moves the receive interface's NAPI threads to rxCPU.
func (t *topology) pinNAPI() error {
	if len(t.napiPIDs) == 0 {
		return fmt.Errorf("no threaded NAPI for %s: the kernel did not start a napi/%s-* thread", t.rxIf, t.rxIf)
	}
	for _, pid := range t.napiPIDs {
		if err := pinThread(pid, t.rxCPU); err != nil {
			return fmt.Errorf("pin napi thread %d to CPU %d: %w", pid, t.rxCPU, err)
		}
	}
	return nil
}

// napiThreads lists the kernel's threaded-NAPI threads.
func napiThreads() []int {
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

func pinThread(tid, cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	return unix.SchedSetaffinity(tid, &set)
}

// pinSelf locks the calling goroutine to its thread and the thread to cpu.
func pinSelf(cpu int) error {
	runtime.LockOSThread()
	return pinThread(0, cpu)
}

// close removes both namespaces; the veth pair goes with them.
func (t *topology) close() {
	for _, ns := range []string{t.rxNs, t.genNs} {
		if ns != "" {
			exec.Command("ip", "netns", "del", ns).Run()
		}
	}
}

// run runs a command and returns its output in the error when it fails.
func run(args ...string) error {
	var out bytes.Buffer
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// inNs runs a command in a named network namespace.
func inNs(ns string, args ...string) error {
	return run(append([]string{"ip", "netns", "exec", ns}, args...)...)
}

// output runs a command and returns its standard output.
func output(args ...string) ([]byte, error) {
	var errb bytes.Buffer
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out, nil
}

// PinRoot is the bpffs directory of this run's rampart layer; the pins of
// every run live under PinRootPrefix followed by its process id.
func PinRoot() string { return fmt.Sprintf("%s%d", PinRootPrefix, os.Getpid()) }

// PinRootPrefix starts the pin root of every lab run.
const PinRootPrefix = "/sys/fs/bpf/rampart-lab-"

// sweepStale removes namespaces and rampart pins left by lab runs whose
// process is gone (killed with SIGKILL, or the machine's power).
func sweepStale() {
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

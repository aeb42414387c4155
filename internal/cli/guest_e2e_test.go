package cli_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/packet"
	"github.com/rampart-fw/rampart/internal/testutil"
	"github.com/rampart-fw/rampart/internal/tune"
)

// The tests of this file run in the kernel tier's NIC guest (Linux 6.12
// under qemu, scripts/kernels.sh): a real driver, bonding, fq and gact,
// which this machine's kernel lacks.

// TestGuestVirtioXDP: the end-to-end filter round on virtio_net NICs, a
// driver other than veth, in native XDP (auto must pick it) and at tc.
func TestGuestVirtioXDP(t *testing.T) {
	nics := testutil.GuestNICs(t)
	for _, mode := range []string{"xdp-native", "auto", "tc"} {
		t.Run(mode, func(t *testing.T) {
			filterRound(t, testutil.PairOver(t, nics[2], nics[0]), mode, false, "xdp-native")
		})
	}
}

// bond makes a bond of slaves in ns ("": this one) in mode (802.3ad,
// balance-xor…).
func bond(t *testing.T, ns, mode, name string, slaves ...string) {
	t.Helper()
	ip := func(args ...string) {
		if ns != "" {
			args = append([]string{"-n", ns}, args...)
		}
		testutil.Run(t, "ip", args...)
	}
	ip("link", "add", name, "type", "bond", "mode", mode, "miimon", "100")
	t.Cleanup(func() { ip("link", "del", name) })
	for _, s := range slaves {
		ip("link", "set", s, "down")
		ip("link", "set", s, "master", name)
	}
	ip("link", "set", name, "up")
}

// udpFrames are n UDP frames from src to dst:port, between the MACs.
func udpFrames(n int, srcMAC, dstMAC net.HardwareAddr, src, dst string, port uint16) [][]byte {
	f := packet.Frame{SrcMAC: srcMAC, DstMAC: dstMAC, Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst),
		Proto: 17, Sport: 40000, Dport: port, Payload: 32}
	frames := make([][]byte, n)
	for i := range frames {
		frames[i] = f.Bytes()
	}
	return frames
}

// TestGuestBondXDP: native XDP on a bond of virtio_net slaves. Listed
// traffic through either slave is dropped and counted once; unlisted
// traffic is counted once and passed. balance-xor: every slave delivers what
// it receives (a mode-4 bond without a LACP partner delivers only what its
// active aggregator's slave receives, after the partner times out).
func TestGuestBondXDP(t *testing.T) {
	nics := testutil.GuestNICs(t)
	t.Cleanup(func() { testutil.WaitLinks(t, "", nics...) })
	peer, dut := "rpt-bond-peer", "rpt-bond-dut"
	for _, ns := range []string{peer, dut} {
		testutil.Run(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { testutil.Run(t, "ip", "netns", "del", ns) })
	}
	for i, n := range nics {
		testutil.Run(t, "ip", "link", "set", n, "netns", map[bool]string{true: dut, false: peer}[i < 2])
	}
	bond(t, dut, "balance-xor", "bond0", nics[0], nics[1])
	testutil.Run(t, "ip", "-n", dut, "addr", "add", "10.202.0.1/24", "dev", "bond0")
	testutil.Run(t, "ip", "-n", peer, "link", "set", nics[2], "up")
	testutil.Run(t, "ip", "-n", peer, "link", "set", nics[3], "up")

	pol := writeFile(t, "p.yaml", `
lists:
  listed: {prefixes: [198.51.100.0/24]}
rules:
  - {name: drop-listed, src: listed, action: drop}
  - {name: probe, proto: udp, dport: 9100, action: pass}
default: pass
`)
	mustRampart(t, "apply", "-f", pol, "--netns", dut, "--iface", "bond0", "--mode", "xdp-native")
	t.Cleanup(func() { rampart(t, "detach", "--netns", dut, "--iface", "bond0") })
	if st := hookStatus(t, dut); len(st.Hooks) != 1 || st.Hooks[0].Mode != "xdp-native" || !st.Hooks[0].Attached {
		t.Fatalf("status: %+v", st)
	}
	rx := testutil.UDPListener(t, dut, net.IPv4(10, 202, 0, 1), 9100)
	bondMAC := testutil.MAC(t, dut, "bond0")
	const n = 200
	for _, slave := range nics[2:] {
		from := testutil.MAC(t, peer, slave)
		testutil.SendRaw(t, peer, slave, udpFrames(n, from, bondMAC, "198.51.100.7", "10.202.0.1", 9100))
	}
	if got := testutil.CountUDP(rx, 500*time.Millisecond); got != 0 {
		t.Errorf("%d listed datagrams reached the socket", got)
	}
	if got := ruleCount(t, "drop-listed"); got != 2*n {
		t.Errorf("drop-listed counted %d, sent %d through the two slaves", got, 2*n)
	}
	for _, slave := range nics[2:] {
		from := testutil.MAC(t, peer, slave)
		testutil.SendRaw(t, peer, slave, udpFrames(n, from, bondMAC, "203.0.113.9", "10.202.0.1", 9100))
	}
	if got := testutil.CountUDP(rx, 500*time.Millisecond); got != 2*n {
		t.Errorf("%d unlisted datagrams reached the socket, sent %d through the two slaves", got, 2*n)
	}
	if got := ruleCount(t, "probe"); got != 2*n {
		t.Errorf("probe counted %d, sent %d through the two slaves", got, 2*n)
	}
}

// queueIRQs are a NIC's queue interrupts: virtio's virtioK-input.N and
// output.N, K the NIC's virtio device.
func queueIRQs(t *testing.T, nic string) []int {
	t.Helper()
	dev, err := filepath.EvalSymlinks("/sys/class/net/" + nic + "/device")
	if err != nil {
		t.Fatal(err)
	}
	prefix := filepath.Base(dev) + "-"
	var irqs []int
	for irq, name := range readInterrupts(t).names {
		if strings.HasPrefix(name, prefix+"input.") || strings.HasPrefix(name, prefix+"output.") {
			irqs = append(irqs, irq)
		}
	}
	slices.Sort(irqs)
	if len(irqs) != 4 {
		t.Fatalf("%s (%s): %d queue interrupts, want 4 (2 queues)", nic, dev, len(irqs))
	}
	return irqs
}

type interrupts struct {
	names  map[int]string
	counts map[int][]uint64 // per CPU
}

func readInterrupts(t *testing.T) interrupts {
	t.Helper()
	b, err := os.ReadFile("/proc/interrupts")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	cpus := len(strings.Fields(lines[0]))
	in := interrupts{map[int]string{}, map[int][]uint64{}}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) < cpus+2 {
			continue
		}
		irq, err := strconv.Atoi(strings.TrimSuffix(f[0], ":"))
		if err != nil {
			continue
		}
		for _, c := range f[1 : cpus+1] {
			v, _ := strconv.ParseUint(c, 10, 64)
			in.counts[irq] = append(in.counts[irq], v)
		}
		in.names[irq] = f[len(f)-1]
	}
	return in
}

func affinity(t *testing.T, irq int) tune.CPUSet {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/irq/%d/smp_affinity_list", irq))
	if err != nil {
		t.Fatal(err)
	}
	set, err := tune.ParseCPUList(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// TestGuestTuneIRQBonds is the bonding study's layout for real: two mode-4
// bonds of two 2-queue virtio_net NICs each on 4 vCPUs. tune irq apply puts
// every queue interrupt of the external side's slaves on CPUs disjoint from
// the internal side's (as /proc/irq/N/smp_affinity_list reads back);
// traffic into each side raises interrupt counts only on its CPUs; rollback
// restores every file.
func TestGuestTuneIRQBonds(t *testing.T) {
	nics := testutil.GuestNICs(t)
	bond(t, "", "802.3ad", "bond0", nics[0], nics[1])
	bond(t, "", "802.3ad", "bond1", nics[2], nics[3])
	sides := map[string][]string{"external": nics[:2], "internal": nics[2:]}
	irqs := map[string][]int{}
	before := map[int]tune.CPUSet{}
	for side, ns := range sides {
		for _, nic := range ns {
			for _, irq := range queueIRQs(t, nic) {
				irqs[side] = append(irqs[side], irq)
				before[irq] = affinity(t, irq)
			}
		}
	}
	queueFiles := func() map[string]string {
		files := map[string]string{}
		for _, nic := range nics {
			paths, _ := filepath.Glob("/sys/class/net/" + nic + "/queues/*/[rx]ps_cpus")
			for _, p := range paths {
				b, _ := os.ReadFile(p)
				files[p] = string(b)
			}
		}
		return files
	}
	queuesBefore := queueFiles()

	mustRampart(t, "tune", "irq", "apply", "--external", "bond0", "--internal", "bond1")
	t.Cleanup(func() { rampart(t, "tune", "irq", "rollback") })
	cpus := map[string]tune.CPUSet{}
	for side, list := range irqs {
		for _, irq := range list {
			cpus[side] = cpus[side].Union(affinity(t, irq))
		}
		t.Logf("%s side: interrupts %v on CPUs %s", side, list, cpus[side].List())
	}
	if len(cpus["external"]) == 0 || len(cpus["internal"]) == 0 || len(cpus["external"].Intersect(cpus["internal"])) != 0 {
		t.Fatalf("sides' CPUs not disjoint: external %s, internal %s", cpus["external"].List(), cpus["internal"].List())
	}

	// Traffic into each side: frames sent out of the other side's NIC
	// arrive on this side's (the host wires 0 with 2 and 1 with 3).
	traffic := func(n int) {
		for i, pair := range [][2]string{{nics[2], nics[0]}, {nics[3], nics[1]}, {nics[0], nics[2]}, {nics[1], nics[3]}} {
			from, to := testutil.MAC(t, "", pair[0]), testutil.MAC(t, "", pair[1])
			testutil.SendRaw(t, "", pair[0], udpFrames(n, from, to, "192.0.2.1", fmt.Sprintf("192.0.2.%d", 10+i), 9))
		}
	}
	// x86 moves an MSI to its new CPUs on the first interrupt after the
	// change, which still arrives where it was: a first round of traffic,
	// sent from every CPU so that every transmit queue XPS maps is used,
	// lets each vector move; the second round is measured.
	for cpu := range runtime.NumCPU() {
		onCPU(t, cpu, func() { traffic(50) })
	}
	time.Sleep(500 * time.Millisecond)
	counts0 := readInterrupts(t)
	traffic(2000)
	time.Sleep(500 * time.Millisecond)
	counts1 := readInterrupts(t)
	for side, list := range irqs {
		var rose uint64
		for _, irq := range list {
			delta := make([]uint64, len(counts1.counts[irq]))
			for cpu := range delta {
				delta[cpu] = counts1.counts[irq][cpu] - counts0.counts[irq][cpu]
				rose += delta[cpu]
				if delta[cpu] > 0 && !slices.Contains(cpus[side], cpu) {
					t.Errorf("%s interrupt %d (%s) rose by %d on CPU %d, outside its side's CPUs %s", side, irq, counts1.names[irq], delta[cpu], cpu, cpus[side].List())
				}
			}
			t.Logf("%s %d %-18s per CPU before %v after %v", side, irq, counts1.names[irq], counts0.counts[irq], counts1.counts[irq])
		}
		if rose == 0 {
			t.Errorf("no %s interrupt rose: no traffic reached the side", side)
		}
	}

	mustRampart(t, "tune", "irq", "rollback")
	for irq, want := range before {
		if got := affinity(t, irq); !slices.Equal(got, want) {
			t.Errorf("interrupt %d: affinity %s after rollback, was %s", irq, got.List(), want.List())
		}
	}
	for p, want := range queuesBefore {
		if b, _ := os.ReadFile(p); string(b) != want {
			t.Errorf("%s: %q after rollback, was %q", p, b, want)
		}
	}
}

// onCPU runs fn on a thread bound to cpu.
func onCPU(t *testing.T, cpu int, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // not unlocked: the thread ends bound, and with it its affinity
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			t.Errorf("bind to CPU %d: %v", cpu, err)
			return
		}
		fn()
	}()
	<-done
}

// TestGuestDiagnoseFQ provokes the UDP send-buffer incident for real: fq
// with flow_limit 100 and a pacing maxrate under a socket whose 212,992-byte
// send buffer holds more than 100 of its datagrams. diagnose names it, with
// flows_plimit equal to the drops and the flow_limit fix; after the fix it
// is quiet.
func TestGuestDiagnoseFQ(t *testing.T) {
	testutil.GuestNICs(t)
	p := testutil.NewPair(t)
	testutil.Run(t, "tc", "-n", p.NsA, "qdisc", "add", "dev", p.IfA, "root", "handle", "10:", "fq", "flow_limit", "100", "maxrate", "10mbit")
	send := func() (*int, func(ctx context.Context)) {
		c := testutil.Socket(t, p.NsA, func() (net.Conn, error) { return net.DialUDP("udp", nil, &net.UDPAddr{IP: p.B4, Port: 7002}) })
		raw, _ := c.(*net.UDPConn).SyscallConn()
		raw.Control(func(fd uintptr) {
			syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_RECVERR, 1)
			syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUFFORCE, 212992/2) // the kernel doubles it
		})
		enobufs := new(int)
		// Small datagrams: more than flow_limit of them fit in the send
		// buffer (a 1,000-byte one takes ~2.3 KB of it, so ~92 would).
		payload := make([]byte, 200)
		return enobufs, func(ctx context.Context) {
			for ctx.Err() == nil {
				if _, err := c.Write(payload); errors.Is(err, syscall.ENOBUFS) {
					*enobufs++
				}
			}
		}
	}
	enobufs, load := send()
	r := diagnoseDuring(t, p.NsA, load)
	if *enobufs == 0 {
		t.Fatal("no send returned ENOBUFS")
	}
	f := finding(t, r, "udp-sndbuf-qdisc")
	moving(t, f, "UdpSndbufErrors")
	drops := moving(t, f, "qdisc/"+p.IfA+"/10:/drops")
	plimit := moving(t, f, "qdisc/"+p.IfA+"/10:/flows_plimit")
	// Nearly every drop is fq's flow limit: its total limit may take one
	// or two when the queue fills at the same instant (one in 212,095 in
	// one run).
	if plimit.Value > drops.Value || (drops.Value-plimit.Value)*1000 > drops.Value {
		t.Errorf("flows_plimit %d, drops %d: want all but a thousandth of the drops to be fq's flow limit", plimit.Value, drops.Value)
	}
	if !strings.Contains(f.Summary, "flow_limit = 100") {
		t.Errorf("summary %q does not name flow_limit = 100", f.Summary)
	}
	want := fmt.Sprintf("tc qdisc change dev %s root fq flow_limit", p.IfA)
	if len(f.Commands) == 0 || !strings.HasPrefix(f.Commands[0], want) {
		t.Fatalf("fix %q, want %q…", f.Commands, want)
	}
	t.Logf("fix: %s", f.Commands[0])
	testutil.Run(t, "ip", append([]string{"netns", "exec", p.NsA}, strings.Fields(f.Commands[0])...)...)

	enobufs, load = send()
	r = diagnoseDuring(t, p.NsA, load)
	noFinding(t, r, "udp-sndbuf-qdisc")
	noFinding(t, r, "qdisc-drops")
	if *enobufs != 0 {
		t.Errorf("%d sends returned ENOBUFS after the fix", *enobufs)
	}
}

// TestGuestLabDropU32: the drop study's tc u32 + gact row, which this
// machine's kernel cannot run, reports a rate in the guest, and the lab
// says the CPU is emulated.
func TestGuestLabDropU32(t *testing.T) {
	testutil.GuestNICs(t)
	var r struct {
		Env struct {
			CPUModel string `json:"cpu_model"`
			Emulated bool
		} `json:"environment"`
		Results []struct {
			Layer, Status, Reason string
			Family                int
			MPPS                  float64
		}
	}
	jsonOf(t, &r, "lab", "drop", "--quick", "--layers", "tc-u32", "--family", "4", "--list-size", "1000", "--out", t.TempDir())
	if len(r.Results) != 1 || r.Results[0].Layer != "tc-u32" || r.Results[0].Status != "ok" || r.Results[0].MPPS <= 0 {
		t.Fatalf("results: %+v", r.Results)
	}
	if !r.Env.Emulated {
		t.Errorf("the report does not say the CPU (%s) is emulated", r.Env.CPUModel)
	}
	t.Logf("tc-u32 (emulated, %s): %.3f Mpps", r.Env.CPUModel, r.Results[0].MPPS)
}

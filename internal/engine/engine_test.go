package engine

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/netns"
	"github.com/rampart-fw/rampart/internal/policy"
	"github.com/rampart-fw/rampart/internal/testutil"
)

// TestMain lets this test binary be an apply that dies at a crash point.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "rollback-watchdog" {
		os.Exit(0) // an apply with a confirmation window starts one: here, the test binary
	}
	if point := os.Getenv("RAMPART_CRASH_AT"); point != "" {
		os.Exit(crashingApply(point))
	}
	os.Exit(m.Run())
}

// crashingApply applies RAMPART_CRASH_POLICY and is SIGKILLed at the point.
func crashingApply(point string) int {
	crashPoint = func(where string) {
		if where == point {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
	}
	fw, err := New(Options{PinRoot: os.Getenv("RAMPART_CRASH_PINS"), StateRoot: os.Getenv("RAMPART_CRASH_STATE"), Netns: os.Getenv("RAMPART_CRASH_NETNS")})
	if err == nil {
		var pol *policy.Policy
		if pol, err = policy.Load(os.Getenv("RAMPART_CRASH_POLICY"), policy.Options{}); err == nil {
			_, err = fw.Apply(ApplyRequest{Policy: pol, Ifaces: []string{os.Getenv("RAMPART_CRASH_IFACE")}})
		}
	}
	fmt.Fprintln(os.Stderr, "the apply was not killed:", err)
	return 3
}

const (
	// A drops UDP to 9100; B drops UDP to 9200. Both count what passes.
	policyA = "rules:\n  - {name: drop-9100, proto: udp, dport: 9100, action: drop}\n  - {name: count, proto: udp, action: pass}\n"
	policyB = "rules:\n  - {name: drop-9200, proto: udp, dport: 9200, action: drop}\n  - {name: count, proto: udp, action: pass}\n"
)

func parse(t testing.TB, dir, name, text string) *policy.Policy {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Load(path, policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

// newFirewall is an engine on roots of the test's own, on the pair's
// receiving namespace.
// firewallOnPair is a pair of namespaces and a firewall on its B side.
func firewallOnPair(t *testing.T) (*testutil.Pair, *Firewall) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	return p, newFirewall(t, p)
}

func newFirewall(t testing.TB, p *testutil.Pair) *Firewall {
	t.Helper()
	pin, state := testutil.Roots(t)
	fw, err := New(Options{PinRoot: pin, StateRoot: state, Netns: p.NsB})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fw.Detach([]string{p.IfB}) })
	return fw
}

func mustApply(t testing.TB, fw *Firewall, pol *policy.Policy, ifaces ...string) *ApplyResult {
	t.Helper()
	res, err := fw.Apply(ApplyRequest{Policy: pol, Ifaces: ifaces})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// delivered sends n datagrams from A to B's port and counts arrivals.
func delivered(t *testing.T, p *testutil.Pair, port, n int) int {
	t.Helper()
	rx := testutil.UDPListener(t, p.NsB, p.B4, port)
	defer rx.Close()
	testutil.SendUDP(t, p.NsA, p.B4, port, n)
	return testutil.CountUDP(rx, 300*time.Millisecond)
}

func hookStatus(t testing.TB, fw *Firewall) []HookStatus {
	t.Helper()
	st, err := fw.Status()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// runsHash checks what the kernel runs on the hook: the generation whose
// program the link runs, with this policy hash.
func runsHash(t testing.TB, fw *Firewall, h Hook, hash string) {
	t.Helper()
	if g := liveGen(t, fw, h); g.PolicyHash != hash {
		t.Fatalf("the kernel runs policy %s, want %s", g.PolicyHash[:12], hash[:12])
	}
}

// liveGen is the generation whose program the hook's link runs.
func liveGen(t testing.TB, fw *Firewall, h Hook) *generation {
	t.Helper()
	st, err := fw.state(h)
	if err != nil {
		t.Fatal(err)
	}
	g, err := fw.readGen(h, st.live)
	if err != nil || g == nil {
		t.Fatalf("the link runs no generation rampart describes (live %d, %v)", st.live, err)
	}
	return g
}

// TestTwoEnginesOnDistinctRoots runs two firewalls on roots of their own at
// once: each sees and changes only its own hooks.
func TestTwoEnginesOnDistinctRoots(t *testing.T) {
	testutil.Privileged(t)
	pairs := []*testutil.Pair{testutil.NewPair(t), testutil.NewPair(t)}
	fws := []*Firewall{newFirewall(t, pairs[0]), newFirewall(t, pairs[1])}
	dir := t.TempDir()
	pols := []*policy.Policy{parse(t, dir, "a.yaml", policyA), parse(t, dir, "b.yaml", policyB)}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range fws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				if _, err := fws[i].Apply(ApplyRequest{Policy: pols[i], Ifaces: []string{pairs[i].IfB}}); err != nil {
					errs[i] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for i, fw := range fws {
		st := hookStatus(t, fw)
		if len(st) != 1 || st[0].Iface != pairs[i].IfB || st[0].State != StateActive || st[0].Generation != 5 {
			t.Errorf("engine %d sees %+v, want its own hook at generation 5", i, st)
		}
	}
	if got := delivered(t, pairs[0], 9100, 20); got != 0 {
		t.Errorf("pair 0 runs A: %d datagrams to 9100 arrived", got)
	}
	if got := delivered(t, pairs[1], 9100, 20); got != 20 {
		t.Errorf("pair 1 runs B: %d of 20 datagrams to 9100 arrived", got)
	}
	if _, err := fws[0].Detach([]string{pairs[0].IfB}); err != nil {
		t.Fatal(err)
	}
	if st := hookStatus(t, fws[1]); len(st) != 1 || st[0].State != StateActive {
		t.Errorf("detaching engine 0 touched engine 1: %+v", st)
	}
}

// TestApplyAllOrNothing: when the second interface refuses the new policy,
// the first goes back to the old one.
func TestApplyAllOrNothing(t *testing.T) {
	p, fw := withSecondIface(t)
	dir := t.TempDir()
	a, b := parse(t, dir, "a.yaml", policyA), parse(t, dir, "b.yaml", policyB)
	resA := mustApply(t, fw, a, p.IfB)
	hashA := resA.Applied[0].PolicyHash

	// Another program's XDP on the second interface: an explicit XDP mode
	// is refused there, after the first interface was already swapped.
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL", Instructions: asm.Instructions{asm.LoadImm(asm.R0, 2, asm.DWord), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	if err := netns.Run(p.NsB, func() error {
		l, err := netlink.LinkByName("second")
		if err != nil {
			return err
		}
		return netlink.LinkSetXdpFd(l, prog.FD())
	}); err != nil {
		t.Fatal(err)
	}
	_, err = fw.Apply(ApplyRequest{Policy: b, Ifaces: []string{p.IfB, "second"}, Mode: datapath.ModeXDPNative})
	if err == nil || !strings.Contains(err.Error(), "another XDP program") {
		t.Fatalf("apply over a foreign program: %v", err)
	}
	runsHash(t, fw, Hook{Iface: p.IfB}, hashA)
	st := hookStatus(t, fw)
	if len(st) != 1 || st[0].PolicyHash != hashA || st[0].State != StateActive {
		t.Fatalf("after the refused apply: %+v", st)
	}
	if got := delivered(t, p, 9100, 20); got != 0 {
		t.Errorf("%d datagrams to 9100 arrived: A no longer runs", got)
	}
}

// TestFullStateDisk: with no room for state, an apply fails before the swap
// and the running policy stays, as the kernel and status both say.
func TestFullStateDisk(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	pin, _ := testutil.Roots(t)
	state := t.TempDir()
	testutil.Run(t, "mount", "-t", "tmpfs", "-o", "size=128k", "rampart-test", state)
	t.Cleanup(func() { exec.Command("umount", state).Run() })
	fw, err := New(Options{PinRoot: pin, StateRoot: state, Netns: p.NsB})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fw.Detach([]string{p.IfB}) })
	dir := t.TempDir()
	a, b := parse(t, dir, "a.yaml", policyA), parse(t, dir, "b.yaml", policyB)
	hashA := mustApply(t, fw, a, p.IfB).Applied[0].PolicyHash

	filler := filepath.Join(state, "filler")
	exec.Command("dd", "if=/dev/zero", "of="+filler, "bs=4k").Run() // until the disk is full
	_, err = fw.Apply(ApplyRequest{Policy: b, Ifaces: []string{p.IfB}})
	if err == nil || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("apply on a full disk: %v, want no space left", err)
	}
	runsHash(t, fw, Hook{Iface: p.IfB}, hashA)
	if st := hookStatus(t, fw); len(st) != 1 || st[0].PolicyHash != hashA || st[0].Generation != 1 {
		t.Fatalf("status after the refused apply: %+v", st)
	}
	if got := delivered(t, p, 9100, 20); got != 0 {
		t.Errorf("%d datagrams to 9100 arrived: A no longer runs", got)
	}
	if gens, _ := fw.generations(Hook{Iface: p.IfB}); len(gens) != 1 {
		t.Errorf("generations left: %v, want only A's", gens)
	}
	os.Remove(filler)
	if res := mustApply(t, fw, b, p.IfB); res.Applied[0].Generation != 2 {
		t.Errorf("apply with room again: %+v", res.Applied)
	}
}

// TestCrashMidApply kills an apply at each point where a crash hurts; the
// next command finds the journal no process owns and rolls back: the kernel
// runs the old policy, status says so, counters move, no generation is left
// behind.
func TestCrashMidApply(t *testing.T) {
	testutil.Privileged(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, point := range []string{"pinned", "journaled", "swapped"} {
		t.Run(point, func(t *testing.T) {
			p := testutil.NewPair(t)
			fw := newFirewall(t, p)
			dir := t.TempDir()
			hashA := mustApply(t, fw, parse(t, dir, "a.yaml", policyA), p.IfB).Applied[0].PolicyHash
			parse(t, dir, "b.yaml", policyB)

			cmd := exec.Command(exe, "-test.run=^$")
			cmd.Env = append(os.Environ(), "RAMPART_CRASH_AT="+point, "RAMPART_CRASH_PINS="+fw.pinRoot, "RAMPART_CRASH_STATE="+fw.stateRoot,
				"RAMPART_CRASH_NETNS="+p.NsB, "RAMPART_CRASH_IFACE="+p.IfB, "RAMPART_CRASH_POLICY="+filepath.Join(dir, "b.yaml"))
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("the apply was not killed at %s: %v\n%s", point, err, out)
			}
			notes, err := fw.Recover()
			if err != nil {
				t.Fatal(err)
			}
			if point != "pinned" && (len(notes) != 1 || !strings.Contains(notes[0], "rolled back: its apply died")) {
				t.Errorf("recovery notes: %q", notes)
			}
			h := Hook{Iface: p.IfB}
			runsHash(t, fw, h, hashA)
			if st := hookStatus(t, fw); len(st) != 1 || st[0].PolicyHash != hashA || st[0].State != StateActive {
				t.Fatalf("status after the crash: %+v", st)
			}
			if gens, _ := fw.generations(h); len(gens) != 1 {
				t.Errorf("generations left: %v, want only A's", gens)
			}
			if got := delivered(t, p, 9100, 20); got != 0 {
				t.Errorf("%d datagrams to 9100 arrived: A does not run", got)
			}
			before := count(t, fw, "count")
			if got := delivered(t, p, 9200, 20); got != 20 {
				t.Errorf("%d of 20 datagrams to 9200 arrived under A", got)
			}
			if after := count(t, fw, "count"); after != before+20 {
				t.Errorf("rule count went from %d to %d over 20 datagrams: frozen counters", before, after)
			}
		})
	}
}

func count(t testing.TB, fw *Firewall, rule string) uint64 {
	t.Helper()
	s, err := fw.Stats()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range s.Rows {
		if r.Name == rule {
			return r.Packets
		}
	}
	t.Fatalf("no rule %s in %+v", rule, s.Rows)
	return 0
}

// TestInterfaceRecreated: an interface deleted and created again under its
// name carries nothing; status says so, and reattach is the one command
// that puts the policy back.
func TestInterfaceRecreated(t *testing.T) {
	p, fw := firewallOnPair(t)
	mustApply(t, fw, parse(t, t.TempDir(), "a.yaml", policyA), p.IfB)
	if got := delivered(t, p, 9100, 20); got != 0 {
		t.Fatalf("%d datagrams to 9100 arrived", got)
	}

	testutil.Run(t, "ip", "-n", p.NsB, "link", "del", p.IfB)
	if st := hookStatus(t, fw); len(st) != 1 || st[0].State != StateIfaceGone || st[0].Attached {
		t.Fatalf("status with the interface gone: %+v", st)
	}
	recreate(t, p)
	st := hookStatus(t, fw)
	if len(st) != 1 || st[0].State != StateIfaceRecreated || st[0].Attached || !strings.Contains(st[0].Fix, "reattach") {
		t.Fatalf("status with the interface recreated: %+v", st)
	}
	if got := delivered(t, p, 9100, 20); got != 20 {
		t.Fatalf("%d of 20 datagrams arrived: the test does not show the gap", got)
	}
	res, err := fw.Reattach(nil)
	if err != nil || len(res) != 1 {
		t.Fatalf("reattach: %+v %v", res, err)
	}
	if st := hookStatus(t, fw); st[0].State != StateActive || !st[0].Attached {
		t.Fatalf("status after reattach: %+v", st)
	}
	if got := delivered(t, p, 9100, 20); got != 0 {
		t.Errorf("after reattach %d datagrams to 9100 arrived", got)
	}
}

// recreate builds the pair's veth again with the same names and addresses.
func recreate(t *testing.T, p *testutil.Pair) {
	t.Helper()
	testutil.Run(t, "ip", "-n", p.NsA, "link", "add", p.IfA, "type", "veth", "peer", "name", p.IfB, "netns", p.NsB)
	for _, side := range []struct {
		ns, ifc string
		v4, v6  net.IP
	}{{p.NsA, p.IfA, p.A4, p.A6}, {p.NsB, p.IfB, p.B4, p.B6}} {
		testutil.Run(t, "ip", "-n", side.ns, "addr", "add", side.v4.String()+"/24", "dev", side.ifc)
		testutil.Run(t, "ip", "-n", side.ns, "addr", "add", side.v6.String()+"/64", "dev", side.ifc, "nodad")
		testutil.Run(t, "ip", "-n", side.ns, "link", "set", side.ifc, "up")
	}
	testutil.Run(t, "ip", "-n", p.NsA, "neigh", "replace", p.B4.String(), "lladdr", mac(t, p.NsB, p.IfB), "dev", p.IfA, "nud", "permanent")
}

func mac(t *testing.T, ns, ifc string) string {
	var m string
	netns.Run(ns, func() error {
		i, err := net.InterfaceByName(ifc)
		if err == nil {
			m = i.HardwareAddr.String()
		}
		return err
	})
	return m
}

// TestReapplyKeepsTheFloodKey: a re-apply loads its program under the key
// the live one has, so that SYN cookies already sent stay valid; a first
// apply draws one.
func TestReapplyKeepsTheFloodKey(t *testing.T) {
	p, fw := firewallOnPair(t)
	dir := t.TempDir()
	h := Hook{Iface: p.IfB}
	keys := make([][2]uint64, 0, 2)
	for _, pol := range []*policy.Policy{parse(t, dir, "a.yaml", policyA), parse(t, dir, "b.yaml", policyB)} {
		mustApply(t, fw, pol, p.IfB)
		keys = append(keys, liveGen(t, fw, h).FloodKey)
	}
	if keys[0] == ([2]uint64{}) || keys[1] != keys[0] {
		t.Errorf("flood keys %x then %x: want one key, drawn once", keys[0], keys[1])
	}
}

// withSecondIface is a pair whose B side has a second interface, "second",
// and a firewall there.
func withSecondIface(t *testing.T) (*testutil.Pair, *Firewall) {
	p, fw := firewallOnPair(t)
	testutil.Run(t, "ip", "-n", p.NsB, "link", "add", "second", "type", "veth", "peer", "name", "second-peer")
	testutil.Run(t, "ip", "-n", p.NsB, "link", "set", "second", "up")
	t.Cleanup(func() { fw.Detach([]string{"second"}) })
	return p, fw
}

// TestApplyPinsEveryHook: one apply on two interfaces pins its objects in
// both hooks' generations (pinning the objects a second time once moved
// the first hook's pins away, which left its counters unreadable).
func TestApplyPinsEveryHook(t *testing.T) {
	p, fw := withSecondIface(t)
	mustApply(t, fw, parse(t, t.TempDir(), "a.yaml", policyA), p.IfB, "second")
	for _, ifc := range []string{p.IfB, "second"} {
		h := Hook{Iface: ifc}
		objs, err := datapath.LoadPinned(fw.genPins(h, liveGen(t, fw, h).N))
		if err != nil {
			t.Fatalf("%s: %v", ifc, err)
		}
		objs.Close()
	}
	snap, err := fw.Stats()
	if err != nil {
		t.Fatal(err)
	}
	hooks := map[string]bool{}
	for _, r := range snap.Rows {
		hooks[r.Iface] = true
	}
	if !hooks[p.IfB] || !hooks["second"] {
		t.Errorf("stats rows of %v, want both interfaces", hooks)
	}
}

// linkProgram is the program the hook's link runs.
func linkProgram(t testing.TB, fw *Firewall, h Hook) ebpf.ProgramID {
	t.Helper()
	st, err := fw.state(h)
	if err != nil {
		t.Fatal(err)
	}
	return st.link.Program
}

// TestReapplyKeepsTheProgram: a policy that fits the running program's
// shape is swapped in as a new generation of its maps, with no program
// loaded, and the kernel enforces it; one that needs another shape (SYN
// cookies) gets a program of its own.
func TestReapplyKeepsTheProgram(t *testing.T) {
	p, fw := firewallOnPair(t)
	dir := t.TempDir()
	h := Hook{Iface: p.IfB}
	a, b := parse(t, dir, "a.yaml", policyA), parse(t, dir, "b.yaml", policyB)
	hashA := mustApply(t, fw, a, p.IfB).Applied[0].PolicyHash
	prog := linkProgram(t, fw, h)
	hashB := mustApply(t, fw, b, p.IfB).Applied[0].PolicyHash
	if got := linkProgram(t, fw, h); got != prog {
		t.Fatalf("the link runs program %d after the re-apply, want %d still", got, prog)
	}
	runsHash(t, fw, h, hashB)
	if got := delivered(t, p, 9200, 20); got != 0 {
		t.Errorf("%d datagrams to 9200 arrived: B is not enforced", got)
	}
	if got := delivered(t, p, 9100, 20); got != 20 {
		t.Errorf("%d of 20 datagrams to 9100 arrived: A is still enforced", got)
	}
	mustApply(t, fw, a, p.IfB)
	runsHash(t, fw, h, hashA)
	if got := delivered(t, p, 9100, 20); got != 0 {
		t.Errorf("%d datagrams to 9100 arrived: A is not enforced again", got)
	}
	mustApply(t, fw, parse(t, dir, "c.yaml", "rules:\n  - {name: c, proto: tcp, dport: 80, action: syncookie}\n"), p.IfB)
	if got := linkProgram(t, fw, h); got == prog {
		t.Fatal("a policy with SYN cookies runs on the program of one without")
	}
}

// TestReapplyLeavesOtherHooks: a program two hooks run is not given a new
// generation by an apply to one of them alone: the other keeps its policy.
func TestReapplyLeavesOtherHooks(t *testing.T) {
	p, fw := withSecondIface(t)
	dir := t.TempDir()
	a, b := parse(t, dir, "a.yaml", policyA), parse(t, dir, "b.yaml", policyB)
	hashB := mustApply(t, fw, b, p.IfB, "second").Applied[0].PolicyHash
	shared := linkProgram(t, fw, Hook{Iface: "second"})
	if linkProgram(t, fw, Hook{Iface: p.IfB}) != shared {
		t.Fatal("one apply on two interfaces loaded two programs")
	}
	mustApply(t, fw, a, p.IfB)
	if got := linkProgram(t, fw, Hook{Iface: p.IfB}); got == shared {
		t.Fatal("the apply to one interface changed the program the other runs")
	}
	runsHash(t, fw, Hook{Iface: "second"}, hashB)
	if got := delivered(t, p, 9100, 20); got != 0 {
		t.Errorf("%d datagrams to 9100 arrived: A is not enforced", got)
	}
}

// TestReapplyCarriesCounts: a re-apply carries each unchanged rule's
// counts into the new generation's record, and a limit rule's events
// (what went over its rate); a policy without limit or cookie rules
// carries no events, which are all zero.
func TestReapplyCarriesCounts(t *testing.T) {
	p, fw := firewallOnPair(t)
	dir := t.TempDir()
	h := Hook{Iface: p.IfB}
	const limited = "rules:\n  - {name: slow, proto: udp, dport: 9300, action: limit, rate: 5/s, burst: 5}\n  - {name: drop-9100, proto: udp, dport: 9100, action: drop}\n"
	mustApply(t, fw, parse(t, dir, "a.yaml", limited), p.IfB)
	delivered(t, p, 9300, 50)
	delivered(t, p, 9100, 20)
	old := liveGen(t, fw, h)
	counts, events, err := fw.liveCounts(h, old)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) == 0 || events[0].Over == 0 || counts[abi.SlotRule0+1].Packets != 20 {
		t.Fatalf("the limit rule's events %+v, the drop rule counted %d packets: want some over the rate and 20", events, counts[abi.SlotRule0+1].Packets)
	}
	// The rules swap places, and one more comes first.
	mustApply(t, fw, parse(t, dir, "b.yaml", "rules:\n  - {name: new, proto: tcp, action: pass}\n  - {name: drop-9100, proto: udp, dport: 9100, action: drop}\n  - {name: slow, proto: udp, dport: 9300, action: limit, rate: 5/s, burst: 5}\n"), p.IfB)
	g := liveGen(t, fw, h)
	if g.Carried[abi.SlotRule0+1] != counts[abi.SlotRule0+1] || g.CarriedEvents[2] != events[0] || g.Carried[abi.SlotRule0+2] != counts[abi.SlotRule0] {
		t.Errorf("carried %+v %+v %+v, want %+v %+v %+v", g.Carried[abi.SlotRule0+1], g.Carried[abi.SlotRule0+2], g.CarriedEvents[2], counts[abi.SlotRule0+1], counts[abi.SlotRule0], events[0])
	}
	mustApply(t, fw, parse(t, dir, "c.yaml", policyA), p.IfB)
	if slices.ContainsFunc(liveGen(t, fw, h).Rules, RuleInfo.hasEvents) {
		t.Fatal("policy A has a limit or cookie rule: it cannot show that events go unread")
	}
	if _, events, err := fw.liveCounts(h, liveGen(t, fw, h)); err != nil || events != nil {
		t.Errorf("a policy without limit or cookie rules: events %v (%v), want none read", events, err)
	}
}

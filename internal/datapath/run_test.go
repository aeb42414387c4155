package datapath_test

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/compile"
	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/packet"
	"github.com/rampart-fw/rampart/internal/policy"
	"github.com/rampart-fw/rampart/internal/testutil"
)

// loaded is a policy loaded into a program, with the reference beside it.
type loaded struct {
	pol  *policy.Policy
	objs *datapath.Objects
	prog *ebpf.Program
}

func load(t testing.TB, kind datapath.Kind, yaml string) *loaded {
	t.Helper()
	testutil.Privileged(t)
	pol, err := policy.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := datapath.Load(compile.Build(pol))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { objs.Close() })
	return &loaded{pol, objs, objs.Program(kind)}
}

// run passes one frame through the program and returns its action and the
// counter slot it was counted in.
func (l *loaded) run(t testing.TB, frame []byte) (uint8, int) {
	t.Helper()
	slots := abi.SlotRule0 + len(l.pol.Rules)
	before, err := l.objs.ReadCounters(slots)
	if err != nil {
		t.Fatal(err)
	}
	ret, err := l.prog.Run(&ebpf.RunOptions{Data: frame})
	if err != nil {
		t.Fatalf("prog run: %v", err)
	}
	after, err := l.objs.ReadCounters(slots)
	if err != nil {
		t.Fatal(err)
	}
	slot := -1
	for i := range after {
		if d := after[i].Packets - before[i].Packets; d != 0 {
			if d != 1 || slot >= 0 {
				t.Fatalf("frame counted %d times (slot %d, earlier slot %d)", d, i, slot)
			}
			if got := after[i].Bytes - before[i].Bytes; got != uint64(len(frame)) {
				t.Fatalf("slot %d counted %d bytes, frame has %d", i, got, len(frame))
			}
			slot = i
		}
	}
	return actionOf(l.prog.Type(), ret), slot
}

// runnable reports whether BPF_PROG_TEST_RUN accepts the frame for this
// program type: for skb programs the kernel refuses an untagged IPv4 or IPv6
// frame too short for its IP header, a limit of the test harness only
// (such frames still reach tc on a live interface). XDP covers them.
func runnable(typ ebpf.ProgramType, frame []byte) bool {
	if typ != ebpf.SchedCLS || len(frame) < 14 {
		return true
	}
	switch binary.BigEndian.Uint16(frame[12:]) {
	case 0x0800:
		return len(frame) >= 14+20
	case 0x86dd:
		return len(frame) >= 14+40
	}
	return true
}

func actionOf(typ ebpf.ProgramType, ret uint32) uint8 {
	switch {
	case typ == ebpf.XDP && ret == 1, typ == ebpf.SchedCLS && ret == 2:
		return abi.ActionDrop
	case typ == ebpf.XDP && ret == 3, typ == ebpf.SchedCLS && ret == 7: // XDP_TX, TC_ACT_REDIRECT
		return actionTX
	}
	return abi.ActionPass
}

// actionTX is a frame sent back out: a SYN-ACK.
const actionTX = 100

// expectedSlot maps the reference verdict to the data plane's counter slot.
func expectedSlot(v policy.Verdict) int {
	switch {
	case v.Class == policy.ClassMalformed:
		return abi.SlotMalformed
	case v.Class == policy.ClassNonIP:
		return abi.SlotNonIP
	case v.Unparsed:
		return abi.SlotUnparsed
	case v.Rule < 0:
		return abi.SlotDefault
	}
	return abi.SlotRule0 + v.Rule
}

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

// TestFeaturesHere: the kernel under test has everything rampart needs.
func TestFeaturesHere(t *testing.T) {
	testutil.Privileged(t)
	if err := datapath.Require(append(datapath.FeaturesFilter, datapath.FeatureLiveFrames, datapath.FeatureKernelBTF)...); err != nil {
		t.Fatal(err)
	}
}

// TestLoadShapes loads policies that leave different parts of the program
// dead for the verifier (no rules, no lists, lists of one family, source
// or destination only): the kernel removes dead code before the JIT, and a
// callback it removed while something still referred to it failed the
// load ("No program to jit").
func TestLoadShapes(t *testing.T) {
	for _, yaml := range []string{
		"rules: []\n",
		"rules:\n  - {name: r, proto: udp, action: drop}\n",
		"lists:\n  a: {prefixes: [10.0.0.0/8]}\nrules:\n  - {name: r, src: a, action: drop}\n",
		"lists:\n  a: {prefixes: [\"2001:db8::/32\"]}\nrules:\n  - {name: r, dst: a, action: drop}\n",
		"lists:\n  a: {prefixes: [10.0.0.1, \"2001:db8::1\"]}\nrules:\n  - {name: r, src: a, action: drop}\n  - {name: s, dst: a, action: drop}\n",
		"rules:\n  - {name: r, action: limit, rate: 10/s}\n",
		"rules:\n  - {name: r, proto: udp, action: limit, rate: 10Mbit/s, per: source/24}\n",
		"rules:\n  - {name: r, dport: 80, action: syncookie}\n",
		"lists:\n  a: {prefixes: [10.0.0.0/8]}\nrules:\n  - {name: r, src: a, action: drop}\n  - {name: s, dport: [80, 443], action: syncookie}\n  - {name: t, action: limit, rate: 1/s, per: source}\n",
	} {
		load(t, datapath.KindXDP, yaml) // one load verifies both programs, XDP and tc
	}
}

// TestStaticRows: past policy.MaxLists ways of naming lists, the program
// that reads the classes' rows (and answers SYNs, the largest) loads, and
// the rows decide: a frame from a static list takes its rule, alone and
// beside a list with a bit on the same side; one from no list the
// default. The kernel tier runs it on every kernel.
func TestStaticRows(t *testing.T) {
	var b strings.Builder
	b.WriteString("lists:\n")
	n := policy.MaxLists + 7
	for i := range n {
		fmt.Fprintf(&b, "  c%d: {prefixes: [10.0.%d.0/24, \"2001:db8:%x::/48\"]}\n", i, i, i)
	}
	b.WriteString("rules:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - {name: r%d, src: c%d, proto: udp, dport: %d, action: drop}\n", i, i, 1000+i)
	}
	fmt.Fprintf(&b, "  - {name: mixed, src: [c0, c%d], proto: udp, dport: 7, action: drop}\n", n-1)
	b.WriteString("  - {name: s, dport: 80, action: syncookie}\ndefault: pass\n")
	l := load(t, datapath.KindXDP, b.String())
	if st := l.pol.ListUse().Static(); len(st) != 7 {
		t.Fatalf("static lists %v, want 7", st)
	}
	for _, c := range []struct {
		src   string
		dport uint16
		rule  int
	}{
		{fmt.Sprintf("10.0.%d.9", n-1), uint16(1000 + n - 1), n - 1}, // a static list's own rule
		{fmt.Sprintf("2001:db8:%x::9", n-2), uint16(1000 + n - 2), n - 2},
		{fmt.Sprintf("10.0.%d.9", n-1), 7, n}, // its list beside one with a bit
		{"10.0.0.9", 7, n},
		{fmt.Sprintf("10.0.%d.9", n-1), 1000, -1}, // another list's rule: none
		{"10.1.0.9", uint16(1000 + n - 1), -1},
	} {
		dst := "192.0.2.1"
		if ip(c.src).Is6() {
			dst = "2001:db8:ffff::1"
		}
		frame := packet.Frame{Src: ip(c.src), Dst: ip(dst), Proto: 17, Sport: 9, Dport: c.dport}.Bytes()
		act, slot := l.run(t, frame)
		want, wantSlot := uint8(abi.ActionDrop), abi.SlotRule0+c.rule
		if c.rule < 0 {
			want, wantSlot = abi.ActionPass, abi.SlotDefault
		}
		if act != want || slot != wantSlot {
			t.Errorf("from %s to port %d: action %d in slot %d, want %d in %d", c.src, c.dport, act, slot, want, wantSlot)
		}
	}
}

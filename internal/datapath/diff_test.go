package datapath_test

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strconv"
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

// TestDifferential runs random and mutated frames through the BPF program and
// through policy.Eval under random policies. Every frame's action must agree,
// and so must the per-slot counters after each policy's batch.
// RAMPART_DIFF_FRAMES sets the XDP frame count (default 1,000,000); tc runs a
// quarter of it.
func TestDifferential(t *testing.T) {
	testutil.Privileged(t)
	total := 1_000_000
	if s := os.Getenv("RAMPART_DIFF_FRAMES"); s != "" {
		total, _ = strconv.Atoi(s)
	}
	if testing.Short() {
		total = 20_000
	}
	for _, kind := range []datapath.Kind{datapath.KindXDP, datapath.KindTC} {
		frames := total
		if kind == datapath.KindTC {
			frames = total / 4
		}
		t.Run(kind.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(kind)))
			const perPolicy = 5000
			ran := 0
			ps := &policies{t: t, kind: kind}
			for ran < frames {
				yaml := randomPolicy(rng)
				l := ps.load(yaml)
				n, _ := diffBatch(t, rng, l, min(perPolicy, frames-ran), yaml)
				ran += n
				ps.done(l)
			}
			t.Logf("%s: %d frames agreed, %d policies: %d programs loaded, the others generations made live over them", kind, ran, ps.n, ps.programs)
		})
	}
}

// policies loads a run's policies as apply does: most become a generation
// of a loaded program (datapath.LoadOver, then Activate: the maps change
// under the program, nothing is verified); every freshEvery-th, and any
// that fits none of the last keptShapes programs' shapes (SYN cookies or not,
// tables' sizes), loads a program of its own, so that the verifier sees
// programs of many shapes too.
type policies struct {
	t        *testing.T
	kind     datapath.Kind
	shapes   []*loaded // the last keptShapes programs loaded, each with its first generation
	n        int       // policies loaded
	programs int       // of them, with a program of their own
}

const (
	freshEvery = 10
	keptShapes = 8
)

func (ps *policies) load(yaml string) *loaded {
	t := ps.t
	t.Helper()
	ps.n++
	if ps.n%freshEvery != 0 {
		pol, err := policy.Parse("test.yaml", []byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		img := compile.Build(pol)
		for _, shape := range ps.shapes {
			o, fits, err := datapath.LoadOver(shape.objs, img, nil)
			if err != nil {
				t.Fatalf("LoadOver: %v\npolicy:\n%s", err, yaml)
			}
			if fits {
				if err := o.Activate(); err != nil {
					o.Close()
					t.Fatalf("activate: %v", err)
				}
				return &loaded{pol, o, o.Program(ps.kind)}
			}
		}
	}
	if len(ps.shapes) == keptShapes {
		ps.shapes[0].objs.Close()
		ps.shapes = ps.shapes[1:]
	}
	l := load(t, ps.kind, yaml)
	ps.shapes = append(ps.shapes, l)
	ps.programs++
	return l
}

// done closes what l holds unless it is a program policies keeps.
func (ps *policies) done(l *loaded) {
	if !slices.Contains(ps.shapes, l) {
		l.objs.Close()
	}
}

func diffBatch(t *testing.T, rng *rand.Rand, l *loaded, n int, yaml string) (ran, deepest int) {
	t.Helper()
	slots := abi.SlotRule0 + len(l.pol.Rules)
	want := make([]uint64, slots)
	for ran < n {
		frame := randomFrame(rng)
		if !runnable(l.prog.Type(), frame) {
			continue
		}
		ret, err := l.prog.Run(&ebpf.RunOptions{Data: frame})
		if err != nil {
			t.Fatalf("prog run on %x: %v", frame, err)
		}
		v := l.pol.Eval(frame)
		if got := actionOf(l.prog.Type(), ret); !allowed(v, frame, got) {
			t.Fatalf("disagreement on frame %x\npolicy:\n%s\ndata plane action %d, reference %+v", frame, yaml, got, v)
		}
		want[expectedSlot(v)]++
		deepest = max(deepest, v.Rule)
		ran++
	}
	got, err := l.objs.ReadCounters(slots)
	if err != nil {
		t.Fatal(err)
	}
	events, err := l.objs.ReadEvents(len(l.pol.Rules))
	if err != nil {
		t.Fatal(err)
	}
	for slot := range want {
		n := got[slot].Packets
		if r := slot - abi.SlotRule0; r >= 0 && r < len(events) {
			n += events[r].Over // a limit rule's packets over the limit are counted apart
		}
		if n != want[slot] {
			t.Fatalf("slot %d counted %d packets, reference %d\npolicy:\n%s", slot, n, want[slot], yaml)
		}
	}
	return ran, deepest
}

// allowed tells whether the data plane's action fits the reference verdict:
// a limit rule passes or drops, a syncookie rule answers a SYN (or drops
// it, when the SYN cannot be answered) and passes other segments.
func allowed(v policy.Verdict, frame []byte, got uint8) bool {
	switch v.Action {
	case policy.Limit:
		return got == abi.ActionPass || got == abi.ActionDrop
	case policy.Syncookie:
		if p, _ := policy.ParseFrame(frame); p.L4Len >= 14 && p.TCPFlags&0x17 == policy.FlagSYN {
			return got == actionTX || got == abi.ActionDrop
		}
		return got == abi.ActionPass
	}
	return got == uint8(v.Action)
}

// The address universe is small so that random frames hit random lists.
func randomAddr(rng *rand.Rand, v6 bool) netip.Addr {
	if v6 {
		var b [16]byte
		copy(b[:], []byte{0x20, 0x01, 0x0d, 0xb8})
		b[4], b[5], b[15] = byte(rng.IntN(4)), byte(rng.IntN(256)), byte(rng.IntN(8))
		return netip.AddrFrom16(b)
	}
	return netip.AddrFrom4([4]byte{10, byte(rng.IntN(4)), byte(rng.IntN(256)), byte(rng.IntN(8))})
}

func randomPrefix(rng *rand.Rand) netip.Prefix {
	v6 := rng.IntN(3) == 0
	a := randomAddr(rng, v6)
	bits := []int{8, 14, 16, 22, 24, 30, 31, 32}[rng.IntN(8)]
	if v6 {
		bits = []int{32, 40, 46, 48, 64, 120, 126, 128}[rng.IntN(8)]
	}
	return netip.PrefixFrom(a, bits).Masked()
}

func randomRange(rng *rand.Rand, lo, hi int) string {
	a := lo + rng.IntN(hi-lo+1)
	if rng.IntN(2) == 0 {
		return strconv.Itoa(a)
	}
	return fmt.Sprintf("%d-%d", a, a+rng.IntN(hi-a+1))
}

func randomPolicy(rng *rand.Rand) string {
	return randomPolicySized(rng, rng.IntN(12), 1+rng.IntN(6), nil)
}

// randomPolicySized writes a policy of n rules over nLists lists; inline
// prefixes beside a list come from pool when it is not nil, so that a large
// policy stays within the lists a policy may name, and those alone on
// their side are drawn afresh.
func randomPolicySized(rng *rand.Rand, n, nLists int, pool []netip.Prefix) string {
	prefix := func() netip.Prefix {
		if pool != nil {
			return pool[rng.IntN(len(pool))]
		}
		return randomPrefix(rng)
	}
	ports := func() string {
		if portSpread > 72 { // narrow: frames reach rules deep in the policy
			a := rng.IntN(portSpread)
			if rng.IntN(2) == 0 {
				return strconv.Quote(strconv.Itoa(a))
			}
			return strconv.Quote(fmt.Sprintf("%d-%d", a, a+rng.IntN(20)))
		}
		return strconv.Quote(randomRange(rng, 0, 70))
	}
	var b strings.Builder
	b.WriteString("lists:\n")
	for i := 0; i < nLists; i++ {
		var ps []string
		if listGroup > 1 {
			// A narrow prefix each, so that every list of a group
			// decides some frames.
			p := randomPrefix(rng)
			for p.Bits() < 24 || p.Addr().Is6() && p.Bits() < 120 {
				p = randomPrefix(rng)
			}
			ps = append(ps, fmt.Sprintf("%q", p))
		}
		for j := 0; listGroup == 1 && j < 1+rng.IntN(40); j++ {
			ps = append(ps, fmt.Sprintf("%q", randomPrefix(rng)))
		}
		fmt.Fprintf(&b, "  l%d: {prefixes: [%s]}\n", i, strings.Join(ps, ", "))
	}
	b.WriteString("rules:\n")
	for i := 0; i < n; i++ {
		var f []string
		f = append(f, fmt.Sprintf("name: r%d", i))
		proto := ""
		if rng.IntN(2) == 0 {
			proto = []string{"tcp", "udp", "icmp", "icmpv6", "47"}[rng.IntN(5)]
			// Some as ranges, each holding the one protocol of the frames
			// its name stands for: as narrow a rule, through the ranges.
			text := proto
			switch {
			case proto == "47":
				text = "46-50"
			case proto == "udp" && i%3 == 0:
				text = "17-18"
			}
			f = append(f, "proto: "+text)
		}
		if rng.IntN(3) == 0 && proto != "icmp" && proto != "icmpv6" {
			f = append(f, fmt.Sprintf("family: %d", []int{4, 6}[rng.IntN(2)]))
		}
		// A side's lists: one, or with listGroup set, a group of them
		// (consecutive names), or half of one.
		named := func() string {
			if listGroup == 1 {
				return fmt.Sprintf("l%d", rng.IntN(nLists))
			}
			first, n := rng.IntN(nLists/listGroup)*listGroup, listGroup
			if rng.IntN(8) == 0 {
				n /= 2
			}
			var ls []string
			for i := first; i < first+n; i++ {
				ls = append(ls, fmt.Sprintf("l%d", i))
			}
			return strings.Join(ls, ", ")
		}
		for _, side := range []string{"src", "dst"} {
			switch rng.IntN(5) {
			case 0:
				f = append(f, fmt.Sprintf("%s: [%s]", side, named()))
			case 1:
				f = append(f, fmt.Sprintf("%s: [%s, %q]", side, named(), prefix()))
			case 2:
				// Alone on its side: the entry checks its bits, and a
				// policy may name any number.
				f = append(f, fmt.Sprintf("%s: %q", side, randomPrefix(rng)))
			}
		}
		if proto == "tcp" || proto == "udp" || proto == "" {
			if rng.IntN(3) == 0 {
				f = append(f, "sport: "+ports())
			}
			switch n := rng.IntN(6); {
			case n <= 1 || portSpread > 72 && n != 2:
				f = append(f, "dport: "+ports())
			case n == 2:
				f = append(f, fmt.Sprintf("dport: [%s, %s]", ports(), ports()))
			}
		}
		if (proto == "tcp" || proto == "") && rng.IntN(3) == 0 {
			flags := []string{"syn", "syn,!ack", "ack", "!syn", "fin,ack", "rst"}[rng.IntN(6)]
			f = append(f, fmt.Sprintf("tcp_flags: %q", flags))
		}
		if rng.IntN(4) == 0 {
			f = append(f, "length: "+strconv.Quote(randomRange(rng, 0, 200)))
		}
		// The fields the leaf checks (BGP FlowSpec's): ICMP type and code,
		// DSCP, flow label, fragment bits.
		l4 := slices.ContainsFunc(f, func(s string) bool { return strings.Contains(s, "port: ") || strings.HasPrefix(s, "tcp_flags") })
		if (proto == "icmp" || proto == "icmpv6" || proto == "") && !l4 && rng.IntN(3) == 0 {
			f = append(f, "icmp_type: "+strconv.Quote(randomRange(rng, 0, 10)))
			if rng.IntN(2) == 0 {
				f = append(f, "icmp_code: "+strconv.Quote(randomRange(rng, 0, 3)))
			}
		}
		if rng.IntN(6) == 0 {
			f = append(f, "dscp: "+strconv.Quote(randomRange(rng, 8, 14)))
		}
		if rng.IntN(8) == 0 && proto != "icmp" && !strings.Contains(strings.Join(f, ","), "family: 4") {
			f = append(f, "flow_label: "+strconv.Quote(randomRange(rng, 0, 6)))
		}
		if rng.IntN(5) == 0 {
			f = append(f, fmt.Sprintf("fragment: %q", []string{"is", "!is", "first", "last", "df", "!df,!is", "is,!last", "!first,!is"}[rng.IntN(8)]))
		}
		hasDport := slices.ContainsFunc(f, func(s string) bool { return strings.HasPrefix(s, "dport: ") })
		switch n := rng.IntN(10); {
		case n == 0:
			f = append(f, "action: limit", "rate: 1/s", "burst: 3")
			if rng.IntN(2) == 0 {
				f = append(f, "per: source/24")
			}
		case n == 1 && hasDport && (proto == "tcp" || proto == ""):
			f = append(f, "action: syncookie")
		default:
			f = append(f, "action: "+[]string{"drop", "pass"}[rng.IntN(2)])
		}
		fmt.Fprintf(&b, "  - {%s}\n", strings.Join(f, ", "))
	}
	fmt.Fprintf(&b, "default: %s\n", []string{"drop", "pass"}[rng.IntN(2)])
	if !strings.Contains(b.String(), "  - {") {
		return strings.Replace(b.String(), "rules:\n", "rules: []\n", 1)
	}
	return b.String()
}

// TestDifferentialLarge is TestDifferential's check under policies of up
// to 10,000 rules over many lists and prefixes: the classifier's trees, with
// their groups, splits and cut leaves, against policy.Eval rule by rule.
// RAMPART_DIFF_FRAMES/10 frames per size (default 20,000).
func TestDifferentialLarge(t *testing.T) {
	testutil.Privileged(t)
	frames := 20_000
	if s := os.Getenv("RAMPART_DIFF_FRAMES"); s != "" {
		n, _ := strconv.Atoi(s)
		frames = max(1000, n/10)
	}
	rng := rand.New(rand.NewPCG(7, 24))
	var pool []netip.Prefix
	for len(pool) < 20 {
		pool = append(pool, randomPrefix(rng))
	}
	// Past the lists' own cases: 1,200 lists in groups of 40, named in at
	// most policy.MaxLists ways (they share bits); in groups of three,
	// named in hundreds of ways (most are static, checked by the classes'
	// rows, and sides mix lists with a bit and static ones).
	for _, c := range []struct{ rules, spread, lists, group int }{{50, 72, 40, 1}, {500, 72, 40, 1}, {3000, 3000, 40, 1}, {10_000, 10_000, 40, 1},
		{2000, 2000, 1200, 40}, {2000, 2000, 1200, 3}} {
		name := strconv.Itoa(c.rules)
		if c.group > 1 {
			name += fmt.Sprintf("/%d-lists-by-%d", c.lists, c.group)
		}
		t.Run(name, func(t *testing.T) {
			portSpread, listGroup = c.spread, c.group
			defer func() { portSpread, listGroup = 72, 1 }()
			yaml := randomPolicySized(rng, c.rules, c.lists, pool)
			if c.group > 1 {
				pol, err := policy.Parse("test.yaml", []byte(yaml))
				if err != nil {
					t.Fatal(err)
				}
				use := pol.ListUse()
				if shared := c.group > 3; use.Lists() <= policy.MaxLists || (use.Ways() > policy.MaxLists) == shared || len(use.Static()) > 0 == shared {
					t.Fatalf("%d lists named in %d ways, %d of them static: want more than %d lists, and more ways than that: %v", use.Lists(), use.Ways(), len(use.Static()), policy.MaxLists, !shared)
				}
				t.Logf("%d lists named in %d ways, %d lists static", use.Lists(), use.Ways(), len(use.Static()))
			}
			l := load(t, datapath.KindXDP, yaml)
			defer l.objs.Close()
			_, deepest := diffBatch(t, rng, l, frames, fmt.Sprintf("(%d random rules)", c.rules))
			t.Logf("%d rules: %d frames agreed; the deepest rule a frame matched: %d", c.rules, frames, deepest)
			if c.rules >= 3000 && deepest < c.rules/2 {
				t.Errorf("no frame matched past rule %d of %d: the test does not reach deep rules", deepest, c.rules)
			}
		})
	}
}

// portSpread is the ports random frames and rules use.
var portSpread = 72

// listGroup is how many lists a rule's side names together (the lists
// that take a bit between them past policy.MaxLists), but for the first
// half of a group now and then.
var listGroup = 1

func randomFrame(rng *rand.Rand) []byte {
	if rng.IntN(50) == 0 { // pure noise
		b := make([]byte, 14+rng.IntN(120))
		for i := range b {
			b[i] = byte(rng.UintN(256))
		}
		return b
	}
	v6 := rng.IntN(2) == 0
	f := packet.Frame{
		Src: randomAddr(rng, v6), Dst: randomAddr(rng, v6),
		Proto:    []uint8{6, 17, 1, 58, 47, 6, 17}[rng.IntN(7)],
		Sport:    uint16(rng.IntN(portSpread)),
		Dport:    uint16(rng.IntN(portSpread)),
		TCPFlags: uint8(rng.UintN(256)),
		Payload:  rng.IntN(160),
		ICMPType: uint8(rng.IntN(12)),
		ICMPCode: uint8(rng.IntN(4)),
		TOS:      uint8(8+rng.IntN(8)) << 2,
		DF:       rng.IntN(2) == 0,
	}
	if v6 {
		f.FlowLabel = uint32(rng.IntN(8)) | uint32(rng.IntN(2))<<19 // the 20th bit: the label is read whole
	}
	if rng.IntN(5) == 0 {
		f.VLANs = make([]uint16, 1+rng.IntN(2))
		if rng.IntN(4) == 0 {
			f.VLANs = make([]uint16, 3+rng.IntN(12)) // stacks the kernel strips one by one
		}
	}
	if rng.IntN(8) == 0 {
		f.EtherType = []uint16{0x0806, 0x88cc, 0x8100}[rng.IntN(3)]
	}
	if rng.IntN(6) == 0 {
		f.MoreFrags = rng.IntN(2) == 0
		f.FragOff = uint16(rng.IntN(3))
		f.Fragment = true
	}
	if !v6 && rng.IntN(6) == 0 {
		f.IPOptions = make([]byte, 4*rng.IntN(11))
	}
	if v6 && rng.IntN(4) == 0 {
		n := rng.IntN(10)
		if rng.IntN(4) == 0 {
			n = 10 + rng.IntN(60) // chains no fixed cut may stop
		}
		for i := 0; i < n; i++ {
			typ := []uint8{0, 43, 60, 51, 60}[rng.IntN(5)]
			n := 8 * (1 + rng.IntN(4))
			if typ == 51 {
				n = 4 * (3 + rng.IntN(4))
			}
			f.Ext = append(f.Ext, packet.ExtHdr{Type: typ, Len: n})
		}
	}
	b := f.Bytes()
	l3 := 14 + 4*len(f.VLANs)
	switch rng.IntN(8) {
	case 0: // flip a few bytes anywhere
		for i := 0; i < 1+rng.IntN(4); i++ {
			b[rng.IntN(len(b))] = byte(rng.UintN(256))
		}
	case 1: // truncate
		b = b[:14+rng.IntN(len(b)-13)]
	case 2: // lie about the lengths: IHL, total length, payload length
		if len(b) > l3+6 && f.EtherType == 0 {
			if v6 {
				binary.BigEndian.PutUint16(b[l3+4:], uint16(rng.IntN(len(b))))
			} else if rng.IntN(2) == 0 {
				b[l3] = 0x40 | byte(rng.IntN(16))
			} else {
				binary.BigEndian.PutUint16(b[l3+2:], uint16(rng.IntN(len(b))))
			}
		}
	case 3: // a header of the chain claims another length
		if v6 && len(f.Ext) > 0 && len(b) > l3+42 {
			b[l3+41] = byte(rng.IntN(256))
		}
	}
	return b
}

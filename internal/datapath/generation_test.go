package datapath_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/compile"
	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/packet"
	"github.com/rampart-fw/rampart/internal/policy"
	"github.com/rampart-fw/rampart/internal/testutil"
)

// Two policies that judge the frame from 198.51.100.1 apart: the first
// drops it by its rule 0, the second passes it by its rule 2. Every other
// slot either one counts it in means a frame met parts of both: the second
// policy's rules over the first's lists drop it by rule 1, the first's
// rules over the second's lists pass it by default.
const (
	genA = "lists:\n  a: {prefixes: [198.51.100.1]}\nrules:\n  - {name: a-drop, src: a, action: drop}\n"
	genB = "lists:\n  b: {prefixes: [203.0.113.9]}\nrules:\n" +
		"  - {name: b-other, proto: udp, dport: 1, action: pass}\n" +
		"  - {name: b-drop, src: b, action: drop}\n" +
		"  - {name: b-pass, proto: udp, action: pass}\n"
)

func image(t *testing.T, yaml string) *compile.Image {
	t.Helper()
	pol, err := policy.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return compile.Build(pol)
}

// twoGenerations loads the first policy and makes the second a generation
// of its program; frame comes from the address they judge apart.
func twoGenerations(t *testing.T) (a *loaded, b *datapath.Objects, frame []byte) {
	t.Helper()
	a = load(t, datapath.KindXDP, genA)
	b, fits, err := datapath.LoadOver(a.objs, image(t, genB), nil)
	if err != nil || !fits {
		t.Fatalf("LoadOver: fits %v, %v", fits, err)
	}
	t.Cleanup(func() { b.Close() })
	return a, b, packet.Frame{Src: ip("198.51.100.1"), Dst: ip("192.0.2.1"), Proto: 17, Dport: 9}.Bytes()
}

// TestGenerationsShareAProgram: a policy that fits the loaded program's
// shape becomes a new generation of it, with no program loaded; it judges
// from its activation on, and the first judges again once activated back.
// A policy that needs another shape, or a program of another build, does
// not fit.
func TestGenerationsShareAProgram(t *testing.T) {
	a, b, frame := twoGenerations(t)
	if progID(t, b) != progID(t, a.objs) {
		t.Fatal("the new generation has a program of its own")
	}
	judge := func(want uint8, what string) {
		t.Helper()
		ret, err := a.prog.Run(&ebpf.RunOptions{Data: frame})
		if err != nil {
			t.Fatal(err)
		}
		if got := actionOf(ebpf.XDP, ret); got != want {
			t.Fatalf("%s: action %d, want %d", what, got, want)
		}
	}
	judge(abi.ActionDrop, "before the second generation is activated")
	if err := b.Activate(); err != nil {
		t.Fatal(err)
	}
	judge(abi.ActionPass, "the second generation")
	if live, err := a.objs.IsLive(); err != nil || live {
		t.Fatalf("the first generation is still live (%v)", err)
	}
	if err := a.objs.Activate(); err != nil {
		t.Fatal(err)
	}
	judge(abi.ActionDrop, "the first generation, activated back")

	for _, other := range []string{
		"rules:\n  - {name: r, dport: 80, action: syncookie}\n", // the SYN cookie check
		manyRules(100), // more rules than the shape holds
	} {
		if o, fits, err := datapath.LoadOver(a.objs, image(t, other), nil); fits || err != nil || o != nil {
			t.Errorf("%q fits the shape of a one-rule policy (%v)", other[:30], err)
		}
	}
	// A shape far bigger than a policy needs is not kept for it: tables of
	// 60,000 /24 blocks (2 MB) for a list of one address.
	var big strings.Builder
	big.WriteString("lists:\n  a: {prefixes: [")
	for i := range 60000 {
		fmt.Fprintf(&big, "%d.%d.%d.1, ", 1+i>>16, (i>>8)&255, i&255)
	}
	big.WriteString("198.51.100.1]}\nrules:\n  - {name: a-drop, src: a, action: drop}\n")
	if o, fits, err := datapath.LoadOver(load(t, datapath.KindXDP, big.String()).objs, image(t, genA), nil); fits || err != nil || o != nil {
		t.Errorf("a one-address list fits tables of 60,000 blocks (%v)", err)
	}
	if err := datapath.AsAnotherBuild(a.objs); err != nil {
		t.Fatal(err)
	}
	if o, fits, err := datapath.LoadOver(a.objs, image(t, genB), nil); fits || err != nil || o != nil {
		t.Errorf("a policy fits the program of another build (%v): its code would outlive an upgrade", err)
	}
}

// TestSpareGeneration: maps made from a shape while a policy compiles
// become the new generation's when the policy fits the shape, and judge as
// its own would; when it does not, closing the spare frees every one. No
// spare is made for another build's programs.
func TestSpareGeneration(t *testing.T) {
	a := load(t, datapath.KindXDP, genA)
	spare := datapath.MakeSpare(a.objs)
	made := datapath.SpareIDs(spare)
	b, fits, err := datapath.LoadOver(a.objs, image(t, genB), spare)
	if err != nil || !fits {
		t.Fatalf("LoadOver: fits %v, %v", fits, err)
	}
	defer b.Close()
	spare.Close()
	own := datapath.GenerationIDs(b)
	if len(made) == 0 || len(made) != len(own) {
		t.Fatalf("%d spare maps for a generation of %d", len(made), len(own))
	}
	for name, id := range own {
		if made[name] != id {
			t.Errorf("%s: map %d, not the spare's %d", name, id, made[name])
		}
	}
	if err := b.Activate(); err != nil {
		t.Fatal(err)
	}
	frame := packet.Frame{Src: ip("198.51.100.1"), Dst: ip("192.0.2.1"), Proto: 17, Dport: 9}.Bytes()
	ret, err := a.prog.Run(&ebpf.RunOptions{Data: frame})
	if err != nil {
		t.Fatal(err)
	}
	if got := actionOf(ebpf.XDP, ret); got != abi.ActionPass {
		t.Fatalf("the generation in spare maps: action %d, want pass (%d)", got, abi.ActionPass)
	}

	spare = datapath.MakeSpare(a.objs)
	made = datapath.SpareIDs(spare)
	if o, fits, err := datapath.LoadOver(a.objs, image(t, manyRules(100)), spare); fits || err != nil || o != nil {
		t.Fatalf("100 rules fit a one-rule shape (%v)", err)
	}
	spare.Close()
	for name, id := range made {
		if m, err := ebpf.NewMapFromID(id); err == nil {
			m.Close()
			t.Errorf("spare %s (map %d) outlives Close", name, id)
		}
	}
	// No generation of this build fills another build's programs.
	if err := datapath.AsAnotherBuild(a.objs); err != nil {
		t.Fatal(err)
	}
	if s := datapath.MakeSpare(a.objs); s != nil {
		s.Close()
		t.Error("a spare for the programs of another build")
	}
}

func manyRules(n int) string {
	var b strings.Builder
	b.WriteString("rules:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - {name: r%d, proto: udp, dport: %d, action: drop}\n", i, i+1)
	}
	return b.String()
}

// TestFlipUnderFrames: frames run while the live generation flips between
// the two policies; each frame must be judged by one of them whole, as the
// slot it is counted in and its action say. Activate waits for grace
// periods (tens of ms a flip); the flips here are bare updates of live,
// thousands a second, so that many land while a frame is being judged.
func TestFlipUnderFrames(t *testing.T) {
	a, b, frame := twoGenerations(t)
	flip, err := datapath.BothSlots(a.objs, b)
	if err != nil {
		t.Fatal(err)
	}

	const flips = 200000
	var done atomic.Bool
	flipped := make(chan error, 1)
	go func() {
		defer done.Store(true)
		for i := range flips {
			if err := flip(uint32(i & 1)); err != nil {
				flipped <- err
				return
			}
		}
		flipped <- nil
	}()
	var drops, passes uint64
	for !done.Load() {
		ret, err := a.prog.Run(&ebpf.RunOptions{Data: frame})
		if err != nil {
			t.Fatal(err)
		}
		if actionOf(ebpf.XDP, ret) == abi.ActionDrop {
			drops++
		} else {
			passes++
		}
	}
	if err := <-flipped; err != nil {
		t.Fatal(err)
	}
	counts := func(o *datapath.Objects, rules int) []abi.Counter {
		c, err := o.ReadCounters(abi.SlotRule0 + rules)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ca, cb := counts(a.objs, 3), counts(b, 3) // three rule slots of each: a mix counts past the first's one
	var stray []string
	for i := range ca {
		if i != abi.SlotRule0 && ca[i].Packets != 0 {
			stray = append(stray, fmt.Sprintf("first generation's slot %d: %d", i, ca[i].Packets))
		}
		if i != abi.SlotRule0+2 && cb[i].Packets != 0 {
			stray = append(stray, fmt.Sprintf("second generation's slot %d: %d", i, cb[i].Packets))
		}
	}
	if len(stray) > 0 {
		t.Fatalf("frames judged by parts of both generations: %s", strings.Join(stray, ", "))
	}
	if ca[abi.SlotRule0].Packets != drops || cb[abi.SlotRule0+2].Packets != passes {
		t.Fatalf("%d dropped, %d passed; counted: %d by the first's drop, %d by the second's pass", drops, passes, ca[abi.SlotRule0].Packets, cb[abi.SlotRule0+2].Packets)
	}
	if drops == 0 || passes == 0 {
		t.Fatalf("%d dropped, %d passed: the frames did not meet both generations", drops, passes)
	}
	t.Logf("%d frames over %d flips: %d dropped by the first generation, %d passed by the second", drops+passes, flips, drops, passes)
}

// TestEarlierReleaseGeneration: a generation an earlier release pinned
// (programs with maps of their own: no live map, no outer maps) still opens,
// counts and goes back on (a rollback after an upgrade), and is never given
// a new generation.
func TestEarlierReleaseGeneration(t *testing.T) {
	a := load(t, datapath.KindXDP, genA)
	pin, _ := testutil.Roots(t)
	dir := filepath.Join(pin, "gen-1")
	if err := a.objs.Pin(dir); err != nil {
		t.Fatal(err)
	}
	pins, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pins {
		if n := p.Name(); n == "live" || n == "configs" || strings.HasSuffix(n, "_gens") {
			os.Remove(filepath.Join(dir, n))
		}
	}
	old, err := datapath.LoadPinned(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if live, err := old.IsLive(); err != nil || !live {
		t.Errorf("an earlier release's generation is not live (%v): its programs read no other", err)
	}
	if err := old.Activate(); err != nil {
		t.Error(err)
	}
	if _, err := old.ReadCounters(abi.SlotRule0 + 1); err != nil {
		t.Error(err)
	}
	if o, fits, err := datapath.LoadOver(old, image(t, genB), nil); fits || err != nil || o != nil {
		t.Errorf("a policy fits an earlier release's program (%v)", err)
	}
}

// TestOverlayGrows: a generation's overlay tables are made small and grow
// in place when live changes fill them: the grown table is the one frames
// read and the one pinned, and the same generation's pins under another
// hook follow it before they take a change.
func TestOverlayGrows(t *testing.T) {
	a := load(t, datapath.KindXDP, "lists:\n  ban: {prefixes: [192.0.2.1]}\nrules:\n  - {name: ban, src: ban, action: drop}\n")
	pin, _ := testutil.Roots(t)
	dirs := []string{filepath.Join(pin, "one"), filepath.Join(pin, "two")}
	for _, d := range dirs {
		if err := a.objs.Pin(d); err != nil {
			t.Fatal(err)
		}
	}
	small := a.objs.OverlayV4.MaxEntries()
	judge := func(src netip.Addr, want uint8) {
		t.Helper()
		ret, err := a.prog.Run(&ebpf.RunOptions{Data: packet.Frame{Src: src, Dst: ip("192.0.2.9"), Proto: 17, Dport: 9}.Bytes()})
		if err != nil {
			t.Fatal(err)
		}
		if got := actionOf(ebpf.XDP, ret); got != want {
			t.Fatalf("a frame from %s: action %d, want %d", src, got, want)
		}
	}
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}) }
	// write adds bans from..from+n through the pins in dir, or with
	// replace makes them the whole overlay.
	write := func(dir string, from, n int, replace bool) {
		t.Helper()
		var ops []policy.ListOp
		for i := from; i < from+n; i++ {
			ops = append(ops, policy.ListOp{List: "ban", Prefix: netip.PrefixFrom(addr(i), 32), Add: true})
		}
		v4, v6 := compile.Overlay(map[string]uint64{"ban": 1}, ops)
		o, err := datapath.LoadPinned(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer o.Close()
		if replace {
			err = o.ReplaceOverlay(v4, v6)
		} else {
			err = o.AddOverlay(v4, v6)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	ban := func(dir string, from, n int) { write(dir, from, n, false) }
	pinnedID := func(dir string) ebpf.MapID {
		t.Helper()
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, "overlay_v4"), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		info, err := m.Info()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		return id
	}
	gens, err := ebpf.LoadPinnedMap(filepath.Join(dirs[0], "overlay_v4_gens"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer gens.Close()
	slotID := func() ebpf.MapID {
		t.Helper()
		for s := range uint32(2) {
			var id ebpf.MapID
			if gens.Lookup(s, &id) == nil {
				return id
			}
		}
		t.Fatal("no generation holds an overlay")
		return 0
	}

	// What the table held before it grew is in the grown one.
	n := int(small) + 1000
	ban(dirs[0], 0, int(small)-1)
	ban(dirs[0], int(small)-1, n-int(small)+1)
	if id := slotID(); id != pinnedID(dirs[0]) {
		t.Fatalf("after growing, frames read overlay %d, the pin is %d", id, pinnedID(dirs[0]))
	}
	if id := slotID(); id == pinnedID(dirs[1]) {
		t.Fatal("the other pins already follow: the test shows nothing")
	}
	for _, i := range []int{0, n / 2, n - 1} {
		judge(addr(i), abi.ActionDrop)
	}
	judge(ip("10.200.0.1"), abi.ActionPass)
	ban(dirs[1], 1<<16, 1)
	if id := slotID(); id != pinnedID(dirs[1]) {
		t.Fatalf("the other hook's pins write overlay %d, frames read %d", pinnedID(dirs[1]), id)
	}
	for _, i := range []int{0, n - 1, 1 << 16} {
		judge(addr(i), abi.ActionDrop)
	}
	o, err := datapath.LoadPinned(dirs[1])
	if err != nil {
		t.Fatal(err)
	}
	grown := o.OverlayV4.MaxEntries()
	o.Close()
	if grown <= small {
		t.Fatalf("the overlay holds %d entries in a table of %d", n+1, grown)
	}
	// A rewrite past the grown table grows it again, and the entries it no
	// longer has go from the table frames read.
	more := 3 * int(grown)
	write(dirs[0], n/2, more, true)
	if id := slotID(); id != pinnedID(dirs[0]) {
		t.Fatalf("after growing again, frames read overlay %d, the pin is %d", id, pinnedID(dirs[0]))
	}
	for _, c := range []struct {
		i    int
		want uint8
	}{{0, abi.ActionPass}, {n/2 - 1, abi.ActionPass}, {n / 2, abi.ActionDrop}, {n/2 + more - 1, abi.ActionDrop}, {n/2 + more, abi.ActionPass}} {
		judge(addr(c.i), c.want)
	}
	t.Logf("overlay grown from %d to %d entries' table for %d, then for %d replacing them", small, grown, n+1, more)
}

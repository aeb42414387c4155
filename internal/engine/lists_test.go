package engine

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/compile"
	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/policy"
	"github.com/rampart-fw/rampart/internal/testutil"
)

// TestLiveListChanges: list changes reach the kernel in place, the
// generation unchanged: an added source is dropped, a removed one passes, a
// revert gives the file its word back, and a restored change expires on
// its own time. Real datagrams from A to B judge each step.
func TestLiveListChanges(t *testing.T) {
	p, fw := firewallOnPair(t)
	a, _ := netip.AddrFromSlice(p.A4.To4())
	host := netip.PrefixFrom(a, 32)
	other := netip.MustParsePrefix("192.0.2.0/24")
	pol := parse(t, t.TempDir(), "p.yaml", "lists:\n  block: {prefixes: ["+other.String()+"]}\nrules:\n  - {name: d, src: block, action: drop}\n")
	mustApply(t, fw, pol, p.IfB)
	gen := hookStatus(t, fw)[0].Generation
	step := fromA(t, p)
	step("A not listed", 50)

	if _, err := fw.ChangeList(ListChange{List: "block", Prefixes: []netip.Prefix{host}, Add: true}); err != nil {
		t.Fatal(err)
	}
	step("A added", 0)
	if ops, err := fw.Changes(); err != nil || len(ops) != 1 || ops[0].Prefix != host || !ops[0].Add {
		t.Errorf("changes %+v, %v: want A's addition", ops, err)
	}
	if _, err := fw.ChangeList(ListChange{List: "block", Prefixes: []netip.Prefix{host}}); err != nil {
		t.Fatal(err)
	}
	step("A removed after its addition", 50)
	if removed, err := fw.RevertList("block", nil); err != nil || len(removed) != 2 {
		t.Fatalf("revert: %+v, %v: want both changes", removed, err)
	}
	step("reverted to the file", 50)

	// A restored addition that expires in a second drops until then.
	restored := []policy.ListOp{{List: "block", Prefix: host, Add: true, Expires: time.Now().Add(time.Second)}}
	if n, err := fw.RestoreChanges(restored); err != nil || n != 1 {
		t.Fatalf("restore: %d, %v", n, err)
	}
	step("restored addition", 0)
	time.Sleep(1100 * time.Millisecond)
	if left, err := fw.ExpireLists(); err != nil || left {
		t.Fatalf("expire: changes with a TTL left %v, %v", left, err)
	}
	step("expired", 50)

	if _, err := fw.ChangeList(ListChange{List: "nope", Prefixes: []netip.Prefix{host}, Add: true}); err == nil || !strings.Contains(err.Error(), "lists in use: block") {
		t.Errorf("a list no policy uses: %v", err)
	}
	if g := hookStatus(t, fw)[0].Generation; g != gen {
		t.Errorf("generation %d after live changes, was %d: a change reloaded the program", g, gen)
	}

	// A rule's inline prefix is no list, even beside one, where it takes
	// a bit: rules checking it by its bits would not see the change.
	pol = parse(t, t.TempDir(), "p.yaml", "lists:\n  block: {prefixes: ["+other.String()+"]}\nrules:\n"+
		"  - {name: d, src: [block, 198.51.100.0/24], action: drop}\n  - {name: e, src: 198.51.100.0/24, proto: udp, action: drop}\n")
	mustApply(t, fw, pol, p.IfB)
	if _, err := fw.ChangeList(ListChange{List: "198.51.100.0/24", Prefixes: []netip.Prefix{host}, Add: true}); err == nil || !strings.Contains(err.Error(), "inline prefix") {
		t.Errorf("a change to an inline prefix: %v", err)
	}
	step("an inline prefix unchanged", 50)
}

// fromA is a check of one step of a test: after what, want of 50
// datagrams from A reach B.
func fromA(t *testing.T, p *testutil.Pair) func(what string, want int) {
	return func(what string, want int) {
		t.Helper()
		if got := delivered(t, p, 9300, 50); got != want {
			t.Errorf("%s: %d of 50 datagrams from A arrived, want %d", what, got, want)
		}
	}
}

// TestOverlayDelta: a change writes only the overlay entries it changes,
// and after every change the kernel holds exactly the overlay a rebuild
// from all the changes would: nested prefixes of two lists, both
// families, additions and removals in random order.
func TestOverlayDelta(t *testing.T) {
	p, fw := firewallOnPair(t)
	pol := parse(t, t.TempDir(), "p.yaml", "lists:\n  a: {prefixes: [192.0.2.0/24]}\n  b: {prefixes: ['2001:db8:ff::/48']}\nrules:\n  - {name: a, src: a, action: drop}\n  - {name: b, dst: b, action: drop}\n")
	mustApply(t, fw, pol, p.IfB)
	h := Hook{Iface: p.IfB}
	g := liveGen(t, fw, h)
	bits := map[string]uint64{}
	for name, info := range g.Lists {
		bits[name] = info.Bit
	}
	prefixes := []string{"10.0.0.0/8", "10.1.0.0/16", "10.1.2.0/24", "10.1.2.3/32", "10.1.3.0/24", "0.0.0.0/0",
		"2001:db8::/32", "2001:db8:1::/48", "2001:db8:1::/64", "2001:db8:1::5/128", "2001:db8:2::/48"}
	rng := rand.New(rand.NewPCG(7, 11))
	for i := range 80 {
		c := ListChange{List: []string{"a", "b"}[rng.IntN(2)], Add: rng.IntN(3) != 0}
		for range 1 + rng.IntN(2) {
			c.Prefixes = append(c.Prefixes, netip.MustParsePrefix(prefixes[rng.IntN(len(prefixes))]))
		}
		if _, err := fw.ChangeList(c); err != nil {
			t.Fatal(err)
		}
		ops, err := fw.Changes()
		if err != nil {
			t.Fatal(err)
		}
		w4, w6 := compile.Overlay(bits, ops)
		objs, err := datapath.LoadPinned(fw.genPins(h, g.N))
		if err != nil {
			t.Fatal(err)
		}
		g4, g6 := heldOverlay[abi.LPMKeyV4](t, objs.OverlayV4), heldOverlay[abi.LPMKeyV6](t, objs.OverlayV6)
		objs.Close()
		if !sameOverlay(w4, g4) || !sameOverlay(w6, g6) {
			t.Fatalf("after change %d (%+v): the kernel holds %v %v, a rebuild gives %v %v", i, c, g4, g6, w4, w6)
		}
		if i == 40 {
			// A change whose TTL runs out before the next change, which the
			// expirer has not undone yet: the next change undoes it too.
			expiring := policy.ListOp{List: "a", Prefix: netip.MustParsePrefix("10.9.9.0/24"), Add: true, Expires: time.Now().Add(50 * time.Millisecond)}
			if n, err := fw.RestoreChanges([]policy.ListOp{expiring}); err != nil || n != 1 {
				t.Fatalf("restore: %d, %v", n, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func heldOverlay[K abi.LPMKeyV4 | abi.LPMKeyV6](t *testing.T, m *ebpf.Map) map[K]abi.Overlay {
	held := map[K]abi.Overlay{}
	var k K
	var v abi.Overlay
	it := m.Iterate()
	for it.Next(&k, &v) {
		held[k] = v
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return held
}

func sameOverlay[K abi.LPMKeyV4 | abi.LPMKeyV6](want []compile.OverlayEntry[K], got map[K]abi.Overlay) bool {
	if len(want) != len(got) {
		return false
	}
	for _, e := range want {
		if v, ok := got[e.Key]; !ok || v != e.Overlay {
			return false
		}
	}
	return true
}

// TestLegacyOpsFile: the changes an earlier release kept as JSON are read,
// and the next change keeps them, in the gob file that replaces it.
func TestLegacyOpsFile(t *testing.T) {
	p, fw := firewallOnPair(t)
	mustApply(t, fw, parse(t, t.TempDir(), "p.yaml", "lists:\n  block: {prefixes: [192.0.2.0/24]}\nrules:\n  - {name: d, src: block, action: drop}\n"), p.IfB)
	old := policy.ListOp{List: "block", Prefix: netip.MustParsePrefix("198.51.100.0/24"), Add: true}
	if err := writeJSON(fw.legacyOpsPath(), []policy.ListOp{old}); err != nil {
		t.Fatal(err)
	}
	old.Seq = 1 // numbered as read, in the file's order
	if ops, err := fw.Changes(); err != nil || len(ops) != 1 || ops[0] != old {
		t.Fatalf("changes from the JSON file: %+v, %v", ops, err)
	}
	added := netip.MustParsePrefix("203.0.113.7/32")
	if _, err := fw.ChangeList(ListChange{List: "block", Prefixes: []netip.Prefix{added}, Add: true}); err != nil {
		t.Fatal(err)
	}
	ops, err := fw.Changes()
	if err != nil || len(ops) != 2 || ops[0] != old || ops[1].Prefix != added {
		t.Fatalf("changes after one more: %+v, %v", ops, err)
	}
	if _, err := os.Stat(fw.legacyOpsPath()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the JSON file is still there: %v", err)
	}
}

// TestSharedListBits: past policy.MaxLists lists, lists that the same
// rules name share a bit. A policy of a hundred lists in one rule applies,
// takes in-place additions to any of them, and refuses removals, which
// would take the address out of the others too: in place, while an
// unconfirmed apply could go back to such a policy, restored from what
// the daemon kept, and carried over from the live changes into an apply
// that would share the list's bit, which then changes nothing.
func TestSharedListBits(t *testing.T) {
	p, fw := firewallOnPair(t)
	a, _ := netip.AddrFromSlice(p.A4.To4())
	host := netip.PrefixFrom(a, 32)
	var lists, names []string
	for i := range 100 {
		lists = append(lists, fmt.Sprintf("  c%d: {prefixes: [198.51.100.%d/32]}\n", i, i))
		names = append(names, fmt.Sprintf("c%d", i))
	}
	shared := "lists:\n" + strings.Join(lists, "") + "rules:\n  - {name: d, src: [" + strings.Join(names, ", ") + "], action: drop}\n"
	mustApply(t, fw, parse(t, t.TempDir(), "p.yaml", shared), p.IfB)
	step := fromA(t, p)
	step("A not listed", 50)
	if _, err := fw.ChangeList(ListChange{List: "c57", Prefixes: []netip.Prefix{host}, Add: true}); err != nil {
		t.Fatal(err)
	}
	step("A added to c57", 0)
	_, err := fw.ChangeList(ListChange{List: "c57", Prefixes: []netip.Prefix{host}})
	if err == nil || !strings.Contains(err.Error(), `list "c57" shares its bit`) || !strings.Contains(err.Error(), "c0, c1, c10") {
		t.Errorf("a removal from a shared list: %v", err)
	}
	step("A's removal refused", 0)
	if removed, err := fw.RevertList("c57", nil); err != nil || len(removed) != 1 {
		t.Fatalf("revert: %+v, %v: want the addition", removed, err)
	}
	step("reverted", 50)

	// Saved changes restored: the addition, not the removal.
	saved := []policy.ListOp{{List: "c57", Prefix: host, Add: true}, {List: "c9", Prefix: netip.MustParsePrefix("198.51.100.9/32")}}
	if n, err := fw.RestoreChanges(saved); n != 1 || err == nil || !strings.Contains(err.Error(), "1 changes not restored") {
		t.Errorf("restore: %d, %v: want the addition restored, the removal refused", n, err)
	}
	step("a restored addition", 0)
	if _, err := fw.RevertList("", nil); err != nil {
		t.Fatal(err)
	}

	// c57 alone: a removal is refused while the apply that made it so is
	// unconfirmed (a rollback would make the shared bit's overlay from
	// it), and is a change like any other once confirmed; then the policy
	// that would share its bit is refused while the removal is live.
	alone := parse(t, t.TempDir(), "p.yaml", "lists:\n"+lists[57]+"rules:\n  - {name: d, src: c57, action: drop}\n")
	if _, err := fw.Apply(ApplyRequest{Policy: alone, Ifaces: []string{p.IfB}, Confirm: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := fw.ChangeList(ListChange{List: "c57", Prefixes: []netip.Prefix{host}}); err == nil || !strings.Contains(err.Error(), "shares its bit") {
		t.Errorf("a removal while a rollback would share the bit: %v", err)
	}
	if _, err := fw.Confirm(); err != nil {
		t.Fatal(err)
	}
	if _, err := fw.ChangeList(ListChange{List: "c57", Prefixes: []netip.Prefix{host}}); err != nil {
		t.Fatal(err)
	}
	gen := hookStatus(t, fw)[0].Generation
	_, err = fw.Apply(ApplyRequest{Policy: parse(t, t.TempDir(), "p.yaml", shared), Ifaces: []string{p.IfB}})
	if err == nil || !strings.Contains(err.Error(), `list "c57" shares its bit`) {
		t.Errorf("an apply sharing the bit of a list with a live removal: %v", err)
	}
	if g := hookStatus(t, fw)[0].Generation; g != gen {
		t.Errorf("generation %d after the refused apply, was %d", g, gen)
	}
}

// TestStaticLists: past policy.MaxLists ways of naming lists, the lists of
// the later ways take no bit; real datagrams through a veth pair show the
// class's row deciding, alone and beside an in-place change to a list
// with a bit; that no in-place change to a static list is taken, live or
// restored; and that a list holding live changes takes a bit first.
func TestStaticLists(t *testing.T) {
	p, fw := firewallOnPair(t)
	a, _ := netip.AddrFromSlice(p.A4.To4())
	host := netip.PrefixFrom(a, 32)
	policyOf := func(staticHoldsA, staticFirst bool) *policy.Policy {
		var lists, rules []string
		for i := range policy.MaxLists + 7 {
			hosts := fmt.Sprintf("198.51.100.%d/32", i)
			if i == policy.MaxLists+6 && staticHoldsA {
				hosts += ", " + host.String()
			}
			lists = append(lists, fmt.Sprintf("  c%d: {prefixes: [%s]}\n", i, hosts))
			// c3's rule takes no datagram of A's (port 9300): an
			// address the overlay adds to c3 keeps its other lists.
			port := ""
			if i == 3 {
				port = ", dport: 7"
			}
			rules = append(rules, fmt.Sprintf("  - {name: d%d, src: c%d%s, action: drop}\n", i, i, port))
		}
		if staticFirst {
			last := len(rules) - 1
			rules = append(rules[last:], rules[:last]...)
		}
		pol := parse(t, t.TempDir(), "p.yaml", "lists:\n"+strings.Join(lists, "")+"rules:\n"+strings.Join(rules, ""))
		if st := pol.ListUse().Static(); staticFirst == (st["c69"] != 0) || len(st) != 7 {
			t.Fatalf("the static lists: %v; want 7, c69 among them: %v", st, !staticFirst)
		}
		return pol
	}
	mustApply(t, fw, policyOf(true, false), p.IfB)
	step := fromA(t, p)
	step("A in the static list c69", 0)
	if _, err := fw.ChangeList(ListChange{List: "c3", Prefixes: []netip.Prefix{host}, Add: true}); err != nil {
		t.Fatal(err)
	}
	step("A in c69 and added to c3", 0)
	_, err := fw.ChangeList(ListChange{List: "c69", Prefixes: []netip.Prefix{host}})
	if err == nil || !strings.Contains(err.Error(), `list "c69" takes no in-place changes`) {
		t.Errorf("a removal from a static list: %v", err)
	}
	step("A's removal from c69 refused", 0)
	if _, err := fw.RevertList("", nil); err != nil {
		t.Fatal(err)
	}

	mustApply(t, fw, policyOf(false, false), p.IfB)
	step("A in no list", 50)
	if _, err := fw.ChangeList(ListChange{List: "c69", Prefixes: []netip.Prefix{host}, Add: true}); err == nil || !strings.Contains(err.Error(), "takes no in-place changes") {
		t.Errorf("an addition to a static list: %v", err)
	}
	step("A's addition to c69 refused", 50)
	saved := []policy.ListOp{{List: "c69", Prefix: host, Add: true}, {List: "c5", Prefix: host, Add: true}}
	if n, err := fw.RestoreChanges(saved); n != 1 || err == nil || !strings.Contains(err.Error(), "1 changes not restored, the first "+host.String()+" from c69") {
		t.Errorf("restore: %d, %v: want c5's restored, c69's refused", n, err)
	}
	step("A restored into c5", 0)
	if _, err := fw.RevertList("", nil); err != nil {
		t.Fatal(err)
	}

	// c69 named first takes a bit and a live change; named last again, it
	// keeps a bit, as a list holding live changes takes one first.
	mustApply(t, fw, policyOf(false, true), p.IfB)
	if _, err := fw.ChangeList(ListChange{List: "c69", Prefixes: []netip.Prefix{host}, Add: true}); err != nil {
		t.Fatal(err)
	}
	step("A added to c69, a list with a bit", 0)
	mustApply(t, fw, policyOf(false, false), p.IfB)
	step("c69 named last, with its live change", 0)
	// Past 63 lists taking live changes, those holding some come first:
	// with 63 of them, a list Live names stays static.
	for i := range policy.MaxLists - 1 {
		other := netip.MustParsePrefix(fmt.Sprintf("203.0.113.%d/32", i))
		if _, err := fw.ChangeList(ListChange{List: fmt.Sprintf("c%d", i), Prefixes: []netip.Prefix{other}, Add: true}); err != nil {
			t.Fatal(err)
		}
	}
	pol := policyOf(false, false)
	asked := fmt.Sprintf("c%d", policy.MaxLists-1)
	pol.Live = map[string]bool{asked: true}
	mustApply(t, fw, pol, p.IfB)
	g := liveGen(t, fw, Hook{Iface: p.IfB})
	if g.Lists["c69"].Bit == 0 || g.Lists[asked].Bit != 0 {
		t.Errorf("c69 holding a change has bit %#x, %s only asked %#x: want one, and none", g.Lists["c69"].Bit, asked, g.Lists[asked].Bit)
	}
	step("A still dropped", 0)
}

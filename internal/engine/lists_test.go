package engine

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rampart-fw/rampart/internal/policy"
	"github.com/rampart-fw/rampart/internal/testutil"
)

// TestLiveListChanges: list changes reach the kernel in place, the
// generation unchanged: an added source is dropped, a removed one passes, a
// revert gives the file its word back, and a restored change expires on
// its own time. Real datagrams from A to B judge each step.
func TestLiveListChanges(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	fw := newFirewall(t, p)
	a, _ := netip.AddrFromSlice(p.A4.To4())
	host := netip.PrefixFrom(a, 32)
	other := netip.MustParsePrefix("192.0.2.0/24")
	pol := parse(t, t.TempDir(), "p.yaml", "lists:\n  block: {prefixes: ["+other.String()+"]}\nrules:\n  - {name: d, src: block, action: drop}\n")
	mustApply(t, fw, pol, p.IfB)
	gen := hookStatus(t, fw)[0].Generation
	step := func(what string, want int) {
		t.Helper()
		if got := delivered(t, p, 9300, 50); got != want {
			t.Errorf("%s: %d of 50 datagrams from A arrived, want %d", what, got, want)
		}
	}
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
}

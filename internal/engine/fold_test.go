package engine

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/compile"
	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/policy"
)

// TestFoldedChanges: live changes folded into the tables by an apply judge
// as they did in the overlay. Random changes to two lists (nested
// prefixes of both families, additions and removals, some with a TTL,
// some expiring), reverts, and applies that fold, in random order; after
// each step the program the kernel runs judges every probe (each change's
// edges, the files' and random addresses) as the lists with the live
// changes do. A fold leaves in the overlay only what it must, and a
// folded change reverted owes a rebuild (FoldOwed) until the next fold.
func TestFoldedChanges(t *testing.T) {
	p, fw := firewallOnPair(t)
	h := Hook{Iface: p.IfB}
	dir := t.TempDir()
	text := "lists:\n  a: {prefixes: [10.1.0.0/16, 10.2.3.0/24, '2001:db8:1::/48']}\n  b: {prefixes: [10.1.2.0/24, '2001:db8:1:2::/64']}\n" +
		"rules:\n  - {name: b, src: b, action: pass}\n  - {name: a, src: a, action: drop}\ndefault: pass\n"
	all := func(string) bool { return true }
	apply := func(fold func(string) bool) {
		t.Helper()
		if _, err := fw.Apply(ApplyRequest{Policy: parse(t, dir, "p.yaml", text), Ifaces: []string{p.IfB}, Mode: datapath.ModeXDPNative, Fold: fold}); err != nil {
			t.Fatal(err)
		}
	}
	apply(all)

	prefixes := []string{"10.0.0.0/8", "10.1.0.0/16", "10.1.2.0/24", "10.1.2.3/32", "10.1.2.128/25", "10.2.3.4/32", "10.3.0.0/16",
		"2001:db8::/32", "2001:db8:1::/48", "2001:db8:1:2::/64", "2001:db8:1:2::5/128", "2001:db8:2::/48"}
	rng := rand.New(rand.NewPCG(5, 8))
	probes := probesOf(prefixes, rng)

	check := func(step string) {
		t.Helper()
		judgeLists(t, fw, h, probes, step, parse(t, dir, "p.yaml", text))
	}
	overlaySize := func() int {
		t.Helper()
		g := liveGen(t, fw, h)
		objs, err := datapath.LoadPinned(fw.genPins(h, g.N))
		if err != nil {
			t.Fatal(err)
		}
		defer objs.Close()
		return len(heldOverlay[abi.LPMKeyV4](t, objs.OverlayV4)) + len(heldOverlay[abi.LPMKeyV6](t, objs.OverlayV6))
	}

	folds, owed := 0, 0
	for i := range 120 {
		step := ""
		switch k := rng.IntN(20); {
		case k < 14:
			c := ListChange{List: []string{"a", "b"}[rng.IntN(2)], Add: rng.IntN(3) != 0}
			for range 1 + rng.IntN(2) {
				c.Prefixes = append(c.Prefixes, netip.MustParsePrefix(prefixes[rng.IntN(len(prefixes))]))
			}
			if rng.IntN(4) == 0 {
				// With a TTL, as a restored change: ChangeList would start
				// the expiry process, which is this test binary here.
				var ops []policy.ListOp
				for _, p := range c.Prefixes {
					ops = append(ops, policy.ListOp{List: c.List, Prefix: p, Add: c.Add, Expires: time.Now().Add(time.Hour)})
				}
				if _, err := fw.RestoreChanges(ops); err != nil {
					t.Fatal(err)
				}
			} else if _, err := fw.ChangeList(c); err != nil {
				t.Fatal(err)
			}
			step = "change"
		case k < 15:
			// A change whose TTL runs out, folded or not: its expiry
			// undoes it in the overlay, where it stays.
			expires := time.Now().Add(400 * time.Millisecond)
			op := policy.ListOp{List: "a", Prefix: netip.MustParsePrefix(prefixes[rng.IntN(len(prefixes))]), Add: true, Expires: expires}
			if _, err := fw.RestoreChanges([]policy.ListOp{op}); err != nil {
				t.Fatal(err)
			}
			if rng.IntN(2) == 0 {
				apply(all) // which must leave it in the overlay, to expire
			}
			check("a change about to expire")
			time.Sleep(time.Until(expires) + 10*time.Millisecond)
			if _, err := fw.ExpireLists(); err != nil {
				t.Fatal(err)
			}
			step = "expiry"
		case k < 17:
			g := liveGen(t, fw, h)
			ops, _ := fw.Changes()
			foldedBefore := slices.ContainsFunc(ops, g.folded)
			var which []netip.Prefix
			if len(ops) > 0 && rng.IntN(2) == 0 {
				which = []netip.Prefix{ops[rng.IntN(len(ops))].Prefix}
			}
			removed, err := fw.RevertList([]string{"a", "b"}[rng.IntN(2)], which)
			if err != nil {
				t.Fatal(err)
			}
			gone := slices.ContainsFunc(removed, g.folded)
			if o, err := fw.FoldOwed(); err != nil || o != gone {
				t.Fatalf("change %d: a revert of %d changes (folded among them: %v, before: %v): FoldOwed %v, %v", i, len(removed), gone, foldedBefore, o, err)
			}
			if gone {
				owed++
				apply(all) // as the daemon does: the owed rebuild
				if o, _ := fw.FoldOwed(); o {
					t.Fatalf("change %d: a fold still owed after the rebuild", i)
				}
			}
			step = "revert"
		default:
			apply(all)
			folds++
			g := liveGen(t, fw, h)
			ops, _ := fw.Changes()
			bits := map[string]uint64{"a": g.Lists["a"].Bit, "b": g.Lists["b"].Bit}
			w4, w6 := compile.Overlay(bits, g.overlayOps(ops))
			if n := overlaySize(); n != len(w4)+len(w6) {
				t.Fatalf("change %d: the overlay holds %d entries after a fold, want %d", i, n, len(w4)+len(w6))
			}
			if !slices.ContainsFunc(ops, func(op policy.ListOp) bool { return !op.Expires.IsZero() }) && overlaySize() != 0 {
				t.Fatalf("change %d: no change has a TTL, yet a fold left %d overlay entries", i, overlaySize())
			}
			step = "fold"
		}
		check(step)
	}
	// An apply without Fold puts every change back in the overlay.
	apply(nil)
	check("unfolded")
	ops, _ := fw.Changes()
	if g := liveGen(t, fw, h); g.FoldedSeq != 0 || len(g.Folded) != 0 || len(ops) > 0 && overlaySize() == 0 {
		t.Fatalf("an apply without Fold: folded %d %v, overlay %d entries for %d changes", g.FoldedSeq, g.Folded, overlaySize(), len(ops))
	}
	t.Logf("%d folds, %d rebuilds owed by reverts, %d changes at the end", folds, owed, len(ops))
	if folds < 5 || owed < 2 {
		t.Errorf("too few folds (%d) or owed rebuilds (%d) to mean anything", folds, owed)
	}
}

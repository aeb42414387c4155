package policy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/rampart-fw/rampart/internal/abi"
)

// TestListBits: up to MaxLists lists take a bit each, in the order rules
// name them; past that, lists that exactly the same sides name share one,
// a list named twice on a side still counts, and Add's undo puts back
// what was.
func TestListBits(t *testing.T) {
	pol := func(rules ...string) *Policy {
		var b strings.Builder
		b.WriteString("lists:\n")
		for i := range 1000 {
			fmt.Fprintf(&b, "  c%d: {prefixes: [10.%d.%d.0/24]}\n", i, i/256, i%256)
		}
		b.WriteString("rules:\n")
		for i, r := range rules {
			fmt.Fprintf(&b, "  - {name: r%d, %s, action: drop}\n", i, r)
		}
		p, err := Parse("p.yaml", []byte(b.String()))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	names := func(lo, hi int) string {
		var ns []string
		for i := lo; i < hi; i++ {
			ns = append(ns, fmt.Sprintf("c%d", i))
		}
		return "[" + strings.Join(ns, ", ") + "]"
	}

	u := pol("src: [c2, c1]", "dst: [c1, c3]").ListUse()
	bits := u.Bits()
	if u.Ways() != 3 || bits["c2"] != 1 || bits["c1"] != 2 || bits["c3"] != 4 {
		t.Errorf("three lists: %v, %d bits; want a bit each in the order named", bits, u.Ways())
	}

	// A thousand lists: c0-c499 on one side (c7 twice), c500-c999 on two,
	// c999 on one more: three bits.
	p := pol("src: "+strings.Replace(names(0, 500), "c7,", "c7, c7,", 1), "dst: "+names(500, 1000), "src: "+names(500, 1000)+", proto: udp", "dst: c999, proto: tcp")
	u = p.ListUse()
	bits = u.Bits()
	if u.Ways() != 3 || u.Lists() != 1000 {
		t.Fatalf("%d lists in %d ways; want 1,000 in 3", u.Lists(), u.Ways())
	}
	for i := range 1000 {
		want := uint64(1)
		if i >= 500 {
			want = 2
		}
		if i == 999 {
			want = 4
		}
		if got := bits[fmt.Sprintf("c%d", i)]; got != want {
			t.Errorf("c%d: bit %#x, want %#x", i, got, want)
		}
	}

	// Sixty-four ways: the last takes no bit but a static way; the undo
	// of the rule that made it gives back the sixty-three.
	var rules []string
	for i := range MaxLists {
		rules = append(rules, "src: "+names(10*i, 10*i+10))
	}
	p = pol(rules...)
	u = p.ListUse()
	last := Rule{Src: []string{"c999"}}
	undo := u.Add(&last, p.Lists)
	if bits, static := u.Bits(), u.Static(); u.Ways() != MaxLists+1 || bits["c999"] != 0 || len(static) != 1 || static["c999"] != 1 || bits["c0"] != 1 {
		t.Errorf("%d ways: Ways says %d, c999's bit %#x, the static lists %v", MaxLists+1, u.Ways(), bits["c999"], static)
	}
	// A list a feed changes in place takes a bit first: c999's way does,
	// and the last way of the others (c620-c629) is static.
	u.live = func(list string) int { return b2i(list == "c999") * liveAsked }
	if bits, static := u.Bits(), u.Static(); bits["c999"] != 1 || bits["c0"] != 2 || len(static) != 10 || static["c629"] != 1 {
		t.Errorf("c999 fed live: its bit %#x, c0's %#x, the static lists %v", bits["c999"], bits["c0"], static)
	}
	// Ranked: a list holding changes before one only asked to take them.
	u.live = func(list string) int {
		switch list {
		case "c999":
			return liveAsked
		case "c629":
			return liveHeld
		}
		return 0
	}
	if bits, static := u.Bits(), u.Static(); bits["c629"] != 1 || bits["c999"] != 2 || bits["c0"] != 4 || len(static) != 10 || static["c619"] != 1 {
		t.Errorf("c629 holding changes, c999 asked: their bits %#x and %#x, c0's %#x, the static lists %v", bits["c629"], bits["c999"], bits["c0"], static)
	}
	u.live = nil
	undo()
	again := Rule{Src: []string{"c0"}} // splits c0 from c1-c9
	undo = u.Add(&again, p.Lists)
	if u.Ways() != MaxLists+1 {
		t.Errorf("c0 named once more: %d ways, want %d", u.Ways(), MaxLists+1)
	}
	undo()
	if bits := u.Bits(); u.Ways() != MaxLists || u.Lists() != 10*MaxLists || bits["c999"] != 0 || bits["c0"] != 1 || bits["c629"] != 1<<62 || u.Static() != nil {
		t.Errorf("after the undo: %d lists in %d ways", u.Lists(), u.Ways())
	}
}

// TestListUseFits: past MaxLists ways, the distinct sets of lists sides
// name are bounded by the rows' bits (abi.MaxRowBits).
func TestListUseFits(t *testing.T) {
	u := NewListUse()
	lists := map[string]*List{}
	for i := range 400 {
		lists[fmt.Sprintf("c%d", i)] = &List{}
	}
	n := 0
	for i := 0; i < 400 && n <= abi.MaxRowBits; i++ {
		for j := i + 1; j < 400 && n <= abi.MaxRowBits; j++ {
			u.Add(&Rule{Src: []string{fmt.Sprintf("c%d", i), fmt.Sprintf("c%d", j)}}, lists)
			if n++; n == abi.MaxRowBits {
				if err := u.Fits(); err != nil {
					t.Fatalf("%d sides in %d ways: %v", n, u.Ways(), err)
				}
			}
		}
	}
	if err := u.Fits(); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("rules name %d distinct sets of lists", abi.MaxRowBits+1)) {
		t.Errorf("%d sides in %d ways: %v", n, u.Ways(), err)
	}
}

// BenchmarkListUse counts the sides of 10,001 rules: one naming 10,000
// lists, the others two each.
func BenchmarkListUse(b *testing.B) {
	p := &Policy{Lists: map[string]*List{}}
	var all []string
	for i := range 10_000 {
		all = append(all, fmt.Sprintf("c%d", i))
	}
	p.Rules = []Rule{{Src: all}}
	for i := range all {
		p.Rules = append(p.Rules, Rule{Src: []string{all[i], all[(i+1)%len(all)]}})
	}
	for b.Loop() {
		if u := p.ListUse(); u.Lists() != len(all) {
			b.Fatalf("%d lists", u.Lists())
		}
	}
}

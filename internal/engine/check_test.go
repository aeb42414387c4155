package engine

import (
	"fmt"
	"strings"
	"testing"
)

// TestCheckReportsListBits: check says how many bits of the membership
// mask the lists take, whether lists share them (not for a few lists, nor
// for lists no rule names, which take none), and how many take none past
// the ways that do.
func TestCheckReportsListBits(t *testing.T) {
	var lists, names []string
	for i := range 100 {
		lists = append(lists, fmt.Sprintf("  c%d: {prefixes: [198.51.100.%d/32]}\n", i, i))
		names = append(names, fmt.Sprintf("c%d", i))
	}
	var each strings.Builder
	for i := range 100 {
		fmt.Fprintf(&each, "  - {name: r%d, src: c%d, action: drop}\n", i, i)
	}
	for _, c := range []struct {
		rules  string
		bits   int
		shared bool
		static int
	}{
		{"  - {name: a, src: [c0, c1], action: drop}\n  - {name: b, dst: c1, action: drop}\n", 2, false, 0},
		{"  - {name: a, src: [" + strings.Join(names, ", ") + "], action: drop}\n  - {name: b, dst: c99, action: drop}\n", 2, true, 0},
		{each.String(), 63, false, 37},
	} {
		r, err := Check(parse(t, t.TempDir(), "p.yaml", "lists:\n"+strings.Join(lists, "")+"rules:\n"+c.rules), 0)
		if err != nil {
			t.Fatal(err)
		}
		if r.ListBits != c.bits || r.BitsShared != c.shared || r.StaticLists != c.static || len(r.Lists) != 100 {
			t.Errorf("%.60q: %d lists in %d bits, shared %v, %d static; want 100 in %d, %v, %d", c.rules, len(r.Lists), r.ListBits, r.BitsShared, r.StaticLists,
				c.bits, c.shared, c.static)
		}
	}
}

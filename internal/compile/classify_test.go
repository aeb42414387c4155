package compile

import (
	"fmt"
	"strings"
	"testing"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/policy"
)

// walk follows the trees as bpf/filter.c does, for a frame whose fields
// are given as eqs, and returns the entries of every leaf it reaches.
func walk(c *Classifier, eq func(field uint32) uint32) [][]uint32 {
	var leaves [][]uint32
	for _, ref := range c.Roots {
		for range abi.TreeDepth {
			kind := ref >> abi.TreeKindShift
			if kind >= abi.NumFields {
				break
			}
			ref = c.Tree[ref&abi.TreeOffsetMask+eq(kind)]
		}
		o := ref & abi.TreeOffsetMask
		leaves = append(leaves, c.Tree[o+1:o+1+c.Tree[o]])
	}
	return leaves
}

// feed is n rules as a FlowSpec feed sends them: a source list each (of
// 32), UDP and a destination port of its own.
func feed(t testing.TB, n int) *Image {
	var b strings.Builder
	b.WriteString("lists:\n")
	for k := range 32 {
		fmt.Fprintf(&b, "  l%d: {prefixes: [198.18.%d.0/24]}\n", k, k)
	}
	b.WriteString("rules:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - {name: r%d, src: l%d, proto: udp, dport: %d, action: drop}\n", i, i%32, 1+i)
	}
	pol, err := policy.Parse("feed.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return Build(pol)
}

// TestClassifierLeavesStaySmall: under 10,000 rules a frame reaches leaves
// of at most LeafMax entries whatever the fields, and the last rule's frame
// finds the last rule in its leaf, within a few levels; the tables stay
// well under 64 MiB.
func TestClassifierLeavesStaySmall(t *testing.T) {
	const n = 10_000
	img := feed(t, n)
	c := &img.Classifier
	if got := img.KernelBytes(); got > 64<<20 {
		t.Errorf("%d rules take %d bytes of kernel memory, over 64 MiB", n, got)
	}
	last := img.Rules[n-1]
	// The class whose mask holds the last rule's list.
	var cls uint32
	for i, m := range img.Classes {
		if m == last.SrcLists {
			cls = uint32(i)
		}
	}
	eqOf := func(dport, proto int) func(uint32) uint32 {
		return func(f uint32) uint32 {
			switch f {
			case abi.FieldSrc:
				return c.ClassEqs[cls].Src
			case abi.FieldProto:
				return c.FieldEqs[abi.BaseProto+proto]
			case abi.FieldDport:
				return c.FieldEqs[abi.BaseDport+dport]
			case abi.FieldSport:
				return c.FieldEqs[abi.BaseSport+1000]
			case abi.FieldLength:
				return c.FieldEqs[abi.BaseLength+60]
			case abi.FieldFlags:
				return c.FieldEqs[abi.BaseFlags+abi.ValueNoFlags]
			}
			return 0
		}
	}
	for _, frame := range []struct {
		name         string
		dport, proto int
		want         int // the entry the leaves must hold; -1: none
	}{
		{"last rule", n, 17, n - 1},
		{"no rule's port", 65000, 17, -1},
		{"no rule's protocol", n, 6, -1},
		// Every rule of the list might match: only the first is kept, the
		// others would add nothing to the verdict (unparsed either way).
		{"an unknown protocol", abi.ValueUnknownPorts, abi.ValueUnknownProto, (n - 1) % 32},
	} {
		found := false
		for _, leaf := range walk(c, eqOf(frame.dport, frame.proto)) {
			if len(leaf) > LeafMax {
				t.Errorf("%s: a leaf of %d entries, over %d", frame.name, len(leaf), LeafMax)
			}
			for _, e := range leaf {
				found = found || int(e) == frame.want
			}
		}
		if found != (frame.want >= 0) {
			t.Errorf("%s: entry %d in the leaves: %v, want %v", frame.name, frame.want, found, frame.want >= 0)
		}
	}
}

// TestClassifierCutsAfterASureMatch: a rule that matches every frame hides
// every rule after it from the trees.
func TestClassifierCutsAfterASureMatch(t *testing.T) {
	pol, err := policy.Parse("p.yaml", []byte(`rules:
  - {name: a, proto: udp, dport: 53, action: pass}
  - {name: all, action: drop}
  - {name: b, proto: udp, dport: 54, action: pass}
  - {name: c, proto: udp, dport: 55, action: pass}
  - {name: d, proto: udp, dport: 56, action: pass}
`))
	if err != nil {
		t.Fatal(err)
	}
	c := &Build(pol).Classifier
	for _, leaf := range walk(c, func(uint32) uint32 { return 0 }) {
		for _, e := range leaf {
			if e > 1 {
				t.Errorf("entry %d past the rule that matches every frame is in a leaf %v", e, leaf)
			}
		}
	}
}

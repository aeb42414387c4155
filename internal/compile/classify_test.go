package compile

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
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

// frameEqs is the eq of each field for a frame of 60 bytes with these
// values (indexes of the fields' value tables) and source eq.
func frameEqs(c *Classifier, src uint32, proto, sport, dport, flags int) func(uint32) uint32 {
	return func(f uint32) uint32 {
		switch f {
		case abi.FieldSrc:
			return src
		case abi.FieldProto:
			return c.FieldEqs[abi.BaseProto+proto]
		case abi.FieldSport:
			return c.FieldEqs[abi.BaseSport+sport]
		case abi.FieldDport:
			return c.FieldEqs[abi.BaseDport+dport]
		case abi.FieldFlags:
			return c.FieldEqs[abi.BaseFlags+flags]
		case abi.FieldLength:
			return c.FieldEqs[abi.BaseLength+60]
		}
		return 0
	}
}

// feed is n rules as a FlowSpec feed sends them, compiled.
func feed(t testing.TB, n int) *Image {
	return Build(feedPolicy(t, n, false))
}

// feedPolicy is n rules as a FlowSpec feed sends them: a source each, one
// of 32 lists (or, inline, a /24 of its own), UDP and a destination port
// of its own.
func feedPolicy(t testing.TB, n int, inline bool) *policy.Policy {
	var b strings.Builder
	b.WriteString("lists:\n")
	for k := range 32 {
		fmt.Fprintf(&b, "  l%d: {prefixes: [198.18.%d.0/24]}\n", k, k)
	}
	b.WriteString("rules:\n")
	for i := range n {
		src := fmt.Sprintf("l%d", i%32)
		if inline {
			src = fmt.Sprintf("10.%d.%d.0/24", i>>8&255, i&255)
		}
		fmt.Fprintf(&b, "  - {name: r%d, src: %s, proto: udp, dport: %d, action: drop}\n", i, src, 1+i)
	}
	pol, err := policy.Parse("feed.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return pol
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
		flags := abi.ValueNoFlags
		if proto == abi.ValueUnknownProto {
			flags = abi.ValueUnknownFlags
		}
		return frameEqs(c, c.ClassEqs[cls].Src, proto, 1000, dport, flags)
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

// firstMatch is the first of port-only entries a TCP frame matches, or -1.
func firstMatch(entries []abi.Rule, sport, dport int) int {
	for i, e := range entries {
		if e.Match&abi.MatchSport != 0 && (sport < int(e.SportLo) || sport > int(e.SportHi)) {
			continue
		}
		if e.Match&abi.MatchDport != 0 && (dport < int(e.DportLo) || dport > int(e.DportHi)) {
			continue
		}
		return i
	}
	return -1
}

// leavesHold says whether the leaves a frame reaches hold entry want.
func leavesHold(c *Classifier, sport, dport, want int) bool {
	leaves := walk(c, frameEqs(c, 0, 6, sport, dport, abi.ValueUnknownFlags))
	for _, leaf := range leaves {
		for _, e := range leaf {
			if int(e) == want {
				return true
			}
		}
	}
	return false
}

// TestClassifierBoundedOnHardPolicies: policies built to blow a decision
// tree up — entries on one port each of two fields, which a split on
// either copies under every eq of the other; nested ranges, whose eqs each
// cover a number of entries that grows with the entries — compile within
// bounds, and every frame still reaches the entry it matches.
func TestClassifierBoundedOnHardPolicies(t *testing.T) {
	var crossed, nested []abi.Rule
	for i := range 8000 {
		crossed = append(crossed, abi.Rule{Match: abi.MatchDport, DportLo: uint16(1 + i), DportHi: uint16(1 + i), Action: abi.ActionDrop, Rule: uint32(len(crossed))})
		crossed = append(crossed, abi.Rule{Match: abi.MatchSport, SportLo: uint16(1 + i), SportHi: uint16(1 + i), Action: abi.ActionDrop, Rule: uint32(len(crossed))})
		nested = append(nested, abi.Rule{Match: abi.MatchDport, DportLo: uint16(32768 - i), DportHi: uint16(32768 + i), Action: abi.ActionDrop, Rule: uint32(i)})
	}
	for _, c := range []struct {
		name    string
		entries []abi.Rule
	}{{"crossed ports", crossed}, {"nested ranges", nested}} {
		cl := Classify(c.entries, []uint64{0}, nil, nil)
		if len(cl.Tree) > treeBudget+len(c.entries)+1 {
			t.Errorf("%s: %d words of tree, over the budget of %d and a leaf", c.name, len(cl.Tree), treeBudget)
		}
		for _, f := range [][2]int{{1, 1}, {5000, 7000}, {8000, 1}, {9000, 9000}, {30000, 32768}, {1, 32768 + 7999}, {1, 40000}} {
			want := firstMatch(c.entries, f[0], f[1])
			if want >= 0 && !leavesHold(&cl, f[0], f[1], want) {
				t.Errorf("%s: sport %d, dport %d: entry %d matches first and no leaf holds it", c.name, f[0], f[1], want)
			}
		}
	}
}

// TestClassifierTablesDoNotDependOnKeys: eqs are numbered as values meet
// them, so two compiles (each with keys of its own) give the same tables.
func TestClassifierTablesDoNotDependOnKeys(t *testing.T) {
	a, b := feed(t, 500), feed(t, 500)
	if !slices.Equal(a.Tree, b.Tree) || !slices.Equal(a.FieldEqs, b.FieldEqs) || !slices.Equal(a.ClassEqs, b.ClassEqs) {
		t.Error("two compiles of one policy gave different classifier tables")
	}
}

// nearAddrs draws addresses of either family from 1,024 /24s of
// 10.0.0.0/14 or /48s of 2001:db8::/38, and prefixes holding them, seldom
// wide (so that frames reach deep rules): prefixes nest and overlap, and
// addresses fall in them.
func nearAddrs(rng *rand.Rand) (addr func(v6 bool) netip.Addr, prefix func() netip.Prefix) {
	addr = func(v6 bool) netip.Addr {
		if v6 {
			return netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, byte(rng.IntN(4)), byte(rng.IntN(256)), 15: byte(rng.IntN(16))})
		}
		return netip.AddrFrom4([4]byte{10, byte(rng.IntN(4)), byte(rng.IntN(256)), byte(rng.IntN(16))})
	}
	prefix = func() netip.Prefix {
		v6 := rng.IntN(3) == 0
		bits := []int{16, 20, 24, 26, 28, 30, 32, 32}[rng.IntN(8)]
		if v6 {
			bits = []int{46, 48, 56, 64, 120, 124, 128, 128}[rng.IntN(8)]
		}
		return netip.PrefixFrom(addr(v6), bits).Masked()
	}
	return addr, prefix
}

// TestInlinePrefixes: thousands of nested inline prefixes, each alone on
// its side of a rule and so taking no bit of the membership mask, beside a
// few lists. For random addresses the trees must keep the first rule whose
// prefixes hold them in the leaves the frame reaches; the tables must give
// each address the class of the longest inline prefix holding it.
func TestInlinePrefixes(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	addr, prefix := nearAddrs(rng)
	// Two lists of random prefixes, nested in and holding inline ones.
	var b strings.Builder
	b.WriteString("lists:\n")
	lists := map[string]*policy.List{}
	for _, name := range []string{"l0", "l1"} {
		var ps []netip.Prefix
		var quoted []string
		for range 60 {
			ps = append(ps, prefix())
			quoted = append(quoted, strconv.Quote(ps[len(ps)-1].String()))
		}
		lists[name] = policy.NewList(name, ps)
		fmt.Fprintf(&b, "  %s: {prefixes: [%s]}\n", name, strings.Join(quoted, ", "))
	}
	b.WriteString("rules:\n")
	type side struct {
		name string
		p    netip.Prefix // or a list
		list *policy.List
	}
	var rules [][2]*side
	var families []int // by rule: 0, 4 or 6
	for i := range 4000 {
		var r [2]*side
		var f []string
		for s, name := range []string{"src", "dst"} {
			switch n := rng.IntN(10); {
			case n <= 6 || s == 1 && r[0] == nil: // every rule tests an address
				p := prefix()
				r[s] = &side{name: name, p: p}
				f = append(f, fmt.Sprintf("%s: %q", name, p))
			case n <= 8:
				l := fmt.Sprint("l", rng.IntN(2))
				r[s] = &side{name: name, list: lists[l]}
				f = append(f, fmt.Sprintf("%s: %s", name, l))
			}
		}
		// Some rules name a family, the other one than their prefix's at
		// times: they match no frame, and must hide no rule after them.
		fam := []int{0, 0, 0, 4, 6}[rng.IntN(5)]
		if fam != 0 {
			f = append(f, fmt.Sprintf("family: %d", fam))
		}
		rules = append(rules, r)
		families = append(families, fam)
		fmt.Fprintf(&b, "  - {name: r%d, %s action: %s}\n", i, strings.Join(append(f, ""), ", "), []string{"drop", "pass"}[i%2])
	}
	pol, err := policy.Parse("p.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if _, masked := pol.Usage(); masked.Lists() != 2 {
		t.Fatalf("lists taking a bit: %v, want l0 and l1", masked)
	}
	img := Build(pol)
	c := &img.Classifier
	holds := func(s *side, a netip.Addr) bool {
		if s == nil {
			return true
		}
		if s.list != nil {
			return s.list.Contains(a)
		}
		return s.p.Contains(a)
	}
	class := func(a netip.Addr) uint32 {
		if a.Is4() {
			return img.class4(policy.V4ToUint(a), nil, func(string, int, int) {})
		}
		return img.class6(policy.U128Of(a), nil)
	}
	checked, deepest := 0, 0
	for range 20_000 {
		v6 := rng.IntN(2) == 0
		src, dst := addr(v6), addr(v6)
		fam := 4
		if v6 {
			fam = 6
		}
		want := -1
		for i, r := range rules {
			if (families[i] == 0 || families[i] == fam) && holds(r[0], src) && holds(r[1], dst) {
				want = i
				break
			}
		}
		if want < 0 {
			continue
		}
		checked, deepest = checked+1, max(deepest, want)
		cs, cd := class(src), class(dst)
		found := false
		for _, leaf := range walk(c, func(f uint32) uint32 {
			switch f {
			case abi.FieldFamily:
				return uint32(b2i(v6))
			case abi.FieldSrc:
				return c.ClassEqs[cs].Src
			case abi.FieldDst:
				return c.ClassEqs[cd].Dst
			}
			return 0
		}) {
			found = found || slices.ContainsFunc(leaf, func(e uint32) bool { return img.Rules[e].Rule == uint32(want) })
		}
		if !found {
			t.Fatalf("%s -> %s: rule %d (%v, %v) holds them, and is in no leaf the frame reaches", src, dst, want, rules[want][0], rules[want][1])
		}
	}
	if checked < 2000 || deepest < 1000 {
		t.Fatalf("%d of 20,000 frames matched a rule, the deepest rule %d: the test does not reach the prefixes", checked, deepest)
	}
	t.Logf("%d classes; %d of 20,000 frames found their first rule, the deepest %d", len(img.Classes), checked, deepest)
}

// TestSideFirst: a class's SrcFirst (DstFirst) is the first entry its
// sources (destinations) can match, past those that test the side and
// exclude it, whatever they test besides; FirstNone when every entry does.
func TestSideFirst(t *testing.T) {
	const a, b, c = 1, 2, 4 // list bits
	classes := []uint64{0, a, b, a | b, c}
	tcp := abi.Rule{Match: abi.MatchProto, ProtoLo: 6, ProtoHi: 6}
	for _, dst := range []bool{false, true} {
		byList := func(lists uint64, more uint32) abi.Rule {
			r := abi.Rule{Match: abi.MatchSrc | more, SrcLists: lists, ProtoLo: 17, ProtoHi: 17, DportLo: 53, DportHi: 53}
			if dst {
				r.Match, r.SrcLists, r.DstLists = abi.MatchDst|more, 0, lists
			}
			return r
		}
		for _, tc := range []struct {
			name    string
			entries []abi.Rule
			want    []uint32 // by class
		}{
			{"an entry testing no address third", []abi.Rule{byList(a, abi.MatchProto|abi.MatchDport), byList(b, 0), tcp, byList(c, 0)},
				[]uint32{3, 1, 2, 1, 3}},
			{"every entry tests the side", []abi.Rule{byList(a, abi.MatchProto|abi.MatchDport), byList(b, 0), byList(c, 0)},
				[]uint32{abi.FirstNone, 1, 2, 1, 3}},
			{"the first tests no address", []abi.Rule{tcp, byList(a, 0)},
				[]uint32{1, 1, 1, 1, 1}},
		} {
			t.Run(fmt.Sprintf("%s, dst %v", tc.name, dst), func(t *testing.T) {
				for i := range tc.entries {
					tc.entries[i].Rule = uint32(i)
				}
				cl := Classify(tc.entries, classes, nil, nil)
				for v, want := range tc.want {
					e := cl.ClassEqs[v]
					got, other := e.SrcFirst, e.DstFirst
					if dst {
						got, other = other, got
					}
					if got != want {
						t.Errorf("class %d (lists %b): first %d, want %d", v, classes[v], got, want)
					}
					// The other side is tested by no entry: every entry is its.
					if other != 1 {
						t.Errorf("class %d: the untested side's first %d, want 1", v, other)
					}
				}
			})
		}
	}
}

// TestSideFirstHoldsForAddresses: for random policies over lists past the
// mask's bits (static rows), inline prefixes, lists beside prefixes and
// family rules, and random addresses looked up as the data plane does, no
// entry before an address class's first (source or destination) passes
// that side's checks (bpf/filter.c's rule_matches: family, lists or row,
// bits), and none does when it is FirstNone. The data plane skips those
// entries on the strength of it.
func TestSideFirstHoldsForAddresses(t *testing.T) {
	for seed := range uint64(30) {
		rng := rand.New(rand.NewPCG(seed, 7))
		addr, prefix := nearAddrs(rng)
		lists := []int{3, 10, abi.MaxLists + 17}[seed%3] // the last takes static rows
		var b strings.Builder
		b.WriteString("lists:\n")
		for l := range lists {
			var ps []string
			for range 1 + rng.IntN(8) {
				ps = append(ps, strconv.Quote(prefix().String()))
			}
			fmt.Fprintf(&b, "  l%d: {prefixes: [%s]}\n", l, strings.Join(ps, ", "))
		}
		// Sides are rarely left open: an entry that tests no address is
		// every class's first from there on.
		side := func() string {
			switch n := rng.IntN(100); {
			case n < 60:
				var ls []string
				for range 1 + rng.IntN(3) {
					ls = append(ls, fmt.Sprint("l", rng.IntN(lists)))
				}
				return "[" + strings.Join(ls, ", ") + "]"
			case n < 85:
				return strconv.Quote(prefix().String())
			case n < 99:
				return fmt.Sprintf("[%q, l%d]", prefix(), rng.IntN(lists))
			}
			return ""
		}
		b.WriteString("rules:\n")
		for i := range 200 {
			var f []string
			for _, name := range []string{"src", "dst"} {
				if s := side(); s != "" {
					f = append(f, name+": "+s)
				}
			}
			if rng.IntN(2) == 0 {
				f = append(f, "proto: udp", fmt.Sprintf("dport: %d", rng.IntN(5)))
			}
			if fam := []int{0, 0, 0, 4, 6}[rng.IntN(5)]; fam != 0 {
				f = append(f, fmt.Sprintf("family: %d", fam))
			}
			fmt.Fprintf(&b, "  - {name: r%d, %s action: %s}\n", i, strings.Join(append(f, ""), ", "), []string{"drop", "pass"}[i%2])
		}
		pol, err := policy.Parse("p.yaml", []byte(b.String()))
		if err != nil {
			t.Fatal(err)
		}
		img := Build(pol)
		c := &img.Classifier
		static := 0
		for range 3000 {
			a := addr(rng.IntN(2) == 0)
			var cls uint32
			if a.Is4() {
				cls = img.class4(policy.V4ToUint(a), nil, func(string, int, int) {})
			} else {
				cls = img.class6(policy.U128Of(a), nil)
			}
			ce := c.ClassEqs[cls]
			if ce.Set != 0 {
				static++
			}
			for _, dst := range []bool{false, true} {
				first, got := ce.SrcFirst, -1
				if dst {
					first = ce.DstFirst
				}
				for r := range img.Rules {
					if sidePasses(c, &img.Rules[r], ce, a, dst) {
						got = r
						break
					}
				}
				// The first may be earlier than it need be (it does not
				// judge the family), never later.
				if first == 0 || got >= 0 && (first == abi.FirstNone || int(first)-1 > got) {
					t.Fatalf("seed %d, %s (class %d) as dst %v: first %d, but entry %d is the first whose side passes", seed, a, cls, dst, first, got)
				}
			}
		}
		if lists > abi.MaxLists && static == 0 {
			t.Errorf("seed %d: no address in a static list: the rows went untested", seed)
		}
	}
}

// sidePasses is rule_matches' checks of one side of entry e (and its
// family) for address a of a class with eqs ce.
func sidePasses(c *Classifier, e *abi.Rule, ce abi.ClassEqs, a netip.Addr, dst bool) bool {
	fam := uint32(abi.MatchIPv4)
	if a.Is6() {
		fam = abi.MatchIPv6
	}
	if f := e.Match & (abi.MatchIPv4 | abi.MatchIPv6); f != 0 && f != fam {
		return false
	}
	match, bitsFlag, lists, row, mask, want := uint32(abi.MatchSrc), uint32(abi.MatchSrcBits), e.SrcLists, e.SrcRow, e.SrcMask, e.SrcBits
	if dst {
		match, bitsFlag, lists, row, mask, want = abi.MatchDst, abi.MatchDstBits, e.DstLists, e.DstRow, e.DstMask, e.DstBits
	}
	if e.Match&match != 0 && ce.Mask&lists == 0 {
		if row == 0 || ce.Set == 0 || c.Tree[c.SetsBase+(ce.Set-1)*c.RowWords+uint32(row>>5)]>>(row&31)&1 == 0 {
			return false
		}
	}
	if e.Match&bitsFlag != 0 {
		// An IPv4 address is the first 4 of the 16 bytes, as the frame
		// holds it.
		var b [16]byte
		if a.Is4() {
			a4 := a.As4()
			copy(b[:], a4[:])
		} else {
			b = a.As16()
		}
		for i := range 2 {
			if binary.NativeEndian.Uint64(b[8*i:])&mask[i] != want[i] {
				return false
			}
		}
	}
	return true
}

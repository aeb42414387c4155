package compile

import (
	crand "crypto/rand"
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sync"
	"unsafe"

	"github.com/rampart-fw/rampart/internal/abi"
)

// Classifier is the rule entries compiled into the data plane's decision
// trees (bpf/common.h): what each field's values are to the rules, and trees
// over those eqs down to leaves of the few entries a frame may match.
type Classifier struct {
	Tree  []uint32 // the trees, then the rows of static lists (Rows.Bits)
	Roots []uint32
	// Where the rows are in Tree: from SetsBase, RowWords words a row; a
	// class's row is its ClassEqs' Set.
	SetsBase, RowWords uint32
	FieldEqs           []uint32       // abi.FieldValues entries, by field base and value
	ClassEqs           []abi.ClassEqs // by address class
}

// KernelBytes is the kernel memory the classifier's maps take.
func (c *Classifier) KernelBytes() uint64 {
	return uint64(len(c.Tree)+len(c.FieldEqs))*4 + uint64(len(c.ClassEqs))*uint64(unsafe.Sizeof(abi.ClassEqs{}))
}

// LeafMax is the most entries a leaf holds when a field is left to split
// them: a frame matches at most this many whole.
const LeafMax = 4

// treeBudget bounds the trees (u32 words, 64 MiB): a split that could pass
// it is not made, and leaves grow, correct but slower to scan. The trees
// stay under it and one leaf (entries at most), far under the 2^28 words a
// ref addresses (abi.TreeOffsetMask).
const treeBudget = 1 << 24

// status is what a field's eq makes of an entry that tests the field.
type status uint8

const (
	stNo      status = iota // the entry cannot match
	stMatch                 // the field matches
	stUnknown               // the frame lacks the field: the entry might have matched
	stVague                 // EQ_ANY: the leaf decides
)

// cand is an eq of a field under which an entry may match.
type cand struct {
	eq uint32
	st status
}

// field is one field's eqs: per entry testing it, the eqs under which it
// may match (nil: the entry does not test the field).
type field struct {
	n     int
	cands [][]cand
	// unsplit: candidates past maxCands (nested ranges make them grow
	// with the square of the entries): no node splits on the field, and
	// leaves check it whole.
	unsplit bool
}

// maxCands bounds a field's candidates, entries times the eqs each covers.
const maxCands = 1 << 24

// keys are random 128-bit identities of (entry, status), XORed into the key
// of a value's judgement: equal keys, the same judgement by every rule.
// They are drawn anew for every compile from the system's random source:
// XOR is linear, so with keys anyone could know, a policy could be written
// whose distinct judgements collide (and a rule would be lost); with secret
// ones, distinct judgements collide with probability about eqs²/2^128.
// Eqs are numbered in the order values meet them, so the tables do not
// depend on the keys.
type keys [][2]judgement

func newKeys(n int) keys {
	var seed [32]byte
	crand.Read(seed[:]) // never fails (crypto/rand)
	rng := rand.New(rand.NewChaCha8(seed))
	k := make(keys, n)
	for i := range k {
		k[i] = [2]judgement{{rng.Uint64(), rng.Uint64()}, {rng.Uint64(), rng.Uint64()}}
	}
	return k
}

func (k keys) of(r int, st status) judgement {
	return k[r][st-stMatch]
}

// judgement identifies how every entry judges a value: the XOR of the keys
// of the entries that may match it, each with its status.
type judgement [2]uint64

func (j *judgement) add(k judgement) {
	j[0] ^= k[0]
	j[1] ^= k[1]
}

// eqTable numbers judgements as they are met.
type eqTable struct {
	ids  map[judgement]uint32
	next uint32
}

func newEqTable(first uint32) *eqTable {
	return &eqTable{ids: map[judgement]uint32{}, next: first}
}

func (t *eqTable) id(k judgement) uint32 {
	id, ok := t.ids[k]
	if !ok {
		id = t.next
		t.ids[k] = id
		t.next++
	}
	return id
}

// pointField builds a field whose values (0 to values-1) are judged one by
// one: st says how entry r fares with value v. eqs[v] is v's eq.
func pointField(entries []abi.Rule, k keys, tests func(r int) bool, values int,
	st func(r, v int) status) (f field, eqs []uint32) {
	table := newEqTable(0)
	f.cands = make([][]cand, len(entries))
	var testers []int
	for r := range entries {
		if tests(r) {
			testers = append(testers, r)
			f.cands[r] = []cand{}
		}
	}
	eqs = make([]uint32, values)
	seen := map[uint32]bool{}
	for v := range values {
		var key judgement
		for _, r := range testers {
			if s := st(r, v); s != stNo {
				key.add(k.of(r, s))
			}
		}
		eq := table.id(key)
		eqs[v] = eq
		if seen[eq] {
			continue
		}
		seen[eq] = true
		for _, r := range testers {
			if s := st(r, v); s != stNo {
				f.cands[r] = append(f.cands[r], cand{eq, s})
			}
		}
	}
	f.n = int(table.next)
	return f, eqs
}

// rangeField builds a field whose entries each match one range of values
// below limit; the values from limit up are special: special(v) is stNo or
// stUnknown for every entry testing the field. The values are swept in
// elementary intervals, not one by one.
func rangeField(entries []abi.Rule, k keys, tests func(r int) bool, rng func(r int) (lo, hi int), limit int,
	special []status) (f field, eqs []uint32) {
	table := newEqTable(0)
	f.cands = make([][]cand, len(entries))
	type event struct{ at, r int }
	var events []event
	for r := range entries {
		if tests(r) {
			f.cands[r] = []cand{}
			lo, hi := rng(r)
			events = append(events, event{lo, r}, event{hi + 1, r})
		}
	}
	slices.SortFunc(events, func(a, b event) int { return a.at - b.at })
	eqs = make([]uint32, limit+len(special))
	// Elementary intervals: starts[i] to starts[i+1]-1 share eq ivEq[i].
	var starts []int
	var ivEq []uint32
	var key judgement
	for i, at := 0, 0; at < limit; {
		for ; i < len(events) && events[i].at == at; i++ {
			key.add(k.of(events[i].r, stMatch))
		}
		end := limit
		if i < len(events) {
			end = min(end, events[i].at)
		}
		eq := table.id(key)
		starts = append(starts, at)
		ivEq = append(ivEq, eq)
		for v := at; v < end; v++ {
			eqs[v] = eq
		}
		at = end
	}
	stamp := make([]int, 0)
	total := 0
	for r := range entries {
		if f.cands[r] == nil || f.unsplit {
			continue
		}
		lo, hi := rng(r)
		i, _ := slices.BinarySearch(starts, lo+1)
		for i--; i < len(starts) && starts[i] <= hi; i++ {
			eq := ivEq[i]
			for int(eq) >= len(stamp) {
				stamp = append(stamp, -1)
			}
			if stamp[eq] != r {
				stamp[eq] = r
				f.cands[r] = append(f.cands[r], cand{eq, stMatch})
				total++
			}
		}
		f.unsplit = total > maxCands
	}
	for j, s := range special {
		var key judgement
		for r := range entries {
			if f.cands[r] != nil && s != stNo {
				key.add(k.of(r, s))
			}
		}
		known := table.next
		eq := table.id(key)
		eqs[limit+j] = eq
		if s != stNo && eq >= known {
			for r := range entries {
				if f.cands[r] != nil {
					f.cands[r] = append(f.cands[r], cand{eq, s})
				}
			}
		}
	}
	f.n = int(table.next)
	return f, eqs
}

// Prefixes is how the inline prefixes entries check by their bits (ids
// from 1; 0: none) meet the address classes.
type Prefixes struct {
	Parent   []uint32 // by id: the longest other inline prefix holding it
	OfClass  []uint32 // by class: the longest inline prefix holding its addresses
	Src, Dst []uint32 // by entry: the inline prefix its source or destination is
}

// addressField builds the source or destination field over the address
// classes: an entry testing lists (lists(r) != 0 or row(r) != 0) matches a
// class holding any of them (by the mask, or the class's row), one with an
// inline prefix (prefix[r] != 0) a class inside it. Eq 0 (EQ_ANY) keeps every entry testing the field, vague: the leaf
// decides. A class's judgement is its lists' entries and its inline
// prefixes' (the longest holding it and theirs up the chain), so that
// thousands of prefixes cost their chains, not classes times entries.
func addressField(n int, k keys, classes []uint64, lists func(r int) uint64, row func(r int) uint16, rows *Rows, prefix []uint32, px *Prefixes) (f field, eqs []uint32) {
	table := newEqTable(abi.EqAny + 1)
	f.cands = make([][]cand, n)
	var listed []int
	var byPrefix map[uint32][]int
	var byRow map[uint16][]int // by row bit, the entries with static lists
	for r := range n {
		if row(r) != 0 {
			if byRow == nil {
				byRow = map[uint16][]int{}
			}
			byRow[row(r)] = append(byRow[row(r)], r)
		}
		switch {
		case lists(r) != 0 || row(r) != 0:
			listed = append(listed, r)
		case prefix != nil && prefix[r] != 0:
			if byPrefix == nil {
				byPrefix = map[uint32][]int{}
			}
			byPrefix[prefix[r]] = append(byPrefix[prefix[r]], r)
		default:
			continue
		}
		f.cands[r] = []cand{}
	}
	// chain[id]: the key of the entries of prefix id and of every prefix
	// holding it.
	var chain []judgement
	var done []bool
	if byPrefix != nil {
		chain, done = make([]judgement, len(px.Parent)), make([]bool, len(px.Parent))
	}
	var chainOf func(id uint32) judgement
	chainOf = func(id uint32) judgement {
		if id == 0 || byPrefix == nil {
			return judgement{}
		}
		if !done[id] {
			key := chainOf(px.Parent[id])
			for _, r := range byPrefix[id] {
				key.add(k.of(r, stMatch))
			}
			chain[id], done[id] = key, true
		}
		return chain[id]
	}
	// Per distinct list mask (a few; classes are many with many inline
	// prefixes): the entries of its lists, and their key.
	type ofMask struct {
		key     judgement
		entries []int
	}
	masks := map[uint64]*ofMask{}
	eqs = make([]uint32, len(classes))
	seen := map[uint32]bool{}
	for v, mask := range classes {
		mask &^= ClassUnmasked
		m := masks[mask]
		if m == nil {
			m = &ofMask{}
			for _, r := range listed {
				if mask&lists(r) != 0 {
					m.entries = append(m.entries, r)
					m.key.add(k.of(r, stMatch))
				}
			}
			masks[mask] = m
		}
		var p uint32
		if px != nil && v < len(px.OfClass) {
			p = px.OfClass[v]
		}
		key := m.key
		key.add(chainOf(p))
		// The entries the class's row adds, not matching by the mask.
		var byStatic []int
		if byRow != nil {
			for w, word := range rows.of(v) {
				for ; word != 0; word &= word - 1 {
					for _, r := range byRow[uint16(w*32+bits.TrailingZeros32(word))] {
						if mask&lists(r) == 0 {
							byStatic = append(byStatic, r)
							key.add(k.of(r, stMatch))
						}
					}
				}
			}
		}
		eq := table.id(key)
		eqs[v] = eq
		if seen[eq] {
			continue
		}
		seen[eq] = true
		for _, r := range m.entries {
			f.cands[r] = append(f.cands[r], cand{eq, stMatch})
		}
		for _, r := range byStatic {
			f.cands[r] = append(f.cands[r], cand{eq, stMatch})
		}
		for q := p; q != 0 && byPrefix != nil; q = px.Parent[q] {
			for _, r := range byPrefix[q] {
				f.cands[r] = append(f.cands[r], cand{eq, stMatch})
			}
		}
	}
	f.n = max(int(table.next), abi.EqAny+1)
	for r := range f.cands {
		if f.cands[r] != nil {
			f.cands[r] = append(f.cands[r], cand{abi.EqAny, stVague})
		}
	}
	return f, eqs
}

// Classify compiles entries, in policy order, over the address classes
// (class id -> list mask, and their rows of static lists: nil for none)
// and the inline prefixes (nil: none).
func Classify(entries []abi.Rule, classes []uint64, px *Prefixes, rows *Rows) Classifier {
	var c Classifier
	k := newKeys(len(entries))
	tests := func(bit uint32) func(int) bool {
		return func(r int) bool { return entries[r].Match&bit != 0 }
	}
	// The fields are independent, each judged on a goroutine of its own;
	// they fill disjoint parts of FieldEqs and ClassEqs.
	var fs [abi.NumFields]field
	var wg sync.WaitGroup
	c.FieldEqs = make([]uint32, abi.FieldValues)
	wg.Go(func() {
		fs[abi.FieldFamily], _ = pointField(entries, k, tests(abi.MatchIPv4|abi.MatchIPv6), 2, func(r, v int) status {
			switch m := entries[r].Match; {
			case m&abi.MatchIPv4 != 0 && m&abi.MatchIPv6 != 0:
				return stNo // a family: 4 rule on an IPv6 prefix, say: no frame
			case (m&abi.MatchIPv6 != 0) == (v == 1):
				return stMatch
			}
			return stNo
		})
	})
	ranges := func(f, base int, match uint32, rng func(r int) (lo, hi int), limit int, unusual []status) {
		wg.Go(func() {
			var eqs []uint32
			fs[f], eqs = rangeField(entries, k, tests(match), rng, limit, unusual)
			copy(c.FieldEqs[base:], eqs)
		})
	}
	// A protocol is a range too: swept, not judged value by value (a feed's
	// 10,000 UDP rules made that 2.6M judgements, a fifth of Build).
	ranges(abi.FieldProto, abi.BaseProto, abi.MatchProto, func(r int) (int, int) {
		return int(entries[r].ProtoLo), int(entries[r].ProtoHi)
	}, abi.ValueUnknownProto, []status{stUnknown})
	wg.Go(func() {
		var eqs []uint32
		fs[abi.FieldFlags], eqs = pointField(entries, k, tests(abi.MatchTCPFlags), abi.ValueUnknownFlags+1, func(r, v int) status {
			e := &entries[r]
			switch {
			case v == abi.ValueUnknownFlags:
				return stUnknown
			case v == abi.ValueNoFlags:
				return stNo
			case uint8(v)&e.FlagsSet == e.FlagsSet && uint8(v)&e.FlagsClear == 0:
				return stMatch
			}
			return stNo
		})
		copy(c.FieldEqs[abi.BaseFlags:], eqs)
	})
	ports := []status{stNo, stUnknown} // VALUE_NO_PORTS, VALUE_UNKNOWN_PORTS
	ranges(abi.FieldSport, abi.BaseSport, abi.MatchSport, func(r int) (int, int) {
		return int(entries[r].SportLo), int(entries[r].SportHi)
	}, abi.ValueNoPorts, ports)
	ranges(abi.FieldDport, abi.BaseDport, abi.MatchDport, func(r int) (int, int) {
		return int(entries[r].DportLo), int(entries[r].DportHi)
	}, abi.ValueNoPorts, ports)
	ranges(abi.FieldLength, abi.BaseLength, abi.MatchLength, func(r int) (int, int) {
		return int(entries[r].LenLo), int(entries[r].LenHi)
	}, abi.ValueLong, []status{stNo})

	// Addresses: a class's eq as a source and as a destination, and its
	// lists, which the lookup reads with them.
	c.ClassEqs = make([]abi.ClassEqs, len(classes))
	for v, m := range classes {
		c.ClassEqs[v].Mask = m
	}
	var srcPx, dstPx []uint32
	if px != nil {
		srcPx, dstPx = px.Src, px.Dst
	}
	for _, a := range []struct {
		f      int
		lists  func(r int) uint64
		row    func(r int) uint16
		prefix []uint32
		set    func(e *abi.ClassEqs, eq uint32)
	}{
		{abi.FieldSrc, func(r int) uint64 { return entries[r].SrcLists }, func(r int) uint16 { return entries[r].SrcRow }, srcPx,
			func(e *abi.ClassEqs, eq uint32) { e.Src = eq }},
		{abi.FieldDst, func(r int) uint64 { return entries[r].DstLists }, func(r int) uint16 { return entries[r].DstRow }, dstPx,
			func(e *abi.ClassEqs, eq uint32) { e.Dst = eq }},
	} {
		wg.Go(func() {
			var eqs []uint32
			fs[a.f], eqs = addressField(len(entries), k, classes, a.lists, a.row, rows, a.prefix, px)
			for v, eq := range eqs {
				a.set(&c.ClassEqs[v], eq)
			}
		})
	}
	wg.Wait()
	src, dst := sideFirst(&fs[abi.FieldSrc], len(entries)), sideFirst(&fs[abi.FieldDst], len(entries))
	for v := range c.ClassEqs {
		e := &c.ClassEqs[v]
		e.SrcFirst, e.DstFirst = src[e.Src], dst[e.Dst]
	}

	b := treeBuilder{entries: entries, fields: &fs, memo: make(map[string]uint32, len(entries)), leafChecks: leafChecks(entries, srcPx, dstPx)}
	for f := range fs {
		if fs[f].unsplit {
			b.unsplit |= 1 << f
		}
	}
	for _, group := range groups(len(entries), b.tests) {
		items := make([]item, len(group))
		for i, r := range group {
			items[i] = item{entry: int32(r), left: b.tests(r)}
		}
		c.Roots = append(c.Roots, b.node(b.normalize(items)))
	}
	c.Tree = b.tree
	if rows != nil {
		c.SetsBase, c.RowWords = uint32(len(c.Tree)), uint32(rows.Words)
		c.Tree = append(c.Tree, rows.Bits...)
		for v, s := range rows.Set {
			c.ClassEqs[v].Set = s
		}
	}
	return c
}

// sideFirst is, by an address field's eq, the first of n entries an
// address of the eq can match, + 1 (abi.ClassEqs' SrcFirst, DstFirst): the
// first entry not testing the field, or testing it and matching the eq,
// whichever comes first; abi.FirstNone when there is neither. Every entry
// before it cannot match, whatever the frame's other fields, as the trees
// take it.
func sideFirst(side *field, n int) []uint32 {
	free := n // the first entry not testing the field
	first := make([]uint32, side.n)
	for r := n - 1; r >= 0; r-- {
		if side.cands[r] == nil {
			free = r
			continue
		}
		for _, c := range side.cands[r] {
			if c.st == stMatch {
				first[c.eq] = uint32(r) + 1
			}
		}
	}
	for eq := range first {
		switch {
		case first[eq] != 0 && int(first[eq]) <= free:
		case free < n:
			first[eq] = uint32(free) + 1
		default:
			first[eq] = abi.FirstNone
		}
	}
	return first
}

// groups splits the entries by the address fields they test (tests), each
// group a tree: entries testing the destination, those testing only the
// source, and the rest. A group never copies the others' entries under its
// address eqs. A policy small enough for one leaf is one group.
func groups(n int, tests func(r int) uint8) [][]int {
	var out [3][]int
	for r := range n {
		g := 2
		switch t := tests(r); {
		case t&(1<<abi.FieldDst) != 0 || n <= LeafMax:
			g = 0
		case t&(1<<abi.FieldSrc) != 0:
			g = 1
		}
		out[g] = append(out[g], r)
	}
	return slices.DeleteFunc(out[:], func(g []int) bool { return len(g) == 0 })
}

// item is an entry on its way down a tree.
type item struct {
	entry int32
	left  uint8 // the fields it tests that the path has not split on
	unk   bool  // a field on the path is unknown to the frame: it can only might-match
	vague bool  // an address field on the path was EQ_ANY
}

// normalize cuts a node's items after the first that matches every frame
// reaching the node, and drops those that surely might-match after an
// earlier one of the same kind of action: neither changes a verdict.
func (b *treeBuilder) normalize(items []item) []item {
	out := make([]item, 0, len(items))
	var seen [2]bool
	for _, it := range items {
		// An entry with a field only its leaf checks is never sure.
		sure := it.left == 0 && !it.vague && b.leafChecks[it.entry] == 0
		if sure && it.unk {
			kind := b.entries[it.entry].Action != abi.ActionPass
			if seen[b2i(kind)] {
				continue
			}
			seen[b2i(kind)] = true
		}
		out = append(out, it)
		if sure && !it.unk {
			break
		}
	}
	return out
}

// leafFields are the fields the trees leave to the leaf's whole match: DSCP,
// flow label, fragment, ICMP, address bits, TCP's reserved bits.
const leafFields = abi.MatchIcmpType | abi.MatchIcmpCode | abi.MatchDscp | abi.MatchFragment | abi.MatchFlowLabel | abi.MatchSrcBits |
	abi.MatchDstBits | abi.MatchTCPRes

// leafChecks are, by entry, the fields only its leaf checks: leafFields,
// but an inline prefix's bits, which the address eqs decide as well.
func leafChecks(entries []abi.Rule, src, dst []uint32) []uint32 {
	out := make([]uint32, len(entries))
	for r, e := range entries {
		out[r] = e.Match & leafFields
		if src != nil && src[r] != 0 {
			out[r] &^= abi.MatchSrcBits
		}
		if dst != nil && dst[r] != 0 {
			out[r] &^= abi.MatchDstBits
		}
	}
	return out
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

type treeBuilder struct {
	entries    []abi.Rule
	leafChecks []uint32 // by entry
	fields     *[abi.NumFields]field
	tree       []uint32
	memo       map[string]uint32 // a node's items -> its ref
	counts     []int
	unsplit    uint8 // the fields no node splits on
}

// tests is the fields entry r tests, as bits.
func (b *treeBuilder) tests(r int) uint8 {
	var m uint8
	for f := range b.fields {
		if b.fields[f].cands[r] != nil {
			m |= 1 << f
		}
	}
	return m
}

// node returns the ref of the subtree for items, built once per distinct
// list of items.
func (b *treeBuilder) node(items []item) uint32 {
	key := make([]byte, 0, len(items)*5)
	for _, it := range items {
		flags := it.left
		key = binary.LittleEndian.AppendUint32(key, uint32(it.entry))
		key = append(key, flags, byte(b2i(it.unk)|b2i(it.vague)<<1))
	}
	if o, ok := b.memo[string(key)]; ok {
		return o
	}
	o := b.build(items)
	b.memo[string(key)] = o
	return o
}

func (b *treeBuilder) build(items []item) uint32 {
	var pending uint8
	for _, it := range items {
		pending |= it.left
	}
	pending &^= b.unsplit
	if len(items) <= LeafMax || pending == 0 {
		return b.leaf(items)
	}
	f, size := b.choose(items, pending)
	fd := &b.fields[f]
	// A split whose children, were they all leaves, would pass the budget
	// is not made: the tree stays bounded, its leaves longer.
	if len(b.tree)+fd.n+size > treeBudget {
		return b.leaf(items)
	}
	// The items that do not test f go under every eq; the others under
	// the eqs of their candidates.
	type at struct {
		i  int // into items
		st status
	}
	under := make([][]at, fd.n)
	var everywhere []int
	for i, it := range items {
		if it.left&(1<<f) == 0 {
			everywhere = append(everywhere, i)
			continue
		}
		for _, c := range fd.cands[it.entry] {
			under[c.eq] = append(under[c.eq], at{i, c.st})
		}
	}
	o := uint32(len(b.tree))
	b.tree = append(b.tree, make([]uint32, fd.n)...)
	for eq := range fd.n {
		child := make([]item, 0, len(everywhere)+len(under[eq]))
		for x, y := 0, 0; x < len(everywhere) || y < len(under[eq]); {
			if y == len(under[eq]) || (x < len(everywhere) && everywhere[x] < under[eq][y].i) {
				child = append(child, items[everywhere[x]])
				x++
				continue
			}
			it := items[under[eq][y].i]
			st := under[eq][y].st
			y++
			it.left &^= 1 << f
			switch st {
			case stUnknown:
				it.unk = true
			case stVague:
				it.vague = true
			}
			child = append(child, it)
		}
		b.tree[o+uint32(eq)] = b.node(b.normalize(child))
	}
	return uint32(f)<<abi.TreeKindShift | o
}

// choose picks the field to split items on: the one whose largest child is
// smallest, then whose children that are no leaves hold the fewest items,
// then whose children hold the fewest items in all.
// It also returns the items its children would hold in all.
func (b *treeBuilder) choose(items []item, pending uint8) (int, int) {
	best, bestMax, bestOpen, bestSum := -1, 0, 0, 0
	for f := range b.fields {
		if pending&(1<<f) == 0 {
			continue
		}
		fd := &b.fields[f]
		if cap(b.counts) < fd.n {
			b.counts = make([]int, fd.n)
		}
		counts := b.counts[:fd.n]
		clear(counts)
		everywhere, sum := 0, 0
		for _, it := range items {
			if it.left&(1<<f) == 0 {
				everywhere++
				continue
			}
			for _, c := range fd.cands[it.entry] {
				counts[c.eq]++
				sum++
			}
		}
		biggest := everywhere + slices.Max(counts)
		sum += everywhere * fd.n
		// The items of children that are no leaves yet: each takes more
		// nodes, of all their field's eqs a node.
		open := 0
		for _, n := range counts {
			if n+everywhere > LeafMax {
				open += n + everywhere
			}
		}
		if best < 0 || biggest < bestMax || (biggest == bestMax && (open < bestOpen || open == bestOpen && sum < bestSum)) {
			best, bestMax, bestOpen, bestSum = f, biggest, open, sum
		}
	}
	return best, bestSum
}

func (b *treeBuilder) leaf(items []item) uint32 {
	o := uint32(len(b.tree))
	b.tree = append(b.tree, uint32(len(items)))
	for _, it := range items {
		b.tree = append(b.tree, uint32(it.entry))
	}
	return abi.TreeLeaf<<abi.TreeKindShift | o
}

package compile

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/gcpace"
	"github.com/rampart-fw/rampart/internal/policy"
)

// buildV6 covers each list's merged ranges with the fewest prefixes (so
// adjacent and sibling entries of a list merge), gives every prefix the
// union of its own lists and those of every prefix containing it (so the
// longest match answers for all lists; a prefix adding nothing to its
// nearest ancestor is left out), and lays them out by /24 block: a prefix up
// to /24 sets the class of the blocks it covers (the longest wins), a longer
// one marks its length in its block's node and goes into the hash table of
// its length's kind. Blocks and prefixes go into cuckoo tables.
//
// The prefixes stream from the lists' ranges in address order and are
// never held all at once: a first pass counts them by kind, so each table's
// entries are allocated once (ten million prefixes are hundreds of MB).
func buildV6(t *Tables, c *classes, lists []*policy.List, masks []uint64, static []uint32, prefixes []netip.Prefix) {
	// nBlocks bounds the blocks of prefixes past /24: a list's prefixes
	// come in address order, so its blocks are counted once each (lists
	// that share blocks count them again); an inline prefix counts one.
	const noBlock = 1 << 24
	var nShort, nLong, nWide, nBlocks int
	last := uint32(noBlock)
	count := func(first policy.U128, length int) {
		if length <= 24 {
			nWide += 1 << (24 - length)
			return
		}
		if blk := uint32(first.Hi >> 40); blk != last {
			nBlocks, last = nBlocks+1, blk
		}
		if length <= 64 {
			nShort++
		} else {
			nLong++
		}
	}
	for _, l := range lists {
		last = noBlock
		for _, r := range l.V6 {
			policy.Cover(r.Lo, r.Hi, 128, count)
		}
	}
	for _, p := range prefixes {
		if p.Addr().Is6() {
			last = noBlock
			count(policy.U128Of(p.Addr()), p.Bits())
		}
	}
	if nShort+nLong+nWide == 0 {
		return
	}
	// GOGC at 10% (gcpace.Low says why): ten million /128s peak at 1.15
	// GB, against 1.5 GB at the default.
	defer gcpace.Low()()
	// Room for the tables: big ones are laid out in place.
	short, long := make([]abi.V6Slot, 0, tableSlots(nShort, quadShape)), make([]abi.V6LongSlot, 0, tableSlots(nLong, pairShape))
	// Prefixes past /24 come in address order, so their blocks do too: each
	// marks its length in the last block. A prefix up to /24 gives its class
	// to every block it covers, which its descendants come back to: those
	// marks are kept aside and merged in.
	// lens is allocated once: grown by append, its copies took 0.9 s of
	// ten million /128s' build. Without wide marks it is the blocks'
	// table, with the room to be laid out in place.
	room := nBlocks
	if nWide == 0 {
		room = tableSlots(nBlocks, pairShape)
	}
	lens := make([]abi.V6Block, 0, room)
	wide := make([]blockMark, 0, nWide)
	eachClosed(lists, masks, static, c.sets, prefixes, t.prefixParent, func(e entry6) {
		cls := c.class(member{e.mask, e.prefix, e.static})
		blk := uint32(e.first.Hi >> 40)
		if e.len <= 24 {
			for b := blk; b <= blk|(1<<(24-e.len)-1); b++ {
				wide = append(wide, blockMark{b, cls, e.len})
			}
			return
		}
		if n := len(lens); n == 0 || lens[n-1].Key != blk+1 {
			lens = append(lens, abi.V6Block{Key: blk + 1})
		}
		b := &lens[len(lens)-1]
		if e.len <= 64 {
			b.ShortLens |= 1 << (e.len - abi.V6ShortMin)
			short = append(short, abi.V6Slot{Key: e.first.Hi, Len: uint32(e.len), Cls: cls})
		} else {
			b.LongLens |= 1 << (e.len - abi.V6LongMin)
			long = append(long, abi.V6LongSlot{Hi: e.first.Hi, Lo: e.first.Lo, Len: uint32(e.len), Cls: cls})
		}
	})
	if t.releaseRanges { // before the tables are laid out, their peak
		for _, l := range lists {
			l.V6 = nil
		}
	}
	blocks := mergeBlocks(lens, wide)
	lens, wide = nil, nil
	t.V6HotLen = hotLength(short, long) // before the tables take the slices' memory
	t.V6Blocks, t.V6BlockMul = cuckooTable[abi.V6Bucket](blocks, func(s *abi.V6Block) uint32 { return s.Key }, pairShape)
	t.V6Short, t.V6ShortMul = cuckooTable[abi.V6ShortBucket](short, func(s *abi.V6Slot) uint32 { return digest6(s.Key, 0, s.Len) }, quadShape)
	t.V6Long, t.V6LongMul = cuckooTable[abi.V6LongBucket](long, func(s *abi.V6LongSlot) uint32 { return digest6(s.Hi, s.Lo, s.Len) }, pairShape)
}

// hotLength is the length most prefixes past /24 have.
func hotLength(short []abi.V6Slot, long []abi.V6LongSlot) uint32 {
	var count [129]int
	for _, s := range short {
		count[s.Len]++
	}
	for _, s := range long {
		count[s.Len]++
	}
	hot := 0
	for l, n := range count {
		if n > count[hot] {
			hot = l
		}
	}
	return uint32(hot)
}

// mergeBlocks gives the blocks of prefixes past /24 (in order) the classes
// of the prefixes up to /24 covering them, and adds the blocks those cover
// alone: the longest such prefix holding a block gives its class.
func mergeBlocks(lens []abi.V6Block, wide []blockMark) []abi.V6Block {
	if len(wide) == 0 {
		return lens // with its room: the table is laid out over it
	}
	slices.SortFunc(wide, func(a, b blockMark) int {
		if c := cmp.Compare(a.blk, b.blk); c != 0 {
			return c
		}
		return cmp.Compare(a.len, b.len)
	})
	blocks := make([]abi.V6Block, 0, tableSlots(len(lens)+len(wide), pairShape))
	for len(lens) > 0 || len(wide) > 0 {
		var b abi.V6Block
		switch {
		case len(wide) == 0 || len(lens) > 0 && lens[0].Key <= wide[0].blk+1:
			b, lens = lens[0], lens[1:]
		default:
			b.Key = wide[0].blk + 1
		}
		for len(wide) > 0 && wide[0].blk+1 == b.Key {
			b.Base, wide = wide[0].cls, wide[1:] // the longest comes last
		}
		blocks = append(blocks, b)
	}
	return blocks
}

// entry6 is a prefix (its first address and length), its list mask, the
// longest inline prefix holding it (its id, 0 for none) and its static
// lists' ways (a set of staticSets).
type entry6 struct {
	first  policy.U128
	len    uint8
	mask   uint64
	prefix uint32
	static uint32
}

func (e entry6) contains(a policy.U128) bool {
	return e.first.Cmp(a) <= 0 && a.Cmp(e.first.Or(policy.LowMask(128-int(e.len)))) <= 0
}

// blockMark is what one prefix says of one /24 block.
type blockMark struct {
	blk uint32
	cls uint32 // for a prefix up to /24: its class
	len uint8
}

// eachClosed calls emit for the lists' and inline prefixes' prefixes in
// address order, ancestors first, each with the union of its lists and its
// ancestors' and the longest inline prefix holding it (a prefix adding
// nothing to its nearest ancestor is left out), and notes each inline
// prefix's parent: a merge of the lists' covers, each in order already,
// with a stack of the prefixes containing the current one.
func eachClosed(lists []*policy.List, masks []uint64, static []uint32, sets *staticSets, prefixes []netip.Prefix, parent []uint32, emit func(entry6)) {
	var stack []entry6
	closed := func(e entry6) {
		for len(stack) > 0 && !stack[len(stack)-1].contains(e.first) {
			stack = stack[:len(stack)-1]
		}
		if len(stack) > 0 {
			up := stack[len(stack)-1]
			ways := sets.union(e.static, up.static)
			if e.mask|up.mask == up.mask && ways == up.static && e.prefix == 0 {
				return
			}
			e.mask |= up.mask
			e.static = ways
			if e.prefix == 0 {
				e.prefix = up.prefix
			} else {
				parent[e.prefix] = up.prefix
			}
		}
		stack = append(stack, e)
		emit(e)
	}
	var m coverMerge
	for i, l := range lists {
		s := &coverStream{rs: l.V6, mask: masks[i]}
		if static != nil && static[i] != 0 {
			s.static = sets.id([]uint32{static[i]})
		}
		m.add(s)
	}
	for i, p := range prefixes {
		if p.Addr().Is6() {
			m.add(&coverStream{rs: []policy.Range6{policy.PrefixRange6(p)}, prefix: uint32(i + 1)})
		}
	}
	cur, ok := m.next()
	for ok {
		// The same prefix from several lists: one prefix of their union.
		e, more := m.next()
		for more && e.first == cur.first && e.len == cur.len {
			cur.mask |= e.mask
			cur.static = sets.union(cur.static, e.static)
			cur.prefix = max(cur.prefix, e.prefix) // one inline prefix at most
			e, more = m.next()
		}
		closed(cur)
		cur, ok = e, more
	}
}

// coverStream is one list's cover, a prefix at a time.
type coverStream struct {
	rs     []policy.Range6 // the ranges left; the first starts at lo
	lo     policy.U128
	mask   uint64
	prefix uint32
	static uint32
	head   entry6 // the prefix next() gave last
}

func (s *coverStream) next() bool {
	if len(s.rs) == 0 {
		return false
	}
	if s.lo.Cmp(s.rs[0].Lo) < 0 {
		s.lo = s.rs[0].Lo
	}
	length, last := policy.CoverStep(s.lo, s.rs[0].Hi, 128)
	s.head = entry6{s.lo, uint8(length), s.mask, s.prefix, s.static}
	if last.Cmp(s.rs[0].Hi) >= 0 {
		s.rs = s.rs[1:]
	} else {
		s.lo = last.Add1()
	}
	return true
}

// coverMerge merges cover streams into one in address order, shorter
// first: a binary heap of the streams by their heads.
type coverMerge struct{ heap []*coverStream }

func (m *coverMerge) add(s *coverStream) {
	if !s.next() {
		return
	}
	m.heap = append(m.heap, s)
	for i := len(m.heap) - 1; i > 0 && m.less(i, (i-1)/2); i = (i - 1) / 2 {
		m.heap[i], m.heap[(i-1)/2] = m.heap[(i-1)/2], m.heap[i]
	}
}

func (m *coverMerge) less(i, j int) bool {
	a, b := m.heap[i].head, m.heap[j].head
	if c := a.first.Cmp(b.first); c != 0 {
		return c < 0
	}
	return a.len < b.len
}

// next is the least head, the stream it came from moving on.
func (m *coverMerge) next() (entry6, bool) {
	if len(m.heap) == 0 {
		return entry6{}, false
	}
	e := m.heap[0].head
	if !m.heap[0].next() {
		m.heap[0] = m.heap[len(m.heap)-1]
		m.heap = m.heap[:len(m.heap)-1]
	}
	for i := 0; ; { // sift the new top down
		least := i
		if c := 2*i + 1; c < len(m.heap) && m.less(c, least) {
			least = c
		}
		if c := 2*i + 2; c < len(m.heap) && m.less(c, least) {
			least = c
		}
		if least == i {
			return e, true
		}
		m.heap[i], m.heap[least] = m.heap[least], m.heap[i]
		i = least
	}
}

// digest6 is bpf/lists.h's v6_digest: the two must agree bit for bit.
func digest6(hi, lo uint64, length uint32) uint32 {
	h := hi * 0x9e3779b97f4a7c15
	h ^= lo + uint64(length)
	h = (h ^ h>>29) * 0xbf58476d1ce4e5b9
	return uint32(h ^ h>>32)
}

func key6(p netip.Prefix) abi.LPMKeyV6 {
	p = p.Masked() // the overlay's hash tables are keyed by masked prefixes
	return abi.LPMKeyV6{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As16()}
}

func key4(p netip.Prefix) abi.LPMKeyV4 {
	p = p.Masked()
	return abi.LPMKeyV4{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As4()}
}

// Overlay turns in-place ops into overlay entries: for every op prefix, per
// list, the latest op whose prefix contains it sets or clears the list's
// bit. Ops on lists without a bit (not in this policy, or static) are
// ignored.
func Overlay(bits map[string]uint64, ops []policy.ListOp) (v4 []OverlayEntry[abi.LPMKeyV4], v6 []OverlayEntry[abi.LPMKeyV6]) {
	type node struct {
		p      netip.Prefix
		latest map[string]int // list -> index of its latest op covering p
	}
	idx := make([]int, 0, len(ops))
	for i, op := range ops {
		if bits[op.List] != 0 { // a static list takes none (engine refuses them)
			idx = append(idx, i)
		}
	}
	slices.SortStableFunc(idx, func(a, b int) int { return policy.ComparePrefix(ops[a].Prefix, ops[b].Prefix) })
	var stack []node
	for k := 0; k < len(idx); {
		p := ops[idx[k]].Prefix
		for len(stack) > 0 && !stack[len(stack)-1].p.Contains(p.Addr()) {
			stack = stack[:len(stack)-1]
		}
		n := node{p: p, latest: map[string]int{}}
		if len(stack) > 0 {
			for l, i := range stack[len(stack)-1].latest {
				n.latest[l] = i
			}
		}
		for ; k < len(idx) && ops[idx[k]].Prefix == p; k++ {
			i := idx[k]
			if j, ok := n.latest[ops[i].List]; !ok || i > j {
				n.latest[ops[i].List] = i
			}
		}
		stack = append(stack, n)
		var o abi.Overlay
		for l, i := range n.latest {
			if ops[i].Add {
				o.Set |= bits[l]
			} else {
				o.Clear |= bits[l]
			}
		}
		if p.Addr().Is4() {
			v4 = append(v4, OverlayEntry[abi.LPMKeyV4]{Key: key4(p), Overlay: o})
		} else {
			v6 = append(v6, OverlayEntry[abi.LPMKeyV6]{Key: key6(p), Overlay: o})
		}
	}
	return v4, v6
}

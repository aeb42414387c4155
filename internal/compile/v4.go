package compile

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/policy"
)

// classes numbers the distinct memberships both families meet; class 0 is
// "in no list".
type classes struct {
	t    *Tables
	of   map[member]uint32
	sets *staticSets
	// The last membership asked for: lists alternate between a few.
	last      member
	lastClass uint32
}

// member is a membership: the lists' mask, the longest inline prefix
// holding the addresses (its id; 0 for none), and the static lists'
// ways (a set of staticSets).
type member struct {
	mask   uint64
	prefix uint32
	static uint32
}

// ClassUnmasked is the top bit of a class's mask, no list's (abi.MaxLists
// bits are theirs): the class is inside an inline prefix or in static
// lists, which the mask does not say, so that no eqs the overlay's masks
// are given (mask_eqs) can be its own: an address of it the overlay
// changes is judged under EQ_ANY, by the leaves.
const ClassUnmasked = uint64(1) << abi.MaxLists

func newClasses(t *Tables) *classes {
	t.Classes, t.classPrefix, t.classStatic = []uint64{0}, []uint32{0}, []uint32{0}
	return &classes{t: t, of: map[member]uint32{{}: 0}, sets: newStaticSets()}
}

func (c *classes) class(m member) uint32 {
	switch m {
	case member{}: // a list's gaps, every other segment of a host list
		return 0
	case c.last:
		return c.lastClass
	}
	id, ok := c.of[m]
	if !ok {
		id = uint32(len(c.t.Classes))
		c.of[m] = id
		mask := m.mask
		if m.prefix != 0 || m.static != 0 {
			mask |= ClassUnmasked
		}
		c.t.Classes = append(c.t.Classes, mask)
		c.t.classPrefix = append(c.t.classPrefix, m.prefix)
		c.t.classStatic = append(c.t.classStatic, m.static)
	}
	c.last, c.lastClass = m, id
	return id
}

// buildV4 sweeps the lists' IPv4 ranges in address order into segments of
// equal membership (the inline prefixes' segments merged in) and lays them
// out per /24 block (bpf/common.h): a block
// in one class is a CLASS entry; a block with at most V4_INLINE addresses
// of a second class an INLINE entry, the common case of host lists; any
// other pattern of two classes a dense block (a bitmap in a table of its
// own, read beside the blocks'), of more a tbl8. Overlapping and
// duplicate ranges, nested allow/deny lists and adjacency all come out of
// the sweep merged. A /16 wholly in one class is one wide block. The
// blocks then go into the cuckoo hashes.
func buildV4(t *Tables, c *classes, lists []*policy.List, bits []uint64, static []uint32, prefixes []netip.Prefix) {
	segs := prefixSegments4(prefixes, t.prefixParent)
	ranges := 0
	for _, p := range prefixes {
		ranges += b2i(p.Addr().Is4())
	}
	for _, l := range lists {
		ranges += len(l.V4)
	}
	if ranges == 0 {
		return
	}
	b := v4Builder{t: t, c: c, blk: -1, pieces: make([]piece, 0, 256)}
	// A block per range, about, for lists of hosts, with the room for
	// their cuckoo table to be laid out in place; grown by doubling, a
	// million blocks would be copied twenty times over.
	b.blocks = make([]abi.V4Block, 0, tableSlots(min(ranges, abi.V4Blocks), quadShape))
	sweep := sweepV4
	if len(lists) >= heapSweepLists || slices.ContainsFunc(static, func(w uint32) bool { return w != 0 }) {
		sweep = func(lists []*policy.List, bits []uint64, emit func(lo, hi uint32, mask uint64, static uint32)) {
			sweepV4Ways(lists, bits, static, c.sets, emit)
		}
	}
	sweep(lists, bits, func(lo, hi uint32, mask uint64, static uint32) {
		for {
			for segs[0].hi < lo {
				segs = segs[1:]
			}
			end := min(hi, segs[0].hi)
			b.segment(lo, end, member{mask, segs[0].id, static})
			if end == hi {
				return
			}
			lo = end + 1
		}
	})
	b.flush()
	if t.releaseRanges {
		for _, l := range lists {
			l.V4 = nil
		}
	}
	b.fillTbl8s()
	key := func(s *abi.V4Block) uint32 { return s.Key }
	t.V4Blocks, t.V4BlockMul = cuckooTable[abi.V4Bucket](b.blocks, key, quadShape)
	t.V4Wide, t.V4WideMul = cuckooTable[abi.V4Bucket](b.wide, key, quadShape)
	t.V4Dense, t.V4DenseMul = cuckooTable[abi.V4DenseBucket](b.dense, func(s *abi.V4Dense) uint32 { return s.Key }, denseShape)
}

// prefixSegment is a segment of IPv4 addresses, from the end of the one
// before to hi, and the longest inline prefix holding it.
type prefixSegment struct {
	hi, id uint32
}

// prefixSegments4 cuts the IPv4 addresses into segments by the longest of
// the IPv4 prefixes (id i+1 for prefixes[i]; distinct) holding them: a
// sweep of the prefixes in address order, longer after shorter, with a
// stack of those holding the current one, whose top is each one's parent.
func prefixSegments4(prefixes []netip.Prefix, parent []uint32) []prefixSegment {
	type span struct {
		lo, hi uint64
		id     uint32
	}
	var spans []span
	for i, p := range prefixes {
		if p.Addr().Is4() {
			lo := uint64(policy.V4ToUint(p.Addr()))
			spans = append(spans, span{lo, lo | (1<<(32-p.Bits()) - 1), uint32(i + 1)})
		}
	}
	slices.SortFunc(spans, func(a, b span) int {
		if c := cmp.Compare(a.lo, b.lo); c != 0 {
			return c
		}
		return cmp.Compare(b.hi, a.hi)
	})
	var out []prefixSegment
	var stack []span
	pos := uint64(0)             // the first address not in out
	until := func(next uint64) { // out gets [pos, next) in the innermost
		if next > pos {
			var id uint32
			if len(stack) > 0 {
				id = stack[len(stack)-1].id
			}
			out = append(out, prefixSegment{uint32(next - 1), id})
			pos = next
		}
	}
	for _, s := range spans {
		for len(stack) > 0 && stack[len(stack)-1].hi < s.lo {
			until(stack[len(stack)-1].hi + 1)
			stack = stack[:len(stack)-1]
		}
		until(s.lo)
		if len(stack) > 0 {
			parent[s.id] = stack[len(stack)-1].id
		}
		stack = append(stack, s)
	}
	for len(stack) > 0 {
		until(stack[len(stack)-1].hi + 1)
		stack = stack[:len(stack)-1]
	}
	until(1 << 32)
	return out
}

// heapSweepLists is how many lists make sweepV4Ways the faster sweep:
// sweepV4 steps every list at every segment. A million random ranges
// spread over 4 lists took 26 ms in sweepV4 against 41 in sweepV4Ways, over
// 8 lists 55 against 35, over 63 lists 403 against 71
// (BenchmarkSweepV4).
const heapSweepLists = 8

// sweepV4 calls emit for consecutive address segments [lo, hi] whose list
// mask differs from the previous segment's; addresses in no list are mask 0.
func sweepV4(lists []*policy.List, bits []uint64, emit func(lo, hi uint32, mask uint64, static uint32)) {
	next := make([]int, len(lists)) // per list, the first range not yet behind pos
	var pos uint64
	for pos <= 0xffffffff {
		var mask uint64
		end := uint64(1) << 32 // first address past the segment
		for i, l := range lists {
			rs := l.V4
			for next[i] < len(rs) && uint64(rs[next[i]].Hi) < pos {
				next[i]++
			}
			if next[i] == len(rs) {
				continue
			}
			r := rs[next[i]]
			if uint64(r.Lo) <= pos {
				mask |= bits[i]
				end = min(end, uint64(r.Hi)+1)
			} else {
				end = min(end, uint64(r.Lo))
			}
		}
		emit(uint32(pos), uint32(end-1), mask, 0)
		pos = end
	}
}

// sweepV4Ways is sweepV4 for lists of static ways too (static[i], 0 for
// a list with a bit), which have no bit to OR, and for many lists: it
// merges the lists' range bounds in address order through a heap, keeping
// the ways the current address is in, so that it costs the bounds (times
// the log of the lists), not lists times segments.
func sweepV4Ways(lists []*policy.List, bits []uint64, static []uint32, sets *staticSets, emit func(lo, hi uint32, mask uint64, static uint32)) {
	var h boundHeap
	next := make([]int, len(lists)) // per list, its range being entered or left
	inside := make([]bool, len(lists))
	for i, l := range lists {
		if len(l.V4) > 0 {
			h = append(h, bound{uint64(l.V4[0].Lo), i})
		}
	}
	h.init()
	var mask uint64
	var ways []uint32 // sorted
	for pos := uint64(0); pos <= 0xffffffff; {
		for len(h) > 0 && h[0].at == pos {
			i := h[0].list
			r := lists[i].V4[next[i]]
			w := static[i]
			if inside[i] = !inside[i]; inside[i] {
				mask |= bits[i]
				if w != 0 {
					k, _ := slices.BinarySearch(ways, w)
					ways = slices.Insert(ways, k, w)
				}
				h.replaceTop(uint64(r.Hi) + 1)
				continue
			}
			mask &^= bits[i]
			if w != 0 {
				k, _ := slices.BinarySearch(ways, w)
				ways = slices.Delete(ways, k, k+1)
			}
			if next[i]++; next[i] < len(lists[i].V4) {
				h.replaceTop(uint64(lists[i].V4[next[i]].Lo))
			} else {
				h.popTop()
			}
		}
		end := uint64(1) << 32
		if len(h) > 0 {
			end = h[0].at
		}
		emit(uint32(pos), uint32(end-1), mask, sets.id(ways))
		pos = end
	}
}

// bound is a list's next range bound: its range's first address, or the
// one past its last.
type bound struct {
	at   uint64
	list int
}

// boundHeap is a binary min-heap of bounds by address. A list leaving its
// top bound mostly has another, which replaces the top in one sift
// (container/heap's Pop then Push take two, through an interface).
type boundHeap []bound

func (h boundHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h boundHeap) replaceTop(at uint64) {
	h[0].at = at
	h.down(0)
}

func (h *boundHeap) popTop() {
	old := *h
	old[0] = old[len(old)-1]
	*h = old[:len(old)-1]
	h.down(0)
}

func (h boundHeap) down(i int) {
	for {
		least, l := i, 2*i+1
		if l < len(h) && h[l].at < h[least].at {
			least = l
		}
		if r := l + 1; r < len(h) && h[r].at < h[least].at {
			least = r
		}
		if least == i {
			return
		}
		h[i], h[least] = h[least], h[i]
		i = least
	}
}

type v4Builder struct {
	t      *Tables
	c      *classes
	blocks []abi.V4Block // blocks holding anything, in order
	wide   []abi.V4Block // /16s wholly in one class, instead of their blocks
	dense  []abi.V4Dense // blocks of two classes in a bitmap, instead of blocks
	blk    int64         // the block being assembled from pieces, or -1
	pieces []piece       // its pieces, in address order
	// The tbl8s' pieces, laid out by fillTbl8s: tbl8s[i] is where tbl8
	// i's start in tbl8Pieces.
	tbl8s      []int
	tbl8Pieces []piece
}

// piece is the addresses .lo to .hi of a block, all in one class.
type piece struct {
	lo, hi uint8
	cls    uint32
}

func (b *v4Builder) add(blk uint32, entry uint64) {
	b.blocks = append(b.blocks, abi.V4Block{Key: blk + 1, Entry: entry})
}

func (b *v4Builder) segment(lo, hi uint32, m member) {
	c := b.c.class(m)
	for {
		blk := int64(lo >> 8)
		if lo&0xff == 0 && (hi>>8 > lo>>8 || hi&0xff == 0xff) {
			// Whole blocks: one CLASS entry each, after the partial
			// block before them.
			b.flush()
			last := int64(hi >> 8)
			if hi&0xff != 0xff {
				last--
			}
			if c != 0 {
				for k := blk; k <= last; {
					if k&0xff == 0 && k+0xff <= last {
						// A whole /16.
						b.wide = append(b.wide, abi.V4Block{Key: uint32(k>>8) + 1, Entry: abi.V4EClass<<abi.V4ETypeShift | uint64(c)})
						k += 0x100
						continue
					}
					b.add(uint32(k), abi.V4EClass<<abi.V4ETypeShift|uint64(c))
					k++
				}
			}
			if last == 0xffffff {
				return
			}
			lo = uint32(last+1) << 8
		} else {
			// Part of a block.
			if blk != b.blk {
				b.flush()
				b.blk = blk
			}
			end := min(hi, uint32(blk)<<8|0xff)
			b.pieces = append(b.pieces, piece{uint8(lo), uint8(end), c})
			if end == hi {
				return
			}
			lo = end + 1
		}
		if lo > hi {
			return
		}
	}
}

// flush stores the assembled block.
func (b *v4Builder) flush() {
	if b.blk < 0 {
		return
	}
	defer func() { b.blk, b.pieces = -1, b.pieces[:0] }()
	ps := b.pieces
	var size [2]int // addresses in the block's first two classes
	cls := [2]uint32{ps[0].cls, ps[0].cls}
	n := 1
	for _, p := range ps {
		switch {
		case p.cls == cls[0]:
			size[0] += int(p.hi-p.lo) + 1
		case n == 1 || p.cls == cls[1]:
			cls[1], n = p.cls, max(n, 2)
			size[1] += int(p.hi-p.lo) + 1
		default:
			n = 3
		}
	}
	blk := uint32(b.blk)
	switch {
	case n == 1:
		if cls[0] != 0 {
			b.add(blk, abi.V4EClass<<abi.V4ETypeShift|uint64(cls[0]))
		}
	case n == 2:
		base, hit := cls[0], cls[1]
		if size[0] < size[1] {
			base, hit = hit, base
		}
		if min(size[0], size[1]) <= abi.V4Inline && max(base, hit) < 1<<abi.V4InlineClassBits {
			entry, octets := inline(ps, base, hit)
			b.blocks = append(b.blocks, abi.V4Block{Key: blk + 1, Octets: octets, Entry: entry})
			return
		}
		d := abi.V4Dense{Key: blk + 1, Base: base, Hit: hit}
		for _, p := range ps {
			if p.cls == hit {
				setBits(&d.Bits, int(p.lo), int(p.hi))
			}
		}
		b.dense = append(b.dense, d)
	default:
		if entry, octets, ok := pairs(ps); ok {
			b.blocks = append(b.blocks, abi.V4Block{Key: blk + 1, Octets: octets, Entry: entry})
			return
		}
		b.add(blk, abi.V4ETbl8<<abi.V4ETypeShift|uint64(len(b.tbl8s)))
		b.tbl8s = append(b.tbl8s, len(b.tbl8Pieces))
		b.tbl8Pieces = append(b.tbl8Pieces, ps...)
	}
}

// fillTbl8s lays out the tbl8s from their pieces, once their number is
// known: a tbl8 is 1 KiB, and an array of them grown by appends was copied
// over and over (90,000 of them, from 32 lists of 60,000 random hosts,
// spent half the compile in memmove).
func (b *v4Builder) fillTbl8s() {
	b.t.V4Tbl8s = make([]abi.V4Tbl8, len(b.tbl8s))
	for i, first := range b.tbl8s {
		end := len(b.tbl8Pieces)
		if i+1 < len(b.tbl8s) {
			end = b.tbl8s[i+1]
		}
		t8 := &b.t.V4Tbl8s[i]
		for _, p := range b.tbl8Pieces[first:end] {
			for a := int(p.lo); a <= int(p.hi); a++ {
				t8.Cls[a] = p.cls
			}
		}
	}
}

// inline packs a block with at most V4_INLINE addresses of class hit into
// an entry and the slot's octets: the classes and the addresses' last
// octets, unused octets repeating the first (bpf/lists.h matches any).
func inline(ps []piece, base, hit uint32) (entry uint64, more uint32) {
	var octets [abi.V4Inline]uint8
	n := 0
	for _, p := range ps {
		if p.cls == hit {
			for a := int(p.lo); a <= int(p.hi); a++ {
				octets[n] = uint8(a)
				n++
			}
		}
	}
	var packed uint64
	for i := range octets {
		o := octets[0]
		if i < n {
			o = octets[i]
		}
		packed |= uint64(o) << (8 * i)
	}
	return abi.V4EInline<<abi.V4ETypeShift | (packed&0xffffffff)<<abi.V4EOctetsShift | uint64(hit)<<abi.V4EHitShift | uint64(base), uint32(packed >> 32)
}

// pairs packs a block of at most V4Pairs addresses outside its largest
// class into a PAIRS entry and the slot's octets: the largest class, then
// each address's last octet and class (unused pairs repeat the first).
// ok is false for more addresses, or classes past the entry's bits.
func pairs(ps []piece) (entry uint64, more uint32, ok bool) {
	type class struct {
		cls  uint32
		size int
	}
	var cs []class
	for _, p := range ps {
		i := slices.IndexFunc(cs, func(c class) bool { return c.cls == p.cls })
		if i < 0 {
			i, cs = len(cs), append(cs, class{cls: p.cls})
		}
		cs[i].size += int(p.hi-p.lo) + 1
	}
	base := slices.MaxFunc(cs, func(a, b class) int { return cmp.Compare(a.size, b.size) })
	if 256-base.size > abi.V4Pairs || slices.ContainsFunc(cs, func(c class) bool { return c.cls >= 1<<abi.V4InlineClassBits }) {
		return 0, 0, false
	}
	var packed [abi.V4Pairs]uint64
	n := 0
	for _, p := range ps {
		for a := int(p.lo); a <= int(p.hi) && p.cls != base.cls; a++ {
			packed[n] = uint64(p.cls)<<8 | uint64(a)
			n++
		}
	}
	for i := n; i < abi.V4Pairs; i++ {
		packed[i] = packed[0]
	}
	entry = abi.V4EPairs<<abi.V4ETypeShift | packed[1]<<(abi.V4EPairsShift+abi.V4PairBits) | packed[0]<<abi.V4EPairsShift | uint64(base.cls)
	return entry, uint32(packed[2]), true
}

// setBits sets bits lo to hi (inclusive) of a 256-bit bitmap.
func setBits(bits *[4]uint64, lo, hi int) {
	for lo <= hi {
		w, end := lo>>6, min(hi, lo|63)
		n := end - lo + 1
		m := ^uint64(0)
		if n < 64 {
			m = (uint64(1)<<n - 1) << (lo & 63)
		}
		bits[w] |= m
		lo = end + 1
	}
}

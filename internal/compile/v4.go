package compile

import (
	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/policy"
)

// classes numbers the distinct list masks both families meet; class 0 is
// "in no list".
type classes struct {
	t  *Tables
	of map[uint64]uint32
	// The last mask asked for: lists alternate between a few masks.
	lastMask  uint64
	lastClass uint32
}

func newClasses(t *Tables) *classes {
	t.Classes = []uint64{0}
	return &classes{t: t, of: map[uint64]uint32{0: 0}}
}

func (c *classes) class(mask uint64) uint32 {
	if mask == c.lastMask {
		return c.lastClass
	}
	id, ok := c.of[mask]
	if !ok {
		id = uint32(len(c.t.Classes))
		c.of[mask] = id
		c.t.Classes = append(c.t.Classes, mask)
	}
	c.lastMask, c.lastClass = mask, id
	return id
}

// buildV4 sweeps the lists' IPv4 ranges in address order into segments of
// equal membership and lays them out per /24 block (bpf/common.h): a block
// in one class is a CLASS entry; a block with at most V4_INLINE addresses
// of a second class an INLINE entry, the common case of host lists; any
// other pattern of two classes a bitmap, of more a tbl8. Overlapping and
// duplicate ranges, nested allow/deny lists and adjacency all come out of
// the sweep merged. A /16 wholly in one class is one wide block. The
// blocks then go into the cuckoo hashes.
func buildV4(t *Tables, c *classes, lists []*policy.List, bits []uint64) {
	ranges := 0
	for _, l := range lists {
		ranges += len(l.V4)
	}
	if ranges == 0 {
		return
	}
	b := v4Builder{t: t, c: c, blk: -1, pieces: make([]piece, 0, 256)}
	b.blocks = make([]abi.V4Block, 0, min(ranges, 1<<16))
	sweepV4(lists, bits, b.segment)
	b.flush()
	key := func(s *abi.V4Block) uint32 { return s.Key }
	t.V4Blocks, t.V4BlockMul = cuckooTable[abi.V4Bucket](b.blocks, key, quadShape)
	t.V4Wide, t.V4WideMul = cuckooTable[abi.V4Bucket](b.wide, key, quadShape)
}

// sweepV4 calls emit for consecutive address segments [lo, hi] whose list
// mask differs from the previous segment's; addresses in no list are mask 0.
func sweepV4(lists []*policy.List, bits []uint64, emit func(lo, hi uint32, mask uint64)) {
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
		emit(uint32(pos), uint32(end-1), mask)
		pos = end
	}
}

type v4Builder struct {
	t      *Tables
	c      *classes
	blocks []abi.V4Block // blocks holding anything, in order
	wide   []abi.V4Block // /16s wholly in one class, instead of their blocks
	blk    int64         // the block being assembled from pieces, or -1
	pieces []piece       // its pieces, in address order
}

// piece is the addresses .lo to .hi of a block, all in one class.
type piece struct {
	lo, hi uint8
	cls    uint32
}

func (b *v4Builder) add(blk uint32, entry uint64) {
	b.blocks = append(b.blocks, abi.V4Block{Key: blk + 1, Entry: entry})
}

func (b *v4Builder) segment(lo, hi uint32, mask uint64) {
	c := b.c.class(mask)
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
		bm := abi.V4Bitmap{Base: uint16(base), Hit: uint16(hit)}
		for _, p := range ps {
			if p.cls == hit {
				setBits(&bm.Bits, int(p.lo), int(p.hi))
			}
		}
		b.add(blk, abi.V4EBitmap<<abi.V4ETypeShift|uint64(len(b.t.V4Bitmaps)))
		b.t.V4Bitmaps = append(b.t.V4Bitmaps, bm)
	default:
		var t8 abi.V4Tbl8
		for _, p := range ps {
			for a := int(p.lo); a <= int(p.hi); a++ {
				t8.Cls[a] = uint16(p.cls)
			}
		}
		b.add(blk, abi.V4ETbl8<<abi.V4ETypeShift|uint64(len(b.t.V4Tbl8s)))
		b.t.V4Tbl8s = append(b.t.V4Tbl8s, t8)
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

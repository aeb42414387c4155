package compile

import (
	"slices"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/policy"
)

// buildV4 sweeps the lists' IPv4 ranges in address order into segments of
// equal membership, and lays the segments out as a DIR-24-8 table: one entry
// per /24 block, and a second stage only for blocks that hold more than one
// membership. Overlapping and duplicate prefixes, nested allow/deny lists
// and adjacent ranges all come out of the sweep merged.
func buildV4(t *Tables, lists []*policy.List, bits []uint64) {
	ranges := 0
	for _, l := range lists {
		ranges += len(l.V4)
	}
	if ranges == 0 {
		return // no 64 MiB scratch table for a policy without IPv4 lists
	}
	b := v4Builder{t: t, classOf: map[uint64]uint32{0: 0}, blk: -1, pieces: make([]piece, 0, 256)}
	t.V4Classes = []uint64{0}
	t.V4Tbl24 = make([]uint32, abi.V4Blocks)
	// A block is split only where a range starts or ends inside it; room
	// reserved but never touched costs no memory.
	t.V4Bitmaps = make([]abi.V4Bitmap, 0, min(2*ranges, abi.V4Blocks))
	sweepV4(lists, bits, b.segment)
	b.flush()
	compress(t)
}

// compress keeps the entries of listed blocks only, and the bitmap and
// ranks that find them.
func compress(t *Tables) {
	full := t.V4Tbl24
	last := len(full)
	for last > 0 && full[last-1] == 0 {
		last--
	}
	t.V4Present = make([]uint64, (last+63)/64)
	t.V4Rank = make([]uint64, len(t.V4Present))
	dense := full[:0] // overwrites full behind the reading position
	for blk, e := range full[:last] {
		if blk&63 == 0 {
			t.V4Rank[blk>>6] = uint64(len(dense))
		}
		if e != 0 {
			t.V4Present[blk>>6] |= 1 << (blk & 63)
			dense = append(dense, e)
		}
	}
	t.V4Tbl24 = slices.Clip(dense)
	if len(dense) == 0 {
		t.V4Tbl24 = nil
	}
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
	t       *Tables
	classOf map[uint64]uint32
	blk     int64   // the block being assembled from pieces, or -1
	pieces  []piece // its pieces, in address order
	// The last mask seen: lists alternate between a few masks.
	lastMask  uint64
	lastClass uint32
}

// piece is the addresses .lo to .hi of a block, all in one class.
type piece struct {
	lo, hi uint8
	cls    uint32
}

func (b *v4Builder) class(mask uint64) uint32 {
	if mask == b.lastMask {
		return b.lastClass
	}
	c, ok := b.classOf[mask]
	if !ok {
		c = uint32(len(b.t.V4Classes))
		b.classOf[mask] = c
		b.t.V4Classes = append(b.t.V4Classes, mask)
	}
	b.lastMask, b.lastClass = mask, c
	return c
}

func (b *v4Builder) segment(lo, hi uint32, mask uint64) {
	c := b.class(mask)
	for {
		blk := int64(lo >> 8)
		if lo&0xff == 0 && (hi>>8 > lo>>8 || hi&0xff == 0xff) {
			// Whole blocks: one entry each.
			last := int64(hi >> 8)
			if hi&0xff != 0xff {
				last--
			}
			if c != 0 {
				for k := blk; k <= last; k++ {
					b.t.V4Tbl24[k] = c
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

// flush stores the assembled block: a bitmap when it holds two classes, a
// tbl8 otherwise.
func (b *v4Builder) flush() {
	if b.blk < 0 {
		return
	}
	ps := b.pieces
	base, hit, n := ps[0].cls, ps[0].cls, 1
	for _, p := range ps {
		if p.cls != base && p.cls != hit {
			hit = p.cls
			n++
		}
	}
	switch {
	case n == 1:
		b.t.V4Tbl24[b.blk] = base
	case n == 2:
		bm := abi.V4Bitmap{Base: uint16(base), Hit: uint16(hit)}
		for _, p := range ps {
			if p.cls == hit {
				setBits(&bm.Bits, int(p.lo), int(p.hi))
			}
		}
		b.t.V4Tbl24[b.blk] = abi.V4Split | uint32(len(b.t.V4Bitmaps))
		b.t.V4Bitmaps = append(b.t.V4Bitmaps, bm)
	default:
		var t8 abi.V4Tbl8
		for _, p := range ps {
			for a := int(p.lo); a <= int(p.hi); a++ {
				t8.Cls[a] = uint16(p.cls)
			}
		}
		b.t.V4Tbl24[b.blk] = abi.V4Split | abi.V4Tbl8Flag | uint32(len(b.t.V4Tbl8s))
		b.t.V4Tbl8s = append(b.t.V4Tbl8s, t8)
	}
	b.blk = -1
	b.pieces = b.pieces[:0]
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

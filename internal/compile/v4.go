package compile

import (
	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/policy"
)

// buildV4 sweeps the lists' IPv4 ranges in address order into segments of
// equal membership, and lays the segments out as a DIR-24-8 table: one entry
// per /24 block, and a second stage only for blocks that hold more than one
// membership. Overlapping and duplicate prefixes, nested allow/deny lists
// and adjacent ranges all come out of the sweep merged.
func buildV4(t *datapath.Tables, lists []*policy.List, bits []uint64) {
	b := v4Builder{t: t, classOf: map[uint64]uint32{0: 0}, blk: -1}
	t.V4Classes = []uint64{0}
	t.V4Tbl24 = make([]uint32, datapath.V4Blocks)
	sweepV4(lists, bits, b.segment)
	b.flush()
	last := len(t.V4Tbl24)
	for last > 0 && t.V4Tbl24[last-1] == 0 {
		last--
	}
	t.V4Tbl24 = t.V4Tbl24[:last]
	if last == 0 {
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
	t       *datapath.Tables
	classOf map[uint64]uint32
	blk     int64       // the block being painted address by address, or -1
	cls     [256]uint32 // its classes
}

func (b *v4Builder) class(mask uint64) uint32 {
	c, ok := b.classOf[mask]
	if !ok {
		c = uint32(len(b.t.V4Classes))
		b.classOf[mask] = c
		b.t.V4Classes = append(b.t.V4Classes, mask)
	}
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
			// Part of a block: paint its addresses.
			if blk != b.blk {
				b.flush()
				b.blk = blk
			}
			end := min(hi, uint32(blk)<<8|0xff)
			for a := lo; ; a++ {
				b.cls[a&0xff] = c
				if a == end {
					break
				}
			}
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

// flush stores the painted block: a bitmap when it holds two classes, a
// tbl8 otherwise.
func (b *v4Builder) flush() {
	if b.blk < 0 {
		return
	}
	base, hit, n := b.cls[0], b.cls[0], 1
	for _, c := range b.cls {
		if c != base && c != hit {
			hit = c
			n++
		}
	}
	switch {
	case n == 1:
		b.t.V4Tbl24[b.blk] = base
	case n == 2:
		bm := datapath.V4Bitmap{Base: uint16(base), Hit: uint16(hit)}
		for i, c := range b.cls {
			if c == hit {
				bm.Bits[i>>6] |= 1 << (i & 63)
			}
		}
		b.t.V4Tbl24[b.blk] = datapath.V4Split | uint32(len(b.t.V4Bitmaps))
		b.t.V4Bitmaps = append(b.t.V4Bitmaps, bm)
	default:
		var t8 datapath.V4Tbl8
		for i, c := range b.cls {
			t8.Cls[i] = uint16(c)
		}
		b.t.V4Tbl24[b.blk] = datapath.V4Split | datapath.V4Tbl8Flag | uint32(len(b.t.V4Tbl8s))
		b.t.V4Tbl8s = append(b.t.V4Tbl8s, t8)
	}
	b.blk = -1
}

package compile

import (
	"math/bits"
	"net/netip"
	"unsafe"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/policy"
)

// Read is one read a lookup makes: a table and the byte offset in it. A
// lookup's reads depend each on the one before, unless Parallel: then it is
// issued together with the one before.
type Read struct {
	Table    string
	Offset   uint64
	Parallel bool
}

// Lookup finds the lists holding an address in the tables step for step as
// bpf/lists.h does (the overlay aside), appending each read to reads when
// reads is not nil.
func (t *Tables) Lookup(a netip.Addr, reads *[]Read) uint64 {
	read := func(table string, index, size int) {
		if reads != nil {
			*reads = append(*reads, Read{Table: table, Offset: uint64(index) * uint64(size)})
		}
	}
	var cls uint32
	if a.Is4() {
		cls = t.class4(policy.V4ToUint(a), reads, read)
	} else {
		cls = t.class6(policy.U128Of(a), reads)
	}
	read("classes", int(cls), 8)
	if int(cls) >= len(t.Classes) {
		return 0
	}
	return t.Classes[cls]
}

// cuckooFind is bpf/lists.h's CUCKOO_FIND: the slot of either of the
// digest's buckets (read together) for which match holds, or nil. The
// first read is parallel to the one before when parallel is set.
func cuckooFind[B, S any](table []B, mul [2]uint64, local bool, digest uint32, name string, reads *[]Read, parallel bool,
	slots func(*B) []S, match func(*S) bool) *S {
	if len(table) == 0 {
		return nil
	}
	var found *S
	for h, i := range bucketPair(digest, mul, uint32(len(table)), local) {
		if reads != nil {
			*reads = append(*reads, Read{Table: name, Offset: uint64(i) * uint64(unsafe.Sizeof(table[0])), Parallel: parallel || h == 1})
		}
		ss := slots(&table[i])
		for j := range ss {
			if match(&ss[j]) {
				found = &ss[j]
			}
		}
	}
	return found
}

func (t *Tables) class4(a uint32, reads *[]Read, read func(string, int, int)) uint32 {
	key, wkey := a>>8+1, a>>16+1
	slots := func(b *abi.V4Bucket) []abi.V4Block { return b.Slot[:] }
	b := cuckooFind(t.V4Blocks, t.V4BlockMul, quadShape.local, key, "v4_blocks", reads, false, slots, func(s *abi.V4Block) bool { return s.Key == key })
	d := cuckooFind(t.V4Dense, t.V4DenseMul, denseShape.local, key, "v4_dense", reads, true,
		func(b *abi.V4DenseBucket) []abi.V4Dense { return b.Slot[:] }, func(s *abi.V4Dense) bool { return s.Key == key })
	w := cuckooFind(t.V4Wide, t.V4WideMul, quadShape.local, wkey, "v4_wide", reads, true, slots, func(s *abi.V4Block) bool { return s.Key == wkey })
	lo := a & 0xff
	if d != nil {
		if d.Bits[lo>>6]>>(lo&63)&1 == 1 {
			return d.Hit
		}
		return d.Base
	}
	if b == nil {
		if w != nil {
			return uint32(w.Entry)
		}
		return 0
	}
	e := b.Entry
	switch e >> abi.V4ETypeShift {
	case abi.V4EClass:
		return uint32(e)
	case abi.V4EInline:
		mask := uint64(1)<<abi.V4InlineClassBits - 1
		octets := uint64(uint32(e>>abi.V4EOctetsShift)) | uint64(b.Octets)<<32
		for k := 0; k < abi.V4Inline; k++ {
			if uint32(octets>>(8*k))&0xff == lo {
				return uint32(e >> abi.V4EHitShift & mask)
			}
		}
		return uint32(e & mask)
	case abi.V4EPairs:
		mask := uint64(1)<<abi.V4InlineClassBits - 1
		pairs := [abi.V4Pairs]uint64{e >> abi.V4EPairsShift, e >> (abi.V4EPairsShift + abi.V4PairBits), uint64(b.Octets)}
		for _, p := range pairs {
			if uint32(p&0xff) == lo {
				return uint32(p >> 8 & mask)
			}
		}
		return uint32(e & mask)
	}
	read("v4_tbl8s", int(uint32(e)), 512)
	return uint32(t.V4Tbl8s[uint32(e)].Cls[lo])
}

func (t *Tables) class6(a policy.U128, reads *[]Read) uint32 {
	// The hot length's probe goes first, the block's reads beside it.
	hot, hotOK := int64(-1), t.V6HotLen != 0
	if hotOK {
		hot = t.probe6(a, t.V6HotLen, reads, false)
	}
	key := uint32(a.Hi>>40) + 1
	n := cuckooFind(t.V6Blocks, t.V6BlockMul, pairShape.local, key, "v6_blocks", reads, hotOK,
		func(b *abi.V6Bucket) []abi.V6Block { return b.Slot[:] }, func(s *abi.V6Block) bool { return s.Key == key })
	if n == nil {
		return 0
	}
	// Lengths present under the block, longest first.
	lens := [2]uint64{n.LongLens, n.ShortLens}
	for k, first := range [2]int{abi.V6LongMin, abi.V6ShortMin} {
		for l := lens[k]; l != 0; {
			b := 63 - bits.LeadingZeros64(l)
			l &^= 1 << b
			length := uint32(first + b)
			c := hot
			if length != t.V6HotLen {
				c = t.probe6(a, length, reads, false)
			}
			if c >= 0 {
				return uint32(c)
			}
		}
	}
	return n.Base
}

// probe6 is v6_probe: the class of the prefix of the length holding a, or -1.
func (t *Tables) probe6(a policy.U128, length uint32, reads *[]Read, parallel bool) int64 {
	var cls *uint32
	if length > 64 {
		lo := a.Lo & (^uint64(0) << (128 - length))
		s := cuckooFind(t.V6Long, t.V6LongMul, pairShape.local, digest6(a.Hi, lo, length), "v6_long", reads, parallel,
			func(b *abi.V6LongBucket) []abi.V6LongSlot { return b.Slot[:] },
			func(s *abi.V6LongSlot) bool { return s.Len == length && s.Hi == a.Hi && s.Lo == lo })
		if s != nil {
			cls = &s.Cls
		}
	} else {
		key := a.Hi
		if length < 64 {
			key &= ^uint64(0) << (64 - length)
		}
		s := cuckooFind(t.V6Short, t.V6ShortMul, quadShape.local, digest6(key, 0, length), "v6_short", reads, parallel,
			func(b *abi.V6ShortBucket) []abi.V6Slot { return b.Slot[:] },
			func(s *abi.V6Slot) bool { return s.Len == length && s.Key == key })
		if s != nil {
			cls = &s.Cls
		}
	}
	if cls == nil {
		return -1
	}
	return int64(*cls)
}

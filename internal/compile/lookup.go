package compile

import (
	"math/bits"
	"net/netip"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/policy"
)

// Read is one read a lookup makes: a table and the byte offset in it. A
// lookup's reads depend each on the one before.
type Read struct {
	Table  string
	Offset uint64
}

// Lookup finds the lists holding an address in the tables step for step as
// bpf/lists.h does (the overlay aside), appending each read to reads when
// reads is not nil.
func (t *Tables) Lookup(a netip.Addr, reads *[]Read) uint64 {
	read := func(table string, index, size int) {
		if reads != nil {
			*reads = append(*reads, Read{table, uint64(index) * uint64(size)})
		}
	}
	var cls uint32
	if a.Is4() {
		cls = t.class4(policy.V4ToUint(a), read)
	} else {
		cls = t.class6(policy.U128Of(a), read)
	}
	read("classes", int(cls), 8)
	if int(cls) >= len(t.Classes) {
		return 0
	}
	return t.Classes[cls]
}

// dirIndex is the entry index of a present block, or -1.
func dirIndex(dir []abi.DirNode, blk uint32, table string, read func(string, int, int)) int {
	n := int(blk / 64)
	if n >= len(dir) {
		return -1
	}
	read(table, n, 16)
	bit := uint64(1) << (blk % 64)
	if dir[n].Bits&bit == 0 {
		return -1
	}
	return int(dir[n].Rank) + bits.OnesCount64(dir[n].Bits&(bit-1))
}

func (t *Tables) class4(a uint32, read func(string, int, int)) uint32 {
	i := dirIndex(t.V4Dir, a>>8, "v4_dir", read)
	if i < 0 {
		return 0
	}
	read("v4_entries", i, 8)
	e, lo := t.V4Entries[i], a&0xff
	switch e >> abi.V4ETypeShift {
	case abi.V4EClass:
		return uint32(e)
	case abi.V4EInline:
		mask := uint64(1)<<abi.V4InlineClassBits - 1
		for k := 0; k < abi.V4Inline; k++ {
			if uint32(e>>(abi.V4EOctetsShift+8*k))&0xff == lo {
				return uint32(e >> abi.V4EHitShift & mask)
			}
		}
		return uint32(e & mask)
	case abi.V4EBitmap:
		read("v4_bitmaps", int(uint32(e)), 40)
		b := t.V4Bitmaps[uint32(e)]
		if b.Bits[lo>>6]>>(lo&63)&1 == 1 {
			return uint32(b.Hit)
		}
		return uint32(b.Base)
	}
	read("v4_tbl8s", int(uint32(e)), 512)
	return uint32(t.V4Tbl8s[uint32(e)].Cls[lo])
}

func (t *Tables) class6(a policy.U128, read func(string, int, int)) uint32 {
	i := dirIndex(t.V6Dir, uint32(a.Hi>>40), "v6_dir", read)
	if i < 0 {
		return 0
	}
	read("v6_nodes", i, 24)
	n := t.V6Nodes[i]
	for l := n.LongLens; l != 0; {
		b := 63 - bits.LeadingZeros64(l)
		l &^= 1 << b
		length := uint32(abi.V6LongMin + b)
		lo := a.Lo
		if length < 128 {
			lo &= ^uint64(0) << (128 - length)
		}
		if c, ok := probe(t.V6Long, t.V6LongBits, hash(a.Hi, lo, length, t.V6Seed), "v6_long", 32, read, func(s abi.V6LongSlot) (uint32, bool, bool) {
			return s.Cls, s.Len == 0, s.Len == length && s.Hi == a.Hi && s.Lo == lo
		}); ok {
			return c
		}
	}
	for l := n.ShortLens; l != 0; {
		b := 63 - bits.LeadingZeros64(l)
		l &^= 1 << b
		length := uint32(abi.V6ShortMin + b)
		key := a.Hi
		if length < 64 {
			key &= ^uint64(0) << (64 - length)
		}
		if c, ok := probe(t.V6Short, t.V6ShortBits, hash(key, 0, length, t.V6Seed), "v6_short", 16, read, func(s abi.V6Slot) (uint32, bool, bool) {
			return s.Cls, s.Len == 0, s.Len == length && s.Key == key
		}); ok {
			return c
		}
	}
	return n.Base
}

// probe looks a key up from its home slot: match says (class, empty, hit).
func probe[S abi.V6Slot | abi.V6LongSlot](table []S, tbits uint32, h uint64, name string, size int, read func(string, int, int), match func(S) (uint32, bool, bool)) (uint32, bool) {
	if len(table) == 0 {
		return 0, false
	}
	home := h >> (64 - max(1, tbits))
	for k := uint64(0); k < abi.V6MaxProbe; k++ {
		i := (home + k) & uint64(len(table)-1)
		read(name, int(i), size)
		c, empty, hit := match(table[i])
		if hit {
			return c, true
		}
		if empty {
			return 0, false
		}
	}
	return 0, false
}

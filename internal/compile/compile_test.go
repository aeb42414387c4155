package compile

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/policy"
)

func lookup4(t *Tables, a uint32) uint64 { return t.Lookup(policy.UintToV4(a), nil) }

func lookup6(t *Tables, a netip.Addr) uint64 { return t.Lookup(a, nil) }

// holding is the mask of the lists holding a, as the lists say.
func holding(lists []*policy.List, bits []uint64, a netip.Addr) uint64 {
	var mask uint64
	for i, l := range lists {
		if l.Contains(a) {
			mask |= bits[i]
		}
	}
	return mask
}

func TestNestedAllowDeny(t *testing.T) {
	pol, err := policy.Parse("p.yaml", []byte(`
lists:
  deny: {prefixes: [10.0.0.0/8, 10.1.0.0/16, 10.1.2.0/24, 10.1.2.0/24, "2001:db8::/32", "2001:db8:1::/48"]}
  allow: {prefixes: [10.1.2.128/25, 10.1.2.7, "2001:db8:1:2::/64"]}
rules:
  - {name: allow, src: allow, action: pass}
  - {name: deny, src: deny, action: drop}
`))
	if err != nil {
		t.Fatal(err)
	}
	img := Build(pol)
	allow, deny := img.Lists["allow"], img.Lists["deny"]
	tb := &img.Tables
	for addr, want := range map[string]uint64{
		"10.0.0.1": deny, "10.1.2.1": deny, "10.1.2.7": deny | allow, "10.1.2.200": deny | allow, "11.0.0.0": 0, "9.255.255.255": 0,
	} {
		if got := lookup4(tb, policy.V4ToUint(netip.MustParseAddr(addr))); got != want {
			t.Errorf("%s: mask %b, want %b", addr, got, want)
		}
	}
	// 10.1.2.0/24 holds two memberships (deny; deny+allow at .7 and
	// .128-.255): one bitmap; the /16 and /24 inside the /8 add nothing.
	if len(tb.V4Tbl8s) != 0 || tb.V4DenseBlocks() != 1 {
		t.Errorf("second stage: %d tbl8s, %d bitmaps", len(tb.V4Tbl8s), tb.V4DenseBlocks())
	}
	// The /48 adds nothing to the /32 it is in: two IPv6 entries, the
	// /32 and the /64, in one /24 block's node.
	var blocks []abi.V6Block
	for _, b := range tb.V6Blocks {
		for _, s := range b.Slot {
			if s.Key != 0 {
				blocks = append(blocks, s)
			}
		}
	}
	if tb.V6Prefixes() != 2 || len(blocks) != 1 || blocks[0].ShortLens != 1<<(32-25)|1<<(64-25) {
		t.Errorf("IPv6 entries %d blocks %+v", tb.V6Prefixes(), blocks)
	}
	if got := lookup6(tb, netip.MustParseAddr("2001:db8:1:2::9")); got != deny|allow {
		t.Errorf("IPv6 nested: %b", got)
	}
}

// TestTablesAgainstLists compares the compiled tables with List.Contains
// for random lists of mixed lengths, nested and overlapping.
func TestTablesAgainstLists(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	var bitmaps, tbl8s int
	for round := 0; round < 20; round++ {
		var lists []*policy.List
		var bits []uint64
		base := rng.Uint32() & 0xfffc0000 // lists share a /14, so they overlap and nest
		for i := 0; i < 1+rng.IntN(4); i++ {
			var ps []netip.Prefix
			for j := 0; j < rng.IntN(3000); j++ {
				a := policy.UintToV4(base | rng.Uint32()&0x0003ffff)
				bits4 := []int{20, 24, 25, 28, 30, 31, 32, 32, 32}[rng.IntN(9)]
				if rng.IntN(500) == 0 {
					bits4 = 8 // rarely, a prefix holding everything else
				}
				ps = append(ps, netip.PrefixFrom(a, bits4).Masked())
				var b [16]byte
				b[0], b[1], b[15] = 0x20, byte(i), byte(rng.IntN(256))
				ps = append(ps, netip.PrefixFrom(netip.AddrFrom16(b), []int{16, 64, 120, 127, 128, 128, 128, 128, 128, 128, 128, 128}[rng.IntN(12)]).Masked())
			}
			lists = append(lists, policy.NewList("l"+string(rune('a'+i)), ps))
			bits = append(bits, 1<<i)
		}
		tb := BuildTables(lists, bits, nil, nil)
		bitmaps += tb.V4DenseBlocks()
		tbl8s += len(tb.V4Tbl8s)
		for k := 0; k < 20000; k++ {
			a := rng.Uint32()
			if k%2 == 0 && len(lists[0].V4) > 0 {
				r := lists[rng.IntN(len(lists))].V4
				if len(r) > 0 {
					x := r[rng.IntN(len(r))]
					a = x.Lo + uint32(rng.Uint64N(uint64(x.Hi-x.Lo)+3)) - 1
				}
			}
			if got, want := lookup4(&tb, a), holding(lists, bits, policy.UintToV4(a)); got != want {
				t.Fatalf("round %d: %s: tables %b, lists %b", round, policy.UintToV4(a), got, want)
			}
		}
		for k := 0; k < 2000; k++ {
			var b [16]byte
			b[0], b[1], b[15] = 0x20, byte(rng.IntN(5)), byte(rng.IntN(256))
			a := netip.AddrFrom16(b)
			if got, want := lookup6(&tb, a), holding(lists, bits, a); got != want {
				t.Fatalf("round %d: %s: tables %b, lists %b", round, a, got, want)
			}
		}
	}
	if bitmaps == 0 || tbl8s == 0 {
		t.Errorf("the random lists never built both second stages: %d bitmaps, %d tbl8s", bitmaps, tbl8s)
	}
}

func TestOverlay(t *testing.T) {
	p := netip.MustParsePrefix
	bits := map[string]uint64{"a": 1, "b": 2}
	ops := []policy.ListOp{
		{List: "a", Prefix: p("10.0.0.0/8"), Add: true},
		{List: "b", Prefix: p("10.1.0.0/16"), Add: false},
		{List: "a", Prefix: p("10.1.2.3/32"), Add: false},
		{List: "a", Prefix: p("10.0.0.0/8"), Add: true}, // later, but does not cover .3 more closely
		{List: "zzz", Prefix: p("1.0.0.0/8"), Add: true},
	}
	v4, v6 := Overlay(bits, ops)
	got := map[string]abi.Overlay{}
	for _, e := range v4 {
		got[netip.PrefixFrom(netip.AddrFrom4(e.Key.Addr), int(e.Key.Prefixlen)).String()] = e.Overlay
	}
	want := map[string]abi.Overlay{
		"10.0.0.0/8":  {Set: 1},
		"10.1.0.0/16": {Set: 1, Clear: 2},
		// The /8 add is later than the /32 del in time, and covers .3 too:
		// the latest op covering the address decides.
		"10.1.2.3/32": {Set: 1, Clear: 2},
	}
	if len(v6) != 0 || len(got) != len(want) {
		t.Fatalf("overlay %v, want %v", got, want)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: %+v, want %+v", k, got[k], w)
		}
	}
}

// TestCuckoo places many keys (with colliding digests among them) and finds
// every one in one of its two buckets; the layout is the same every time.
func TestCuckoo(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	rng := rand.New(rand.NewPCG(3, 3))
	keys := make([]uint32, 200_000)
	seen := map[uint32]bool{}
	for i := range keys {
		k := rng.Uint32()
		if i%1000 == 0 && i > 0 {
			k = keys[i-1] // a digest shared by two keys
		} else {
			for seen[k] {
				k = rng.Uint32()
			}
		}
		seen[k] = true
		keys[i] = k
	}
	for _, c := range []shape{quadShape, pairShape} {
		slots, buckets, mul := placeCuckoo(keys, c)
		if buckets%abi.PageBuckets != 0 || float64(len(keys)) < 0.85*c.load*float64(int(buckets)*c.slots) {
			t.Errorf("%d slots: %d keys in %d buckets", c.slots, len(keys), buckets)
		}
		if len(slots) != int(buckets)*c.slots {
			t.Fatalf("%d slots: %d slots for %d buckets", c.slots, len(slots), buckets)
		}
		placed := make([]bool, len(keys))
		for p, k := range slots {
			if k == 0 {
				continue
			}
			i := k - 1
			b, pair := uint32(p/c.slots), bucketPair(keys[i], mul, buckets, c.local)
			if placed[i] || (b != pair[0] && b != pair[1]) || (c.local && pair[0]/abi.PageBuckets != pair[1]/abi.PageBuckets) {
				t.Fatalf("key %d at slot %d: placed twice, not in its buckets, or its buckets in two pages", i, p)
			}
			placed[i] = true
		}
		if i := slices.Index(placed, false); i >= 0 {
			t.Fatalf("%d slots: key %d has no slot", c.slots, i)
		}
		// Page-local tables are placed in parts at once: a second
		// placement, on one CPU where the first had four, lays the keys
		// out the same.
		old := runtime.GOMAXPROCS(1)
		slots2, buckets2, mul2 := placeCuckoo(keys, c)
		runtime.GOMAXPROCS(old)
		if buckets2 != buckets || mul2 != mul || !slices.Equal(slots, slots2) {
			t.Errorf("%d slots: two layouts of the same keys", c.slots)
		}
	}
}

// TestPermute: permute, which lays out tables too big to copy, moves each
// element where scatter puts it, and leaves the other slots zero.
func TestPermute(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for _, n := range []int{1, 100, 70_000} {
		slots := n + n/3
		items := make([]abi.V4Block, slots)
		for i := range n {
			items[i] = abi.V4Block{Key: uint32(i + 1), Octets: rng.Uint32(), Entry: rng.Uint64()}
		}
		pos := make([]uint32, n)
		for i, p := range rng.Perm(slots)[:n] {
			pos[i] = uint32(p)
		}
		want := scatter(items[:n], slots, pos)
		permute(items, n, pos)
		if !slices.Equal(items, want) {
			t.Fatalf("%d items: permute and scatter disagree", n)
		}
	}
}

// TestAggregation: adjacent and sibling entries of a list merge before they
// reach the tables (a country's IPv6 ranges come as thousands of pieces).
func TestAggregation(t *testing.T) {
	var ps []netip.Prefix
	for i := 0; i < 1<<12; i++ { // every /44 of 2001:db8::/32, out of order
		var b [16]byte
		b[0], b[1], b[2], b[3] = 0x20, 0x01, 0x0d, 0xb8
		j := (i * 2654435761) & (1<<12 - 1)
		b[4], b[5] = byte(j>>4), byte(j<<4)
		ps = append(ps, netip.PrefixFrom(netip.AddrFrom16(b), 44))
	}
	ps = append(ps, netip.MustParsePrefix("2001:db9::/48"), netip.MustParsePrefix("2001:db9:1::/48")) // siblings: one /47
	tb := BuildTables([]*policy.List{policy.NewList("country", ps)}, []uint64{1}, nil, nil)
	if n := tb.V6Prefixes(); n != 2 {
		t.Errorf("%d IPv6 prefixes in the tables, want 2 (2001:db8::/32 and 2001:db9::/47)", n)
	}
	for addr, want := range map[string]uint64{"2001:db8:ffff::1": 1, "2001:db9:1:ffff::": 1, "2001:db9:2::": 0, "2001:db7:ffff::": 0} {
		if got := lookup6(&tb, netip.MustParseAddr(addr)); got != want {
			t.Errorf("%s: %b, want %b", addr, got, want)
		}
	}
}

// TestBucketLayout: cuckooTable views a run of slots as buckets, so a
// bucket must be its slots and nothing else.
func TestBucketLayout(t *testing.T) {
	for _, c := range []struct {
		name                string
		bucket, slot, slots uintptr
		bucketAlign, slotAl uintptr
	}{
		{"V4Bucket", unsafe.Sizeof(abi.V4Bucket{}), unsafe.Sizeof(abi.V4Block{}), 4, unsafe.Alignof(abi.V4Bucket{}), unsafe.Alignof(abi.V4Block{})},
		{"V6Bucket", unsafe.Sizeof(abi.V6Bucket{}), unsafe.Sizeof(abi.V6Block{}), 2, unsafe.Alignof(abi.V6Bucket{}), unsafe.Alignof(abi.V6Block{})},
		{"V6ShortBucket", unsafe.Sizeof(abi.V6ShortBucket{}), unsafe.Sizeof(abi.V6Slot{}), 4, unsafe.Alignof(abi.V6ShortBucket{}), unsafe.Alignof(abi.V6Slot{})},
		{"V6LongBucket", unsafe.Sizeof(abi.V6LongBucket{}), unsafe.Sizeof(abi.V6LongSlot{}), 2, unsafe.Alignof(abi.V6LongBucket{}), unsafe.Alignof(abi.V6LongSlot{})},
	} {
		if c.bucket != c.slots*c.slot || c.bucketAlign != c.slotAl {
			t.Errorf("%s: %d bytes aligned to %d, want %d slots of %d aligned to %d", c.name, c.bucket, c.bucketAlign, c.slots, c.slot, c.slotAl)
		}
	}
}

// TestCuckooInPlace: a table laid out over its items' memory, through a
// copy (tables up to scatterBytes) or by permute (bigger ones), is the
// table laid out in a new array.
func TestCuckooInPlace(t *testing.T) {
	defer func(was uintptr) { scatterBytes = was }(scatterBytes)
	rng := rand.New(rand.NewPCG(5, 5))
	for _, n := range []int{1, 63, 5000, 100_000} {
		items := make([]abi.V6LongSlot, n)
		for i := range items {
			items[i] = abi.V6LongSlot{Hi: rng.Uint64(), Lo: rng.Uint64(), Len: 128, Cls: uint32(i)}
		}
		digest := func(s *abi.V6LongSlot) uint32 { return digest6(s.Hi, s.Lo, s.Len) }
		scatterBytes = 64 << 20
		copied, mul := cuckooTable[abi.V6LongBucket](slices.Clone(items), digest, pairShape)
		for _, limit := range []uintptr{64 << 20, 0} {
			scatterBytes = limit
			room := append(make([]abi.V6LongSlot, 0, tableSlots(n, pairShape)), items...)
			inPlace, mul2 := cuckooTable[abi.V6LongBucket](room, digest, pairShape)
			if mul != mul2 || !slices.Equal(copied, inPlace) {
				t.Fatalf("%d items, scatter up to %d bytes: the table laid out in place differs from the copy", n, limit)
			}
			if &inPlace[0].Slot[0] != &room[:1][0] {
				t.Errorf("%d items, scatter up to %d bytes: not laid out in place", n, limit)
			}
		}
		inPlace := copied
		found := 0
		for _, b := range inPlace {
			for _, s := range b.Slot {
				if s.Len != 0 {
					if s != items[s.Cls] {
						t.Fatalf("%d items: slot holds %+v, not item %d", n, s, s.Cls)
					}
					found++
				}
			}
		}
		if found != n {
			t.Errorf("%d items: %d in the table", n, found)
		}
	}
}

// TestHotLength: the hot length is the one most IPv6 prefixes past /24
// have, however the tables lay them out.
func TestHotLength(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	var ps []netip.Prefix
	for i := range 20_000 {
		length := []int{40, 48, 56, 60, 128}[i%5] // a fifth each...
		if i%20 == 0 {
			length = 32 // ...and one more in twenty /32
		}
		ps = append(ps, netip.PrefixFrom(policy.U128{Hi: rng.Uint64()>>3 | 1<<61, Lo: rng.Uint64()}.Addr(), length).Masked())
	}
	for _, want := range []uint32{40, 48, 56, 60, 128} {
		// Half as many more of one length makes it the hot one.
		more := slices.Clone(ps)
		for range 2_000 {
			more = append(more, netip.PrefixFrom(policy.U128{Hi: rng.Uint64()>>3 | 1<<61, Lo: rng.Uint64()}.Addr(), int(want)).Masked())
		}
		tb := BuildTables([]*policy.List{policy.NewList("l", more)}, []uint64{1}, nil, nil)
		if tb.V6HotLen != want {
			t.Errorf("hot length %d, want /%d", tb.V6HotLen, want)
		}
	}
}

// TestV6WideAndNarrow: a block that prefixes up to /24 give a class and
// longer prefixes mark lengths in is one block with both; the longest
// prefix up to /24 gives its class.
func TestV6WideAndNarrow(t *testing.T) {
	lists := []*policy.List{
		policy.NewList("w16", []netip.Prefix{netip.MustParsePrefix("2001::/16")}),
		policy.NewList("w20", []netip.Prefix{netip.MustParsePrefix("2001::/20")}),
		policy.NewList("narrow", []netip.Prefix{netip.MustParsePrefix("2001:db8::/32"), netip.MustParsePrefix("2001:db9::1/128"),
			netip.MustParsePrefix("2001:1234::/32")}),
	}
	tb := BuildTables(lists, []uint64{1, 2, 4}, nil, nil)
	blocks := map[uint32]abi.V6Block{}
	for _, b := range tb.V6Blocks {
		for _, s := range b.Slot {
			if s.Key != 0 {
				if _, dup := blocks[s.Key-1]; dup {
					t.Fatalf("block %06x twice", s.Key-1)
				}
				blocks[s.Key-1] = s
			}
		}
	}
	if len(blocks) != 256 { // the /16's; the /20's and the /32s' are among them
		t.Errorf("%d blocks, want 256", len(blocks))
	}
	db, other := blocks[0x20010d], blocks[0x200112]
	if db.ShortLens != 1<<(32-abi.V6ShortMin) || db.LongLens != 1<<(128-abi.V6LongMin) || other.ShortLens != 1<<(32-abi.V6ShortMin) || other.LongLens != 0 {
		t.Errorf("lengths: 2001:0d %+v, 2001:12 %+v", db, other)
	}
	if db.Base != blocks[0x200100].Base || other.Base != blocks[0x2001ff].Base || db.Base == other.Base {
		t.Errorf("classes: 2001:0d %d and 2001:00 %d (the /20), 2001:12 %d and 2001:ff %d (the /16)",
			db.Base, blocks[0x200100].Base, other.Base, blocks[0x2001ff].Base)
	}
	for addr, want := range map[string]uint64{"2001:db8::1": 7, "2001:d00::1": 3, "2001:1234::5": 5, "2001:ff::": 3, "2001:f000::": 1,
		"2001:db9::1": 7, "2001:db9::2": 3, "2002::": 0} {
		if got := tb.Lookup(netip.MustParseAddr(addr), nil); got != want {
			t.Errorf("%s: lists %03b, want %03b", addr, got, want)
		}
	}
}

// TestV6LongOnly: without prefixes up to /24, the blocks of the longer
// ones are counted ahead and their array becomes the blocks' table; with
// several lists sharing blocks the count is over and the table is copied.
// Either way every block is there once and every lookup agrees with the
// lists.
func TestV6LongOnly(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for _, n := range []int{1, 3} {
		var lists []*policy.List
		var bits []uint64
		for i := range n {
			var ps []netip.Prefix
			for range 20_000 {
				var b [16]byte
				b[0], b[1], b[2] = 0x20, 0x01, byte(rng.IntN(64)) // 64 blocks the lists share
				for k := 3; k < 16; k++ {
					b[k] = byte(rng.IntN(256))
				}
				ps = append(ps, netip.PrefixFrom(netip.AddrFrom16(b), []int{40, 48, 64, 96, 120, 128, 128, 128}[rng.IntN(8)]).Masked())
			}
			lists = append(lists, policy.NewList("l"+string(rune('a'+i)), ps))
			bits = append(bits, 1<<i)
		}
		tb := BuildTables(lists, bits, nil, nil)
		if len(tb.V6Short) == 0 || len(tb.V6Long) == 0 {
			t.Fatalf("%d lists: no table of prefixes past /24", n)
		}
		seen := map[uint32]bool{}
		for _, b := range tb.V6Blocks {
			for _, s := range b.Slot {
				if s.Key != 0 {
					if seen[s.Key] || s.Base != 0 || s.ShortLens|s.LongLens == 0 {
						t.Fatalf("%d lists: block %06x: twice, or %+v", n, s.Key-1, s)
					}
					seen[s.Key] = true
				}
			}
		}
		if len(seen) != 64 {
			t.Errorf("%d lists: %d blocks, want 64", n, len(seen))
		}
		for k := range 20_000 {
			l := lists[rng.IntN(n)]
			r := l.V6[rng.IntN(len(l.V6))]
			a := r.Lo.Addr()
			if k%2 == 1 { // beside a listed range, mostly in no list
				a = r.Hi.Add1().Addr()
			}
			if got, want := lookup6(&tb, a), holding(lists, bits, a); got != want {
				t.Fatalf("%d lists: %s: tables %b, lists %b", n, a, got, want)
			}
		}
	}
}

// Hash takes the rules' bytes as they lie in memory: with no padding in
// the layout they are what binary.Write makes of them, every field and
// nothing else.
func TestHashRulesAsWritten(t *testing.T) {
	rules := []abi.Rule{{SrcLists: 1, Match: 2, DportLo: 3, Action: 4, Rule: 5, FlowHi: 6}, {DstLists: 7, FragClear: 8}}
	var b bytes.Buffer
	if err := binary.Write(&b, binary.LittleEndian, rules); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b.Bytes(), AsBytes(rules)) {
		t.Fatalf("abi.Rule in memory (%d bytes) is not as binary.Write writes it (%d bytes): padding in the layout?", len(AsBytes(rules)), b.Len())
	}
}

// TestStaticWays compares the classes of random lists, some of static ways
// (no bit; two may share a way), with List.Contains: a class's mask says
// the lists with a bit, its set of ways the static ones, and ClassUnmasked
// marks a class with static lists. Lists share prefixes, exactly, so that
// one prefix comes from several lists.
func TestStaticWays(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for round := range 30 {
		var pool []netip.Prefix
		for range 60 {
			a := policy.UintToV4(0x0a000000 | rng.Uint32()&0x0003ffff)
			pool = append(pool, netip.PrefixFrom(a, []int{14, 20, 24, 25, 30, 32, 32}[rng.IntN(7)]).Masked())
			var b [16]byte
			b[0], b[1], b[2], b[15] = 0x20, 1, byte(rng.IntN(4)), byte(rng.IntN(256))
			pool = append(pool, netip.PrefixFrom(netip.AddrFrom16(b), []int{16, 24, 32, 64, 120, 126, 128, 128}[rng.IntN(8)]).Masked())
		}
		var lists []*policy.List
		var bits []uint64
		var static []uint32
		for i := range 3 + rng.IntN(6) {
			var ps []netip.Prefix
			for range 1 + rng.IntN(20) {
				ps = append(ps, pool[rng.IntN(len(pool))])
			}
			lists = append(lists, policy.NewList(fmt.Sprintf("l%d", i), ps))
			if rng.IntN(2) == 0 {
				bits, static = append(bits, 1<<i), append(static, 0)
			} else {
				bits, static = append(bits, 0), append(static, uint32(1+rng.IntN(3)))
			}
		}
		tb := BuildTables(lists, bits, static, nil)
		check := func(a netip.Addr, cls uint32) {
			var mask uint64
			var ways []uint32
			for i, l := range lists {
				if l.Contains(a) {
					mask |= bits[i]
					if static[i] != 0 {
						ways = append(ways, static[i])
					}
				}
			}
			slices.Sort(ways)
			ways = slices.Compact(ways)
			got, set := tb.Classes[cls], tb.sets.sets[tb.classStatic[cls]]
			if got&^ClassUnmasked != mask || !slices.Equal(set, ways) || (got&ClassUnmasked != 0) != (len(ways) > 0) {
				t.Fatalf("round %d: %s: class %d has mask %#x and ways %v; the lists say %#x and %v", round, a, cls, got, set, mask, ways)
			}
		}
		for range 5000 {
			p := pool[rng.IntN(len(pool))]
			if p.Addr().Is4() {
				a := policy.V4ToUint(p.Addr()) + uint32(rng.Uint64N(uint64(1)<<(32-p.Bits())+2)) - 1
				check(policy.UintToV4(a), tb.class4(a, nil, func(string, int, int) {}))
				continue
			}
			b := p.Addr().As16()
			b[15] += byte(rng.IntN(3)) - 1
			if rng.IntN(2) == 0 {
				b[rng.IntN(16)] ^= byte(rng.IntN(256))
			}
			a := netip.AddrFrom16(b)
			check(a, tb.class6(policy.U128Of(a), nil))
		}
	}
}

// TestHashSeesStaticLists: two policies whose static lists (past
// policy.MaxLists ways) hold different addresses differ in their hash,
// though their classes' masks are alike.
func TestHashSeesStaticLists(t *testing.T) {
	text := func(x, y string) string {
		var b strings.Builder
		b.WriteString("lists:\n")
		for i := range policy.MaxLists {
			fmt.Fprintf(&b, "  c%d: {prefixes: [198.51.100.%d/32]}\n", i, i)
		}
		fmt.Fprintf(&b, "  x: {prefixes: [%s]}\n  y: {prefixes: [%s]}\nrules:\n", x, y)
		for i := range policy.MaxLists {
			fmt.Fprintf(&b, "  - {name: r%d, src: c%d, action: drop}\n", i, i)
		}
		b.WriteString("  - {name: rx, src: x, action: drop}\n  - {name: ry, src: y, action: pass}\ndefault: drop\n")
		return b.String()
	}
	var hashes []string
	for _, p := range []string{text("10.9.0.1", "10.9.0.2"), text("10.9.0.2", "10.9.0.1")} {
		pol, err := policy.Parse("p.yaml", []byte(p))
		if err != nil {
			t.Fatal(err)
		}
		if len(pol.ListUse().Static()) != 2 {
			t.Fatalf("static lists: %v; want x and y", pol.ListUse().Static())
		}
		hashes = append(hashes, Build(pol).Hash())
	}
	if hashes[0] == hashes[1] {
		t.Errorf("x and y swapped: both hash %s", hashes[0])
	}
}

// TestBuildReleasingRanges: a build that frees the lists' ranges as it goes
// gives the image Build gives, lists that share a bit (a union) included,
// and leaves the ranges it used nil.
func TestBuildReleasingRanges(t *testing.T) {
	// Seventy lists one rule names share a bit (policy.ListUse); one
	// more takes one of its own.
	var b strings.Builder
	b.WriteString("lists:\n")
	var names []string
	for i := range 70 {
		fmt.Fprintf(&b, "  l%d: {prefixes: [10.%d.0.0/16, 192.0.2.%d, \"2001:db8:%x::/48\", \"2001:db9::%x\"]}\n", i, i, i, i, i)
		names = append(names, fmt.Sprintf("l%d", i))
	}
	b.WriteString("  c: {prefixes: [203.0.113.0/24, \"2001:dba::1\"]}\n")
	fmt.Fprintf(&b, "rules:\n  - {name: shared, src: [%s], action: drop}\n  - {name: c, dst: c, action: drop}\n", strings.Join(names, ", "))
	parse := func() *policy.Policy {
		pol, err := policy.Parse("p.yaml", []byte(b.String()))
		if err != nil {
			t.Fatal(err)
		}
		return pol
	}
	img := Build(parse())
	if img.Lists["l0"] == 0 || img.Lists["l0"] != img.Lists["l69"] {
		t.Fatalf("lists l0 and l69 take bits %b and %b, want one", img.Lists["l0"], img.Lists["l69"])
	}
	want := img.Hash()
	pol := parse()
	if got := BuildReleasingRanges(pol).Hash(); got != want {
		t.Errorf("image %s, want %s", got, want)
	}
	for name, l := range pol.Lists {
		if l.V4 != nil || l.V6 != nil {
			t.Errorf("list %s still holds %d and %d ranges", name, len(l.V4), len(l.V6))
		}
	}
}

package compile

import (
	"runtime"
	"slices"
	"unsafe"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/policy"
)

// Blocks (the /24s holding anything) and IPv6 prefixes go into bucketized
// cuckoo hashes (bpf/common.h): each key has two buckets, from two
// multiply-shift hashes of its 32-bit digest with multipliers derived from a
// seed, and sits in a free slot of either.

// bucketPair is bpf/lists.h's first_bucket and second_bucket (the two must
// agree bit for bit): the first anywhere, the second in the first's page
// when local, else anywhere too.
func bucketPair(digest uint32, mul [2]uint64, n uint32, local bool) [2]uint32 {
	first := uint32((uint64(digest) * mul[0] >> 32) * uint64(n) >> 32)
	if local {
		return [2]uint32{first, first&^(abi.PageBuckets-1) | uint32(uint64(digest)*mul[1]>>58)}
	}
	return [2]uint32{first, uint32((uint64(digest) * mul[1] >> 32) * uint64(n) >> 32)}
}

// A shape is how a cuckoo table is built: slots per bucket, whether a
// key's second bucket is in its first's page, and how full it is made.
// Page-local tables pay one TLB miss a lookup, but each page must take the
// keys hashed to it, so they are filled less: four slots a bucket, 70%,
// leaves a page five standard deviations of room. Two-slot buckets would
// need far less than that; their tables take a second bucket anywhere.
type shape struct {
	slots int
	local bool
	load  float64
}

// Dense blocks are a cache line each, two a bucket: with one slot a
// bucket, two choices fill to a half at most (Pagh and Rodler, "Cuckoo
// hashing", 2004), and a million blocks took tables filled to a fifth.
var (
	quadShape  = shape{slots: 4, local: true, load: 0.7}
	pairShape  = shape{slots: 2, local: false, load: 0.7}
	denseShape = shape{slots: 2, local: false, load: 0.7}
)

// blockMultipliers derives a seed's two odd multipliers (splitmix64).
func blockMultipliers(seed uint64) [2]uint64 {
	var m [2]uint64
	for i := range m {
		seed += 0x9e3779b97f4a7c15
		z := seed
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		m[i] = z ^ z>>31 | 1
	}
	return m
}

// cuckooTable lays items out in the buckets of a cuckoo table and returns
// the buckets and the multipliers. A bucket B is S's slots, nothing else
// (the abi's bucket types; TestBucketLayout). When items has the capacity
// (tableSlots), and not far more, the table is laid out in place, over
// items' memory, which it then owns: ten million prefixes do not need their
// table twice (one of up to scatterBytes is made in a copy first, then
// copied over the items).
func cuckooTable[B, S any](items []S, digest func(*S) uint32, sh shape) ([]B, [2]uint64) {
	keys := make([]uint32, len(items))
	inPieces(len(items), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			keys[i] = digest(&items[i])
		}
	})
	slots, buckets, mul := placeCuckoo(keys, sh)
	if buckets == 0 {
		return nil, mul
	}
	pos := make([]uint32, len(items)) // each item's slot
	inPieces(len(slots), func(lo, hi int) {
		for s, k := range slots[lo:hi] {
			if k != 0 {
				pos[k-1] = uint32(lo + s)
			}
		}
	})
	n := len(slots)
	slots = nil
	var table []S
	// In place when items has the room, and not much more: the table
	// keeps the whole array alive (lists that overlap, or prefixes their
	// ancestors make redundant, leave fewer entries than counted).
	if cap(items) >= n && cap(items) <= n+n/8 {
		table = items[:n]
		if uintptr(n)*unsafe.Sizeof(table[0]) <= scatterBytes {
			// Made apart and copied back: the items' memory stays the
			// table's, and the copy, not the items, is left as garbage.
			copy(table, scatter(table[:len(items)], n, pos))
		} else {
			clear(table[len(items):])
			permute(table, len(items), pos)
		}
	} else {
		table = scatter(items, n, pos)
	}
	return unsafe.Slice((*B)(unsafe.Pointer(unsafe.SliceData(table))), int(buckets)), mul
}

// tableSlots is the room cuckooTable needs to lay n items out in place (a
// table that takes more seeds than one needs more, rarely: it is copied).
func tableSlots(n int, sh shape) int {
	if n == 0 {
		return 0
	}
	return int(firstPages(n, sh)) * abi.PageBuckets * sh.slots
}

// firstPages is the pages of a table of n keys before any retry.
func firstPages(n int, sh shape) uint32 {
	return uint32(float64(n)/(float64(sh.slots)*sh.load*abi.PageBuckets)) + 1
}

// scatterBytes is the largest table laid out through a copy (scatter)
// rather than by permute: the copy is the table's size again while it
// lasts, but its writes, unlike permute's reads, do not wait on each other
// and split over the CPUs. A million IPv4 blocks (22 MB): permute took 56
// ms of CPU, scatter 19 over two CPUs. A variable for TestCuckooInPlace.
var scatterBytes uintptr = 64 << 20

// scatter is a table of n slots with items[i] at pos[i], the others zero.
// Pieces of items go on goroutines of their own: pos sends no two items to
// one slot.
func scatter[S any](items []S, n int, pos []uint32) []S {
	table := make([]S, n)
	inPieces(len(items), func(lo, hi int) {
		for i, at := range pos[lo:hi] {
			table[at] = items[lo+i]
		}
	})
	return table
}

// inPieces runs do over pieces of [0, n) at once (keyPieces): for loops
// over a big table's keys whose iterations touch nothing in common.
func inPieces(n int, do func(lo, hi int)) {
	policy.InPieces(n, keyPieces(n), func(_, lo, hi int) { do(lo, hi) })
}

// keyPieces is how many pieces n keys are split into: one per CPU, and
// none of fewer than 65,536.
func keyPieces(n int) int { return max(1, min(runtime.GOMAXPROCS(0), n/(1<<16))) }

// permute moves a[i] to a[pos[i]] for the first n elements, in place: the
// slots no element moves to end up zero (free). It follows the
// permutation's cycles from element to element, on eight of them at once:
// each step is a read at random, and one chain's reads wait on each other
// while eight chains' overlap. An element is marked moved as it is lifted,
// so a chain starts only at one still in place; two chains on one cycle
// split it between them.
func permute[S any](a []S, n int, pos []uint32) {
	moved := make([]uint64, (n+63)/64)
	has := func(i uint32) bool { return moved[i/64]&(1<<(i%64)) != 0 }
	lift := func(i uint32) S {
		moved[i/64] |= 1 << (i % 64)
		return a[i]
	}
	var zero S
	var chains [8]struct {
		val  S      // the element in hand
		from uint32 // where it was
		busy bool
	}
	start := uint32(0) // no element before it is still in place
	for {
		busy := 0
		for c := range chains {
			ch := &chains[c]
			if !ch.busy {
				for start < uint32(n) && has(start) {
					start++
				}
				if start == uint32(n) {
					continue
				}
				ch.val, ch.from, ch.busy = lift(start), start, true
				a[start] = zero
			}
			busy++
			to := pos[ch.from]
			if int(to) < n && !has(to) { // an element yet to move is there
				next := lift(to)
				a[to], ch.val, ch.from = ch.val, next, to
				continue
			}
			a[to], ch.busy = ch.val, false
		}
		if busy == 0 {
			return
		}
	}
}

// maxKicks bounds one insertion's evictions before a new seed and more
// buckets are tried.
const maxKicks = 1000

// placeCuckoo finds, for keys given by their digests, a slot each in a
// table of the shape: it returns every slot's key (its index + 1; 0 is a
// free slot), the bucket count (whole pages) and the multipliers. Digests
// may collide (the slots hold whole keys); more keys than a bucket pair
// holds on one digest would never place, which a 32-bit digest of real keys
// makes vanishingly rare. Deterministic: one set of keys always gives one
// layout.
func placeCuckoo(keys []uint32, sh shape) (slots []uint32, buckets uint32, mul [2]uint64) {
	if len(keys) == 0 {
		return nil, 0, [2]uint64{1, 1}
	}
	pages := firstPages(len(keys), sh)
	for seed := uint64(1); ; seed++ {
		buckets = pages * abi.PageBuckets
		mul = blockMultipliers(seed)
		if slots, ok := cuckoo(keys, sh, buckets, mul, seed); ok {
			return slots, buckets, mul
		}
		pages += pages/16 + 1 // unlucky or a page too full: more room
	}
}

// cuckoo places every key and returns the slots' keys. Keys are placed
// page by page of their first bucket, so the table, and for page-local
// shapes every eviction, stays in cache instead of being written at random.
// When both of a key's buckets are full it first looks for a key in them
// that can move to its other bucket, then evicts along a pseudo-random
// walk. Besides the table it takes eight bytes a key: a key's buckets are
// hashed again when needed rather than kept. A page-local shape's keys
// never leave their page, so from 65,536 keys on, eight parts of the
// pages are placed at once, each on a goroutine and a walk of its own (a
// million IPv4 blocks took 47 ms on one CPU before): the parts are as
// many whatever the CPUs, so that one set of keys still gives one layout.
func cuckoo(keys []uint32, sh shape, n uint32, mul [2]uint64, seed uint64) ([]uint32, bool) {
	sorted, start := byPage(keys, mul, n, sh.local)
	table := make([]uint32, int(n)*sh.slots) // item per slot (an index into sorted + 1); 0: free
	parts := 1
	if sh.local && len(keys) >= 1<<16 {
		parts = min(placeParts, int(n/abi.PageBuckets))
	}
	ok := make([]bool, parts)
	policy.InPieces(int(n/abi.PageBuckets), parts, func(p, first, last int) {
		ok[p] = place(table, sorted, int(start[first]), int(start[last]), sh, n, mul, seed+uint64(p)*0x9e3779b97f4a7c15)
	})
	if slices.Contains(ok, false) {
		return nil, false
	}
	inPieces(len(table), func(lo, hi int) {
		for s, item := range table[lo:hi] {
			if item != 0 {
				table[lo+s] = sorted[item-1].key + 1
			}
		}
	})
	return table, true
}

// placeParts is how many parts of a page-local table's pages are placed
// at once.
const placeParts = 8

// place puts sorted[lo:hi] into table, a walk seeded with rng.
func place(table []uint32, sorted []pageKey, lo, hi int, sh shape, n uint32, mul [2]uint64, rng uint64) bool {
	slots := sh.slots
	buckets := func(item uint32) [2]uint32 { return bucketPair(sorted[item-1].digest, mul, n, sh.local) }
	free := func(b uint32) int {
		for s := int(b) * slots; s < int(b+1)*slots; s++ {
			if table[s] == 0 {
				return s
			}
		}
		return -1
	}
	// moveOne frees a slot of bucket b by moving its key to its other
	// bucket, if that has room.
	moveOne := func(b uint32) int {
		for s := int(b) * slots; s < int(b+1)*slots; s++ {
			c := buckets(table[s])
			other := c[0]
			if other == b {
				other = c[1]
			}
			if f := free(other); f >= 0 {
				table[f] = table[s]
				return s
			}
		}
		return -1
	}
	for i := lo; i < hi; i++ {
		item := uint32(i + 1)
		for kick := 0; ; kick++ {
			b := buckets(item)
			s := free(b[0])
			if s < 0 {
				s = free(b[1])
			}
			if s < 0 {
				s = moveOne(b[0])
			}
			if s < 0 {
				s = moveOne(b[1])
			}
			if s >= 0 {
				table[s] = item
				break
			}
			if kick == maxKicks {
				return false
			}
			// Evict a pseudo-random key of either bucket and go on with it.
			rng = rng*6364136223846793005 + 1442695040888963407
			s = int(b[rng>>63])*slots + int(rng>>33)%slots
			table[s], item = item, table[s]
		}
	}
	return true
}

// pageKey is a key's digest and its index in keys.
type pageKey struct{ digest, key uint32 }

// byPage is the keys ordered by the page of their first bucket, keeping
// the keys' order within a page (a counting sort), and where each page's
// keys start in that order (start[pages] is their count). Pieces of keys
// are counted and placed at once, each from where the pieces before it
// leave each page: the order is the same whatever the pieces.
func byPage(keys []uint32, mul [2]uint64, n uint32, local bool) (sorted []pageKey, start []uint32) {
	page := func(k uint32) uint32 { return bucketPair(k, mul, n, local)[0] / abi.PageBuckets }
	pages := int(n / abi.PageBuckets)
	pieces := keyPieces(len(keys))
	next := make([][]uint32, pieces) // piece -> page -> its keys' next place
	policy.InPieces(len(keys), pieces, func(p, lo, hi int) {
		count := make([]uint32, pages)
		for _, k := range keys[lo:hi] {
			count[page(k)]++
		}
		next[p] = count
	})
	start = make([]uint32, pages+1)
	for pg := range pages {
		at := start[pg]
		for p := range next {
			at, next[p][pg] = at+next[p][pg], at
		}
		start[pg+1] = at
	}
	sorted = make([]pageKey, len(keys))
	policy.InPieces(len(keys), pieces, func(p, lo, hi int) {
		next := next[p]
		for i := lo; i < hi; i++ {
			pg := page(keys[i])
			sorted[next[pg]] = pageKey{keys[i], uint32(i)}
			next[pg]++
		}
	})
	return sorted, start
}

package compile

import "github.com/rampart-fw/rampart/internal/abi"

// Blocks (the /24s holding anything) and IPv6 prefixes go into bucketized
// cuckoo hashes (bpf/common.h): each key has two buckets, from two
// multiply-shift hashes of its 32-bit digest with multipliers derived from a
// seed, and sits in a free slot of either.

// bucketPair is bpf/lists.h's first_bucket and second_bucket (the two must
// agree bit for bit): the first anywhere, the second in the first's page.
func bucketPair(digest uint32, mul [2]uint64, n uint32) [2]uint32 {
	first := uint32((uint64(digest) * mul[0] >> 32) * uint64(n) >> 32)
	return [2]uint32{first, first&^(abi.PageBuckets-1) | uint32(uint64(digest)*mul[1]>>58)}
}

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

// cuckooTable lays items out in the buckets of a cuckoo table (slot gives
// a bucket's i-th slot) and returns the buckets and the multipliers.
func cuckooTable[B, S any](items []S, digest func(*S) uint32, slots int, load float64, slot func(*B, int) *S) ([]B, [2]uint64) {
	keys := make([]uint32, len(items))
	for i := range items {
		keys[i] = digest(&items[i])
	}
	pos, buckets, mul := placeCuckoo(keys, slots, load)
	table := make([]B, buckets)
	for i, p := range pos {
		*slot(&table[p/uint32(slots)], int(p%uint32(slots))) = items[i]
	}
	return table, mul
}

// maxKicks bounds one insertion's evictions before a new seed and more
// buckets are tried.
const maxKicks = 1000

// placeCuckoo finds, for keys given by their digests, a slot each in
// buckets of `slots` slots filled to at most `load`: it returns the slot
// (bucket*slots + slot) of every key, the bucket count and the multipliers.
// Digests may collide (the slots hold whole keys); more keys than a
// bucket pair holds on one digest would never place, which a 32-bit digest
// of real keys makes vanishingly rare. Deterministic: one set of keys
// always gives one layout.
func placeCuckoo(keys []uint32, slots int, load float64) (pos []uint32, buckets uint32, mul [2]uint64) {
	if len(keys) == 0 {
		return nil, 0, [2]uint64{1, 1}
	}
	pages := uint32(float64(len(keys))/(float64(slots)*load*abi.PageBuckets)) + 1
	for seed := uint64(1); ; seed++ {
		buckets = pages * abi.PageBuckets
		mul = blockMultipliers(seed)
		if table, ok := cuckoo(keys, slots, buckets, mul, seed); ok {
			pos = make([]uint32, len(keys))
			for s, k := range table {
				if k != 0 {
					pos[k-1] = uint32(s)
				}
			}
			return pos, buckets, mul
		}
		pages += pages/32 + 1 // unlucky or a page too full: a little more room
	}
}

// cuckoo inserts every key, evicting along a pseudo-random walk; the table
// holds key index + 1 per slot (0: free).
func cuckoo(keys []uint32, slots int, n uint32, mul [2]uint64, seed uint64) ([]uint32, bool) {
	table := make([]uint32, int(n)*slots)
	rng := seed
	for i := range keys {
		item := uint32(i + 1)
		for kick := 0; ; kick++ {
			b := bucketPair(keys[item-1], mul, n)
			if s, ok := freeSlot(table, slots, b[0]); ok {
				table[s] = item
				break
			}
			if s, ok := freeSlot(table, slots, b[1]); ok {
				table[s] = item
				break
			}
			if kick == maxKicks {
				return nil, false
			}
			// Both full: take a pseudo-random slot of either bucket and
			// go on with the key it held.
			rng = rng*6364136223846793005 + 1442695040888963407
			s := int(b[rng>>63])*slots + int(rng>>33)%slots
			table[s], item = item, table[s]
		}
	}
	return table, true
}

func freeSlot(table []uint32, slots int, b uint32) (int, bool) {
	for s := int(b) * slots; s < int(b+1)*slots; s++ {
		if table[s] == 0 {
			return s, true
		}
	}
	return 0, false
}

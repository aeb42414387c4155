package serve

import "testing"

// TestFoldAtGrowsWithTheSet: an import of a million decisions in polls of
// 10,000 (live changes until the overlay passes foldAt, then a rebuild of
// the whole set) is a handful of rebuilds, not one per 50,000, and the
// overlay never holds more than the room foldAt leaves for others.
func TestFoldAtGrowsWithTheSet(t *testing.T) {
	set, overlay, rebuilds, compiled := 0, 0, 0, 0
	for set < 1_000_000 {
		set += 10_000
		overlay += 10_000
		if overlay > 1<<18+10_000 {
			t.Fatalf("overlay of %d at a set of %d", overlay, set)
		}
		if overlay > foldAt(set) {
			rebuilds++
			compiled += set
			overlay = 0
		}
	}
	if rebuilds > 6 || compiled > 2_000_000 { // a fixed 50,000: 16 rebuilds, 8.2M
		t.Errorf("%d rebuilds compiling %d decisions in all for an import of %d", rebuilds, compiled, set)
	}
}

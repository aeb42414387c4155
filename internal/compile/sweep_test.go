package compile

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/rampart-fw/rampart/internal/policy"
)

func randomV4Lists(n, total int, seed uint64) ([]*policy.List, []uint64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	var lists []*policy.List
	var bits []uint64
	for i := range n {
		rs := make([]policy.Range4, total/n)
		for j := range rs {
			a := rng.Uint32()
			rs[j] = policy.Range4{Lo: a, Hi: a + uint32(rng.IntN(4))}
		}
		lists = append(lists, policy.BuildList(fmt.Sprint("l", i), rs, nil))
		bits = append(bits, 1<<(i%63))
	}
	return lists, bits
}

func BenchmarkSweepV4(b *testing.B) {
	for _, n := range []int{1, 2, 4, 8, 16, 63} {
		lists, bits := randomV4Lists(n, 1<<20, 1)
		b.Run(fmt.Sprint("scan/", n), func(b *testing.B) {
			for b.Loop() {
				sweepV4(lists, bits, func(lo, hi uint32, mask uint64, static uint32) {})
			}
		})
		b.Run(fmt.Sprint("heap/", n), func(b *testing.B) {
			sets := newStaticSets()
			for b.Loop() {
				sweepV4Ways(lists, bits, make([]uint32, n), sets, func(lo, hi uint32, mask uint64, static uint32) {})
			}
		})
	}
}

// TestSweepsAgree: the heap sweep, which buildV4 takes for many lists,
// cuts the addresses into the scan's segments with the scan's masks,
// ranges at both ends of the space included.
func TestSweepsAgree(t *testing.T) {
	type seg struct {
		lo, hi uint32
		mask   uint64
	}
	for n := range 12 {
		lists, bits := randomV4Lists(n+1, 4000, uint64(n))
		lists[0].V4 = policy.MergeRanges4(append(lists[0].V4, policy.Range4{Lo: 0, Hi: 3}, policy.Range4{Lo: 0xfffffff0, Hi: 0xffffffff}))
		var scan, heap []seg
		sweepV4(lists, bits, func(lo, hi uint32, mask uint64, static uint32) { scan = append(scan, seg{lo, hi, mask}) })
		sweepV4Ways(lists, bits, make([]uint32, len(lists)), newStaticSets(), func(lo, hi uint32, mask uint64, static uint32) {
			if static != 0 {
				t.Fatalf("%d lists: static set %d without static ways", n+1, static)
			}
			heap = append(heap, seg{lo, hi, mask})
		})
		if !slices.Equal(scan, heap) {
			t.Fatalf("%d lists: the sweeps disagree: %d segments against %d", n+1, len(scan), len(heap))
		}
		if len(scan) < 4000 || scan[0].lo != 0 || scan[len(scan)-1].hi != 0xffffffff {
			t.Fatalf("%d lists: %d segments from %#x to %#x", n+1, len(scan), scan[0].lo, scan[len(scan)-1].hi)
		}
	}
}

package compile

import (
	"slices"
	"unsafe"
)

// staticSets numbers the sets of static ways (policy.ListUse.Static: the
// ways of naming lists past the first abi.MaxLists, which take no bit of
// the mask) that addresses are in; set 0 is the empty one. A set is its
// ways, sorted.
type staticSets struct {
	sets   [][]uint32
	of     map[string]uint32 // a set's bytes -> its id
	unions map[[2]uint32]uint32
}

func newStaticSets() *staticSets {
	return &staticSets{sets: [][]uint32{nil}, of: map[string]uint32{"": 0}, unions: map[[2]uint32]uint32{}}
}

// id is the number of the set of ways, sorted; ways is not kept.
func (s *staticSets) id(ways []uint32) uint32 {
	if len(ways) == 0 { // most addresses and sides: no map lookup
		return 0
	}
	if id, ok := s.of[string(waysBytes(ways))]; ok { // no allocation
		return id
	}
	id := uint32(len(s.sets))
	ways = slices.Clone(ways)
	s.sets = append(s.sets, ways)
	s.of[string(waysBytes(ways))] = id
	return id
}

// union is the number of the union of sets a and b.
func (s *staticSets) union(a, b uint32) uint32 {
	switch {
	case a == b || b == 0:
		return a
	case a == 0:
		return b
	case a > b:
		a, b = b, a
	}
	if u, ok := s.unions[[2]uint32{a, b}]; ok {
		return u
	}
	var ways []uint32
	x, y := s.sets[a], s.sets[b]
	for len(x) > 0 || len(y) > 0 {
		switch {
		case len(y) == 0 || len(x) > 0 && x[0] < y[0]:
			ways, x = append(ways, x[0]), x[1:]
		case len(x) == 0 || y[0] < x[0]:
			ways, y = append(ways, y[0]), y[1:]
		default:
			ways, x, y = append(ways, x[0]), x[1:], y[1:]
		}
	}
	u := s.id(ways)
	s.unions[[2]uint32{a, b}] = u
	return u
}

func waysBytes(ways []uint32) []byte {
	if len(ways) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&ways[0])), 4*len(ways))
}

package policy

import (
	crand "crypto/rand"
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/rampart-fw/rampart/internal/abi"
)

// ListUse is how a policy's rules name the lists that entries check by
// membership (SplitSide's masked lists). Up to MaxLists lists take a bit
// each of the data plane's 64-bit membership mask (bpf/common.h), in the
// order rules first name them. Past that, lists that exactly the same rule
// sides name are one *way*: an entry tests its side's lists together (any
// of their bits), so to every entry they are one list, their union, and
// they share a bit (a rule naming 250 country lists takes one). The first
// MaxLists ways take a bit each, those of lists that take in-place changes
// first, then in the order rules first name them; the rest are *static*:
// they take no bit, and entries check them by a bit of the address class's row
// (Static). A shared bit takes in-place additions, which set it, but no
// removals, which would clear it for the other lists too; a static list
// takes no in-place change at all, as a change to a class's row would be a
// change to every address of the class.
//
// A side is told by a random 128-bit key, and a list's signature is the
// XOR of the keys of the sides naming it, as the classifier's eqs are:
// kept as a sum, a signature changes in O(1) when a rule is added or
// undone. The keys are drawn from the system's random source for every
// ListUse, so that no policy can be written whose different sets of sides
// collide; two do with a chance of about 2⁻¹²⁸.
type ListUse struct {
	order []string             // the lists, as rules first name them
	sig   map[string][2]uint64 // list -> XOR of its sides' keys
	ways  map[[2]uint64]int    // signature -> lists that have it
	keys  [][2]uint64          // by side, in the order sides were counted
	// A side's lists are told by the XOR of the lists' own keys: a
	// static side takes a bit of the rows (bpf/common.h's MAX_ROW_BITS).
	listKey map[string][2]uint64
	sides   map[[2]uint64]int // the lists of a side -> sides naming them
	rng     *rand.ChaCha8
	// live ranks the lists that take in-place changes, from 1 (0: none):
	// past MaxLists ways, theirs take bits first, by rank.
	live func(list string) int
}

// The ranks of lists that take in-place changes (Policy.ListUse): one
// holding some, whose changes must stay enforced; one CrowdSec feeds; one
// Policy.Live names.
const (
	liveHeld = 1 + iota
	liveFed
	liveAsked
	liveRanks = liveAsked
)

// MaxListWays bounds the ways a policy names lists in: the IPv4 sweep
// keeps the ways an address is in, and a static set is a class's.
const MaxListWays = 4096

func NewListUse() *ListUse {
	var seed [32]byte
	crand.Read(seed[:]) // never fails (crypto/rand)
	return &ListUse{sig: map[string][2]uint64{}, ways: map[[2]uint64]int{}, listKey: map[string][2]uint64{}, sides: map[[2]uint64]int{},
		rng: rand.NewChaCha8(seed)}
}

// Fits says why the lists do not fit the data plane, or nil.
func (u *ListUse) Fits() error {
	if u.Ways() > MaxListWays {
		return fmt.Errorf("rules refer to %d distinct lists in %d distinct ways; at most %d ways are supported (lists that exactly the same rules name count once, inline prefixes take none, and a list takes any number of files)", u.Lists(), u.Ways(), MaxListWays)
	}
	if u.Ways() > MaxLists && len(u.sides) > abi.MaxRowBits {
		return fmt.Errorf("rules name %d distinct sets of lists; with lists named in more than %d ways, at most %d are supported", len(u.sides), MaxLists, abi.MaxRowBits)
	}
	return nil
}

// Add counts rule r's sides, and returns what undoes that: undos go in
// the reverse order of their Adds.
func (u *ListUse) Add(r *Rule, lists map[string]*List) (undo func()) {
	order, sides := len(u.order), len(u.keys)
	type named struct {
		list string
		key  [2]uint64
	}
	var done []named
	var sideLists [][2]uint64
	for _, a := range r.Alternatives() {
		src, _ := SplitSide(a.Src, a.SrcBits, lists)
		dst, _ := SplitSide(a.Dst, a.DstBits, lists)
		for _, side := range [][]string{src, dst} {
			if len(side) == 0 {
				continue
			}
			key := [2]uint64{u.rng.Uint64(), u.rng.Uint64()}
			u.keys = append(u.keys, key)
			var lists [2]uint64
			for _, name := range distinct(side) {
				if _, ok := u.sig[name]; !ok {
					u.order = append(u.order, name)
					u.ways[[2]uint64{}]++
					u.listKey[name] = [2]uint64{u.rng.Uint64(), u.rng.Uint64()}
				}
				u.xor(name, key)
				done = append(done, named{name, key})
				k := u.listKey[name]
				lists = [2]uint64{lists[0] ^ k[0], lists[1] ^ k[1]}
			}
			u.sides[lists]++
			sideLists = append(sideLists, lists)
		}
	}
	return func() {
		for _, d := range slices.Backward(done) {
			u.xor(d.list, d.key)
		}
		for _, l := range sideLists {
			if u.sides[l]--; u.sides[l] == 0 {
				delete(u.sides, l)
			}
		}
		for _, name := range u.order[order:] {
			u.forget(u.sig[name])
			delete(u.sig, name)
			delete(u.listKey, name)
		}
		u.order, u.keys = u.order[:order], u.keys[:sides]
	}
}

// distinct are names without repeats, in order: a side may name a list
// twice, which must count once (XORed twice, its key would cancel).
func distinct(names []string) []string {
	if len(names) < 2 {
		return names
	}
	seen := make(map[string]bool, len(names))
	return slices.DeleteFunc(slices.Clone(names), func(n string) bool {
		if seen[n] {
			return true
		}
		seen[n] = true
		return false
	})
}

// xor moves list to the signature with key's side toggled.
func (u *ListUse) xor(list string, key [2]uint64) {
	s := u.sig[list]
	u.forget(s)
	s = [2]uint64{s[0] ^ key[0], s[1] ^ key[1]}
	u.sig[list] = s
	u.ways[s]++
}

func (u *ListUse) forget(sig [2]uint64) {
	if u.ways[sig]--; u.ways[sig] == 0 {
		delete(u.ways, sig)
	}
}

// Ways is how many ways the lists are named in: one a list up to
// MaxLists lists, else one a signature. At most MaxListWays fit a policy.
func (u *ListUse) Ways() int {
	if len(u.order) <= MaxLists {
		return len(u.order)
	}
	return len(u.ways)
}

// Lists is how many lists the rules name.
func (u *ListUse) Lists() int { return len(u.order) }

// Bits are the lists' bits, in the order rules first name them (of lists,
// or of ways past MaxLists lists); past MaxLists ways, the lists of those
// beyond take none (0): Static numbers them.
func (u *ListUse) Bits() map[string]uint64 {
	bits := make(map[string]uint64, len(u.order))
	if len(u.order) <= MaxLists {
		for i, name := range u.order {
			bits[name] = 1 << i
		}
		return bits
	}
	for name, way := range u.numbered() {
		if way < MaxLists {
			bits[name] = 1 << way
		} else {
			bits[name] = 0
		}
	}
	return bits
}

// Static numbers, from 1, the ways past the first MaxLists (those
// without a bit), by list; nil when every list has a bit.
func (u *ListUse) Static() map[string]uint32 {
	if len(u.order) <= MaxLists || len(u.ways) <= MaxLists {
		return nil
	}
	static := map[string]uint32{}
	for name, way := range u.numbered() {
		if way >= MaxLists {
			static[name] = uint32(way - MaxLists + 1)
		}
	}
	return static
}

// numbered numbers the ways from 0, by list: those of the lists that take
// in-place changes first, by their rank (live), then in the order rules
// first name them.
func (u *ListUse) numbered() map[string]int {
	of := make(map[[2]uint64]int, len(u.ways))
	for rank := 1; u.live != nil && rank <= liveRanks; rank++ {
		for _, name := range u.order {
			if _, ok := of[u.sig[name]]; !ok && u.live(name) == rank {
				of[u.sig[name]] = len(of)
			}
		}
	}
	out := make(map[string]int, len(u.order))
	for _, name := range u.order {
		s := u.sig[name]
		w, ok := of[s]
		if !ok {
			w = len(of)
			of[s] = w
		}
		out[name] = w
	}
	return out
}

package policy

import (
	crand "crypto/rand"
	"math/rand/v2"
	"slices"
)

// ListUse is how a policy's rules name the lists that entries check by
// membership (SplitSide's masked lists), each of which needs a bit of the
// data plane's 64-bit membership mask (bpf/common.h). Up to MaxLists
// lists take a bit each, in the order rules first name them. Past that,
// lists that exactly the same rule sides name share one: an entry tests
// its side's lists together (any of their bits), so to every entry such
// lists are one list, their union. A policy then names any number of
// lists in at most MaxLists distinct ways (a rule naming 250 country
// lists takes one bit). A shared bit takes in-place additions, which set
// it, but no removals, which would clear it for the other lists too.
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
	rng   *rand.ChaCha8
}

func NewListUse() *ListUse {
	var seed [32]byte
	crand.Read(seed[:]) // never fails (crypto/rand)
	return &ListUse{sig: map[string][2]uint64{}, ways: map[[2]uint64]int{}, rng: rand.NewChaCha8(seed)}
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
	for _, a := range r.Alternatives() {
		src, _ := SplitSide(a.Src, a.SrcBits, lists)
		dst, _ := SplitSide(a.Dst, a.DstBits, lists)
		for _, side := range [][]string{src, dst} {
			if len(side) == 0 {
				continue
			}
			key := [2]uint64{u.rng.Uint64(), u.rng.Uint64()}
			u.keys = append(u.keys, key)
			for _, name := range distinct(side) {
				if _, ok := u.sig[name]; !ok {
					u.order = append(u.order, name)
					u.ways[[2]uint64{}]++
				}
				u.xor(name, key)
				done = append(done, named{name, key})
			}
		}
	}
	return func() {
		for _, d := range slices.Backward(done) {
			u.xor(d.list, d.key)
		}
		for _, name := range u.order[order:] {
			u.forget(u.sig[name])
			delete(u.sig, name)
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

// Need is how many bits the lists need: one a list up to MaxLists, else
// one a signature.
func (u *ListUse) Need() int {
	if len(u.order) <= MaxLists {
		return len(u.order)
	}
	return len(u.ways)
}

// Lists is how many lists the rules name.
func (u *ListUse) Lists() int { return len(u.order) }

// Bits are the lists' bits, in the order rules first name them (of lists,
// or of signatures past MaxLists lists); past MaxLists signatures, those
// beyond take none (0), and Need says the policy does not fit.
func (u *ListUse) Bits() map[string]uint64 {
	bits := make(map[string]uint64, len(u.order))
	if len(u.order) <= MaxLists {
		for i, name := range u.order {
			bits[name] = 1 << i
		}
		return bits
	}
	of := map[[2]uint64]uint64{}
	for _, name := range u.order {
		s := u.sig[name]
		b, ok := of[s]
		if !ok {
			if len(of) < MaxLists {
				b = 1 << len(of)
			}
			of[s] = b
		}
		bits[name] = b
	}
	return bits
}

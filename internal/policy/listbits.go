package policy

import "slices"

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
// A side is told by a 128-bit pseudo-random key, and a list's signature
// is the XOR of the keys of the sides naming it, as the classifier's eqs
// are: two different sets of sides share one with a chance of about
// 2⁻¹²⁸.
type ListUse struct {
	order []string             // the lists, as rules first name them
	sig   map[string][2]uint64 // list -> XOR of its sides' keys
	sides uint64               // sides counted
}

func NewListUse() *ListUse { return &ListUse{sig: map[string][2]uint64{}} }

// Add counts rule r's sides, and returns what undoes that: undos go in
// the reverse order of their Adds.
func (u *ListUse) Add(r *Rule, lists map[string]*List) (undo func()) {
	order, sides := len(u.order), u.sides
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
			key := sideKey(u.sides)
			u.sides++
			for i, name := range side {
				if slices.Contains(side[:i], name) { // named twice: once
					continue
				}
				if _, ok := u.sig[name]; !ok {
					u.order = append(u.order, name)
				}
				u.xor(name, key)
				done = append(done, named{name, key})
			}
		}
	}
	return func() {
		for _, d := range done {
			u.xor(d.list, d.key)
		}
		for _, name := range u.order[order:] {
			delete(u.sig, name)
		}
		u.order, u.sides = u.order[:order], sides
	}
}

func (u *ListUse) xor(list string, key [2]uint64) {
	s := u.sig[list]
	u.sig[list] = [2]uint64{s[0] ^ key[0], s[1] ^ key[1]}
}

// sideKey is side n's key (splitmix64 of 2n+1 and 2n+2).
func sideKey(n uint64) [2]uint64 {
	var k [2]uint64
	for i := range k {
		z := (2*n + uint64(i) + 1) * 0x9e3779b97f4a7c15
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		k[i] = z ^ z>>31
	}
	return k
}

// Bits are the lists' bits, and how many bits they need: past MaxLists,
// the lists beyond take none (0), and the caller refuses the policy.
func (u *ListUse) Bits() (bits map[string]uint64, need int) {
	bits = make(map[string]uint64, len(u.order))
	if len(u.order) <= MaxLists {
		for i, name := range u.order {
			bits[name] = 1 << i
		}
		return bits, len(u.order)
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
	return bits, len(of)
}

// Need is how many bits the lists need (Bits' need, without the bits).
func (u *ListUse) Need() int {
	if len(u.order) <= MaxLists {
		return len(u.order)
	}
	seen := make(map[[2]uint64]bool, MaxLists+1)
	for _, name := range u.order {
		seen[u.sig[name]] = true
	}
	return len(seen)
}

// Lists is how many lists the rules name.
func (u *ListUse) Lists() int { return len(u.order) }

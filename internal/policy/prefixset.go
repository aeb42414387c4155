package policy

import "net/netip"

// PrefixSet answers membership by masking the address to each prefix length
// present and looking it up: cost grows with the number of distinct lengths,
// not with the number of prefixes. It is the reference, not the data plane.
type PrefixSet struct {
	byLen map[int]map[netip.Prefix]struct{}
}

// NewPrefixSet builds a set from prefixes (already masked).
func NewPrefixSet(prefixes []netip.Prefix) *PrefixSet {
	s := &PrefixSet{byLen: map[int]map[netip.Prefix]struct{}{}}
	for _, p := range prefixes {
		s.Add(p)
	}
	return s
}

// lengthKey keeps IPv6 prefix lengths apart from IPv4 ones.
func lengthKey(is6 bool, bits int) int {
	if is6 {
		return 1000 + bits
	}
	return bits
}

// Add inserts a prefix; bits beyond its length are cleared.
func (s *PrefixSet) Add(p netip.Prefix) {
	p = p.Masked()
	k := lengthKey(p.Addr().Is6(), p.Bits())
	if s.byLen[k] == nil {
		s.byLen[k] = map[netip.Prefix]struct{}{}
	}
	s.byLen[k][p] = struct{}{}
}

// Contains reports whether any prefix of the set covers addr.
func (s *PrefixSet) Contains(addr netip.Addr) bool {
	for bits := 0; bits <= addr.BitLen(); bits++ {
		m := s.byLen[lengthKey(addr.Is6(), bits)]
		if m == nil {
			continue
		}
		if p, err := addr.Prefix(bits); err == nil {
			if _, ok := m[p]; ok {
				return true
			}
		}
	}
	return false
}

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

// Add inserts a prefix; bits beyond its length are cleared.
func (s *PrefixSet) Add(p netip.Prefix) {
	p = p.Masked()
	bits := p.Bits()
	if p.Addr().Is6() {
		bits += 1000 // IPv6 lengths are kept apart from IPv4 ones
	}
	m := s.byLen[bits]
	if m == nil {
		m = map[netip.Prefix]struct{}{}
		s.byLen[bits] = m
	}
	m[p] = struct{}{}
}

// Delete removes a prefix.
func (s *PrefixSet) Delete(p netip.Prefix) {
	p = p.Masked()
	bits := p.Bits()
	if p.Addr().Is6() {
		bits += 1000
	}
	delete(s.byLen[bits], p)
}

// Contains reports whether any prefix of the set covers addr.
func (s *PrefixSet) Contains(addr netip.Addr) bool {
	off := 0
	if addr.Is6() {
		off = 1000
	}
	for bits, m := range s.byLen {
		if bits < off || bits > off+128 {
			continue
		}
		p, err := addr.Prefix(bits - off)
		if err != nil {
			continue
		}
		if _, ok := m[p]; ok {
			return true
		}
	}
	return false
}

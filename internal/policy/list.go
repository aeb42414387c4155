package policy

import (
	"cmp"
	"net/netip"
	"slices"
	"sort"
	"time"
)

// Range4 is an inclusive range of IPv4 addresses as host-order integers.
type Range4 struct{ Lo, Hi uint32 }

// List is a named set of addresses. IPv4 is held as sorted, disjoint,
// non-adjacent ranges (8 bytes each whatever the prefix mix, and the form the
// compiler sweeps); IPv6 as masked, sorted, distinct prefixes.
type List struct {
	Name    string
	Family  int // 0 (both), 4 or 6: entries of the other family are refused
	V4      []Range4
	V6      []netip.Prefix
	Entries int // entries read, before merging
	Skipped int // bad lines skipped under --lenient
	// FirstSkipped locates and explains the first skipped line.
	FirstSkipped string
	Ops          []ListOp
	v6           *PrefixSet
}

// ListOp is an in-place change to a live list (`rampart list add|del`). Ops
// apply in order over the list's contents: the latest op covering an address
// decides its membership.
type ListOp struct {
	List    string       `json:"list"`
	Prefix  netip.Prefix `json:"prefix"`
	Add     bool         `json:"add"`
	Expires time.Time    `json:"expires,omitzero"` // zero: never
}

// Contains reports whether addr is in the list, ops included.
func (l *List) Contains(addr netip.Addr) bool {
	in := l.baseContains(addr)
	for _, op := range l.Ops {
		if op.Prefix.Contains(addr) {
			in = op.Add
		}
	}
	return in
}

func (l *List) baseContains(addr netip.Addr) bool {
	if addr.Is4() {
		a := V4ToUint(addr)
		i := sort.Search(len(l.V4), func(i int) bool { return l.V4[i].Hi >= a })
		return i < len(l.V4) && l.V4[i].Lo <= a
	}
	return l.v6.Contains(addr)
}

// Len is the number of IPv4 ranges plus IPv6 prefixes held.
func (l *List) Len() int { return len(l.V4) + len(l.V6) }

// V4ToUint is an IPv4 address as a host-order integer.
func V4ToUint(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// UintToV4 is the inverse of V4ToUint.
func UintToV4(a uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)})
}

// PrefixRange4 is the address range an IPv4 prefix covers.
func PrefixRange4(p netip.Prefix) Range4 {
	lo := V4ToUint(p.Masked().Addr())
	return Range4{lo, lo | uint32(uint64(1)<<(32-p.Bits())-1)}
}

// listBuilder collects entries from files and inline prefixes.
type listBuilder struct {
	v4        []Range4
	v6        []netip.Prefix
	entries   int
	skipped   int
	firstSkip string
}

func (b *listBuilder) addPrefix(p netip.Prefix) {
	b.entries++
	if p.Addr().Is4() {
		b.v4 = append(b.v4, PrefixRange4(p))
	} else {
		b.v6 = append(b.v6, p.Masked())
	}
}

func (b *listBuilder) build(name string, family int) *List {
	l := &List{Name: name, Family: family, Entries: b.entries, Skipped: b.skipped, FirstSkipped: b.firstSkip}
	l.V4 = MergeRanges4(b.v4)
	slices.SortFunc(b.v6, ComparePrefix)
	l.V6 = slices.Compact(b.v6)
	l.v6 = NewPrefixSet(l.V6)
	return l
}

// NewList builds a list from prefixes; tests and inline prefixes use it.
func NewList(name string, prefixes []netip.Prefix) *List {
	var b listBuilder
	for _, p := range prefixes {
		b.addPrefix(p)
	}
	return b.build(name, 0)
}

// MergeRanges4 sorts ranges and merges overlapping and adjacent ones, in
// place. Already-sorted input (most published lists) sorts in linear time.
func MergeRanges4(rs []Range4) []Range4 {
	slices.SortFunc(rs, func(a, b Range4) int { return cmp.Compare(a.Lo, b.Lo) })
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 && (out[n-1].Hi == ^uint32(0) || r.Lo <= out[n-1].Hi+1) {
			out[n-1].Hi = max(out[n-1].Hi, r.Hi)
			continue
		}
		out = append(out, r)
	}
	return slices.Clip(out)
}

// ComparePrefix orders by address, then shorter first: an ancestor sorts
// before everything it contains.
func ComparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(a.Bits(), b.Bits())
}

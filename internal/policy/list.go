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

// List is a named set of addresses, each family as sorted, disjoint,
// non-adjacent ranges: whatever the prefix mix, adjacent and nested entries
// are merged, and ranges are the form the compiler sweeps.
type List struct {
	Name    string
	Family  int // 0 (both), 4 or 6: entries of the other family are refused
	V4      []Range4
	V6      []Range6
	Entries int // entries read, before merging
	Skipped int // bad lines skipped under --lenient
	// FirstSkipped locates and explains the first skipped line.
	FirstSkipped string
	Ops          []ListOp
	// Inline is set for a rule's inline prefix (a BGP FlowSpec route's
	// too): the one prefix the list holds, which nothing changes live.
	Inline netip.Prefix
}

// ListOp is an in-place change to a live list (`rampart list add|del`). Ops
// apply in order over the list's contents: the latest op covering an address
// decides its membership.
type ListOp struct {
	List    string       `json:"list"`
	Prefix  netip.Prefix `json:"prefix"`
	Add     bool         `json:"add"`
	Expires time.Time    `json:"expires,omitzero"` // zero: never
	// Seq numbers the ops of a namespace's journal in the order they were
	// made: a generation that compiled ops into its tables names the last
	// it took.
	Seq uint64 `json:"seq,omitempty"`
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
	a := U128Of(addr)
	i := sort.Search(len(l.V6), func(i int) bool { return l.V6[i].Hi.Cmp(a) >= 0 })
	return i < len(l.V6) && l.V6[i].Lo.Cmp(a) <= 0
}

// Addresses counts the addresses a list covers, per family: IPv4 exactly,
// IPv6 as a float (2^128 does not fit an integer).
func (l *List) Addresses() (v4 uint64, v6 float64) {
	for _, r := range l.V4 {
		v4 += uint64(r.Hi-r.Lo) + 1
	}
	for _, r := range l.V6 {
		v6 += float64(r.Hi.Hi-r.Lo.Hi)*0x1p64 + float64(r.Hi.Lo) - float64(r.Lo.Lo) + 1
	}
	return v4, v6
}

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
	v6        []Range6
	entries   int
	skipped   int
	firstSkip string
}

func (b *listBuilder) addPrefix(p netip.Prefix) {
	b.entries++
	if p.Addr().Is4() {
		b.v4 = append(b.v4, PrefixRange4(p))
	} else {
		b.v6 = append(b.v6, PrefixRange6(p))
	}
}

func (b *listBuilder) build(name string, family int) *List {
	l := BuildList(name, b.v4, b.v6)
	l.Family, l.Entries, l.Skipped, l.FirstSkipped = family, b.entries, b.skipped, b.firstSkip
	return l
}

// BuildList makes a list of ranges, which it sorts and merges in place.
func BuildList(name string, v4 []Range4, v6 []Range6) *List {
	n := len(v4) + len(v6)
	return &List{Name: name, V4: MergeRanges4(v4), V6: MergeRanges6(v6), Entries: n}
}

// NewList builds a list from prefixes; tests use it.
func NewList(name string, prefixes []netip.Prefix) *List {
	var b listBuilder
	for _, p := range prefixes {
		b.addPrefix(p)
	}
	return b.build(name, 0)
}

// InlineList is the list of a rule's inline prefix p, named by it.
func InlineList(p netip.Prefix) *List {
	p = p.Masked()
	return inlineList(p, p.String())
}

// inlineList is InlineList of a masked prefix named already: what NewList
// makes of it, without the builder's merging, since a feed names
// thousands.
func inlineList(p netip.Prefix, name string) *List {
	l := &List{Name: name, Entries: 1, Inline: p}
	if p.Addr().Is4() {
		l.V4 = []Range4{PrefixRange4(p)}
	} else {
		l.V6 = []Range6{PrefixRange6(p)}
	}
	return l
}

// MergeRanges4 sorts ranges and merges overlapping and adjacent ones, in
// place.
func MergeRanges4(rs []Range4) []Range4 {
	sortRanges4(rs)
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

// sortRanges4 orders ranges by start: nothing to do for already-sorted input
// (most published lists), else a two-pass radix sort on 16-bit digits, which
// at ten million ranges is several times faster than a comparison sort.
func sortRanges4(rs []Range4) {
	if slices.IsSortedFunc(rs, func(a, b Range4) int { return cmp.Compare(a.Lo, b.Lo) }) {
		return
	}
	if len(rs) < 1<<16 {
		slices.SortFunc(rs, func(a, b Range4) int { return cmp.Compare(a.Lo, b.Lo) })
		return
	}
	tmp := make([]Range4, len(rs))
	src, dst := rs, tmp
	for shift := 0; shift < 32; shift += 16 {
		var count [1<<16 + 1]int
		for _, r := range src {
			count[(r.Lo>>shift)&0xffff+1]++
		}
		for i := 1; i < len(count); i++ {
			count[i] += count[i-1]
		}
		for _, r := range src {
			d := (r.Lo >> shift) & 0xffff
			dst[count[d]] = r
			count[d]++
		}
		src, dst = dst, src
	}
	// Two passes: the result is back in rs.
}

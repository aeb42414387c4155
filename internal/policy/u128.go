package policy

import (
	"cmp"
	"encoding/binary"
	"math/bits"
	"net/netip"
	"runtime"
	"slices"
	"sync"
)

// U128 is an IPv6 address as a number.
type U128 struct{ Hi, Lo uint64 }

// U128Of is an IPv6 address (an IPv4 one as ::ffff:a.b.c.d) as a number.
func U128Of(a netip.Addr) U128 {
	b := a.As16()
	return U128{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}

// Addr is the number as an IPv6 address.
func (u U128) Addr() netip.Addr {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], u.Hi)
	binary.BigEndian.PutUint64(b[8:], u.Lo)
	return netip.AddrFrom16(b)
}

// Cmp orders numbers.
func (u U128) Cmp(v U128) int {
	if c := cmp.Compare(u.Hi, v.Hi); c != 0 {
		return c
	}
	return cmp.Compare(u.Lo, v.Lo)
}

// Add1 is u+1 (wrapping at 2^128).
func (u U128) Add1() U128 {
	lo, carry := bits.Add64(u.Lo, 1, 0)
	return U128{u.Hi + carry, lo}
}

// Sub1 is u-1 (wrapping at 0).
func (u U128) Sub1() U128 {
	lo, borrow := bits.Sub64(u.Lo, 1, 0)
	return U128{u.Hi - borrow, lo}
}

// Max128 is the largest address.
var Max128 = U128{^uint64(0), ^uint64(0)}

// trailingZeros counts trailing zero bits (128 for zero).
func (u U128) trailingZeros() int {
	if u.Lo != 0 {
		return bits.TrailingZeros64(u.Lo)
	}
	return 64 + bits.TrailingZeros64(u.Hi)
}

// LowMask is the number whose last n bits are set.
func LowMask(n int) U128 {
	switch {
	case n <= 0:
		return U128{}
	case n < 64:
		return U128{0, 1<<n - 1}
	case n < 128:
		return U128{1<<(n-64) - 1, ^uint64(0)}
	}
	return Max128
}

// Or is u | v.
func (u U128) Or(v U128) U128     { return U128{u.Hi | v.Hi, u.Lo | v.Lo} }
func (u U128) andNot(v U128) U128 { return U128{u.Hi &^ v.Hi, u.Lo &^ v.Lo} }

// Range6 is an inclusive range of IPv6 addresses.
type Range6 struct{ Lo, Hi U128 }

// PrefixRange6 is the address range an IPv6 prefix covers.
func PrefixRange6(p netip.Prefix) Range6 {
	lo := U128Of(p.Masked().Addr())
	return Range6{lo, lo.Or(LowMask(128 - p.Bits()))}
}

// Cover calls emit for the fewest prefixes that cover exactly [lo, hi] of a
// bits-wide space (32 or 128), each as its first address and length.
func Cover(lo, hi U128, width int, emit func(first U128, length int)) {
	for {
		length, last := CoverStep(lo, hi, width)
		emit(lo, length)
		if last.Cmp(hi) >= 0 {
			return
		}
		lo = last.Add1()
	}
}

// CoverStep is Cover's first prefix of [lo, hi]: the largest block aligned
// at lo that ends by hi, as its length and last address.
func CoverStep(lo, hi U128, width int) (length int, last U128) {
	size := min(lo.trailingZeros(), width)
	for size > 0 && lo.Or(LowMask(size)).Cmp(hi) > 0 {
		size--
	}
	return width - size, lo.Or(LowMask(size))
}

// MergeRanges6 sorts ranges and merges overlapping and adjacent ones, in
// place.
func MergeRanges6(rs []Range6) []Range6 {
	sortRanges6(rs)
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 && (out[n-1].Hi == Max128 || r.Lo.Cmp(out[n-1].Hi.Add1()) <= 0) {
			if r.Hi.Cmp(out[n-1].Hi) > 0 {
				out[n-1].Hi = r.Hi
			}
			continue
		}
		out = append(out, r)
	}
	return out[:len(out):len(out)]
}

// sortRanges6 orders ranges by start: nothing to do for sorted input, else
// a radix sort on the start's eight 16-bit digits, least significant first,
// skipping a digit every range shares (the zeros below a prefix, the /32 a
// list sits in): at millions of ranges several times faster than a
// comparison sort.
func sortRanges6(rs []Range6) {
	byLo := func(a, b Range6) int { return a.Lo.Cmp(b.Lo) }
	if slices.IsSortedFunc(rs, byLo) {
		return
	}
	if len(rs) < 1<<16 {
		slices.SortFunc(rs, byLo)
		return
	}
	// A radix sort on the high 64 bits, then runs of equal high bits (rare
	// but for /128s in one /64) by the low ones. Each pass counts and
	// scatters a part of the ranges per CPU; a part's ranges of one digit
	// go after those of the parts before it, so the sort stays stable.
	digit := func(r Range6, d int) int { return int(r.Lo.Hi>>(16*d)) & 0xffff }
	parts := min(runtime.GOMAXPROCS(0), 8)
	part := func(p int, s []Range6) []Range6 { return s[p*len(s)/parts : (p+1)*len(s)/parts] }
	count := make([][1 << 16]int, parts)
	tmp := make([]Range6, len(rs))
	src, dst := rs, tmp
	var wg sync.WaitGroup
	each := func(f func(p int)) {
		for p := range parts {
			wg.Go(func() { f(p) })
		}
		wg.Wait()
	}
	for d := 0; d < 4; d++ {
		each(func(p int) {
			c := &count[p]
			clear(c[:])
			for _, r := range part(p, src) {
				c[digit(r, d)]++
			}
		})
		// Where each part's ranges of each digit start; a digit all ranges
		// share leaves them where they are.
		at := 0
		same := false
		for k := range 1 << 16 {
			first := at
			for p := range parts {
				n := count[p][k]
				count[p][k] = at
				at += n
			}
			same = same || at-first == len(src)
		}
		if same {
			continue
		}
		each(func(p int) {
			c := &count[p]
			for _, r := range part(p, src) {
				k := digit(r, d)
				dst[c[k]] = r
				c[k]++
			}
		})
		src, dst = dst, src
	}
	if &src[0] != &rs[0] {
		copy(rs, src)
	}
	for i := 0; i < len(rs); {
		j := i + 1
		for j < len(rs) && rs[j].Lo.Hi == rs[i].Lo.Hi {
			j++
		}
		if j-i > 1 {
			slices.SortFunc(rs[i:j], byLo)
		}
		i = j
	}
}

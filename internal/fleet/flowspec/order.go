package flowspec

import "bytes"

// Compare orders two routes of one family by RFC 8955 §5.1 (with RFC 8956
// §4 for IPv6 offsets): negative when a has precedence, i.e. matches
// before b. GoBGP's CompareFlowSpecNLRI is not used: nothing in GoBGP
// calls it, and its IPv6 branch compares prefixes shorter than /64 wrongly.
func Compare(a, b *Route) int {
	for i := 0; ; i++ {
		switch {
		case i == len(a.Components) && i == len(b.Components):
			return 0
		case i == len(a.Components): // the route with fewer components loses
			return 1
		case i == len(b.Components):
			return -1
		}
		ca, cb := &a.Components[i], &b.Components[i]
		if ca.Type != cb.Type {
			// The route that has the lower type has precedence.
			return ca.Type - cb.Type
		}
		if ca.Type == TypeDst || ca.Type == TypeSrc {
			if c := comparePrefix(ca, cb); c != 0 {
				return c
			}
			continue
		}
		// The component data (operators and values) as a binary string:
		// of equal lengths the lower wins; of different lengths the
		// common prefix decides, and when it is equal the longer wins.
		da, db := ca.Raw[1:], cb.Raw[1:]
		if len(da) == len(db) {
			if c := bytes.Compare(da, db); c != 0 {
				return c
			}
			continue
		}
		n := min(len(da), len(db))
		if c := bytes.Compare(da[:n], db[:n]); c != 0 {
			return c
		}
		return len(db) - len(da)
	}
}

func comparePrefix(a, b *Component) int {
	if a.Offset != b.Offset { // the lower offset matches the more significant bits
		return a.Offset - b.Offset
	}
	pa, pb := a.Prefix, b.Prefix
	if pa.Overlaps(pb) {
		return pb.Bits() - pa.Bits() // the more specific first; equal: go on
	}
	return pa.Addr().Compare(pb.Addr())
}

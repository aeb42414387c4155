// Package flowspec turns BGP FlowSpec routes (RFC 8955 for IPv4, RFC 8956
// for IPv6) into rampart rules: the NLRI decoded from its wire bytes, the
// routes ordered by the RFCs' precedence (§5.1), each route's match
// written as rules of rampart's policy model, and a reference matcher
// written straight from the RFC text that the rules are tested against.
//
// The NLRI is decoded here, from the bytes GoBGP serializes again
// (components in the order GoBGP sorted them into; what it could not
// decode kept as it came), rather than read from GoBGP's structures: the
// ordering compares components as bytes, GoBGP passes on components it
// cannot decode as "unknown" ones, which rampart must refuse, and a decoder
// of our own is one that a fuzzer (FuzzDecode) holds to its encoder.
package flowspec

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
)

// Component types (RFC 8955 §4.2.2, RFC 8956 §3).
const (
	TypeDst       = 1
	TypeSrc       = 2
	TypeProto     = 3 // IPv6: the upper-layer protocol
	TypePort      = 4
	TypeDport     = 5
	TypeSport     = 6
	TypeICMPType  = 7
	TypeICMPCode  = 8
	TypeTCPFlags  = 9
	TypeLength    = 10
	TypeDSCP      = 11
	TypeFragment  = 12
	TypeFlowLabel = 13 // IPv6 only
)

var typeNames = [...]string{"", "dst", "src", "proto", "port", "dport", "sport", "icmp-type", "icmp-code", "tcp-flags", "length", "dscp", "fragment", "flow-label"}

// Op bits of an operator byte (RFC 8955 §4.2.1).
const (
	opEnd = 0x80
	opAnd = 0x40
	opLen = 0x30
	// numeric
	opLt = 0x04
	opGt = 0x02
	opEq = 0x01
	// bitmask
	opNot   = 0x02
	opMatch = 0x01
)

// Fragment bits (RFC 8955 §4.2.2.12).
const (
	FragDF  = 0x01 // don't fragment (IPv4 only)
	FragIsF = 0x02 // is a fragment other than the first
	FragFF  = 0x04 // first fragment
	FragLF  = 0x08 // last fragment
)

// Op is one {operator, value} pair of a numeric or bitmask component.
type Op struct {
	And   bool // ANDed with what precedes; else ORed
	Len   int  // value length in bytes: 1, 2, 4 or 8
	Bits  byte // lt|gt|eq (numeric) or not|match (bitmask)
	Value uint64
}

// Component is one match of a route.
type Component struct {
	Type   int
	Prefix netip.Prefix // types 1 and 2
	Offset int          // IPv6 prefixes: the first bit the pattern matches
	Ops    []Op         // the other types
	Raw    []byte       // the component as sent, type byte included: what §5.1 compares
}

// Route is a FlowSpec NLRI: components in increasing type order.
type Route struct {
	IPv6       bool
	Components []Component
}

// Get returns the route's component of a type, or nil.
func (r *Route) Get(typ int) *Component {
	for i := range r.Components {
		if r.Components[i].Type == typ {
			return &r.Components[i]
		}
	}
	return nil
}

func isBitmask(typ int) bool { return typ == TypeTCPFlags || typ == TypeFragment }

// Decode reads one FlowSpec NLRI, its length field included, and returns
// the rest of b.
func Decode(b []byte, ipv6 bool) (Route, []byte, error) {
	r := Route{IPv6: ipv6}
	if len(b) < 1 {
		return r, nil, fmt.Errorf("empty NLRI")
	}
	n, hdr := int(b[0]), 1
	if n >= 0xf0 {
		if len(b) < 2 {
			return r, nil, fmt.Errorf("NLRI length cut")
		}
		n, hdr = int(binary.BigEndian.Uint16(b)&0x0fff), 2
	}
	if len(b) < hdr+n {
		return r, nil, fmt.Errorf("NLRI of %d bytes, %d left", n, len(b)-hdr)
	}
	body, rest := b[hdr:hdr+n], b[hdr+n:]
	if n == 0 {
		return r, rest, fmt.Errorf("an NLRI without components")
	}
	last := 0
	for len(body) > 0 {
		typ := int(body[0])
		if typ <= last {
			return r, rest, fmt.Errorf("component type %d after %d: types must increase", typ, last)
		}
		if typ < TypeDst || typ > TypeFragment && !(ipv6 && typ == TypeFlowLabel) {
			return r, rest, fmt.Errorf("unknown component type %d", typ)
		}
		last = typ
		c := Component{Type: typ}
		var err error
		var used int
		if typ == TypeDst || typ == TypeSrc {
			c.Prefix, c.Offset, used, err = decodePrefix(body[1:], ipv6)
		} else {
			c.Ops, used, err = decodeOps(body[1:], isBitmask(typ))
		}
		if err != nil {
			return r, rest, fmt.Errorf("%s: %w", typeNames[typ], err)
		}
		c.Raw = body[:1+used]
		body = body[1+used:]
		r.Components = append(r.Components, c)
	}
	return r, rest, nil
}

func decodePrefix(b []byte, ipv6 bool) (netip.Prefix, int, int, error) {
	if len(b) < 1 {
		return netip.Prefix{}, 0, 0, fmt.Errorf("prefix length cut")
	}
	bits, off, i := int(b[0]), 0, 1
	size := 4
	if ipv6 {
		size = 16
		if len(b) < 2 {
			return netip.Prefix{}, 0, 0, fmt.Errorf("prefix offset cut")
		}
		off, i = int(b[1]), 2
	}
	if bits > size*8 || off > bits || ipv6 && off == bits && bits != 0 {
		return netip.Prefix{}, 0, 0, fmt.Errorf("prefix length %d, offset %d", bits, off)
	}
	// IPv6 sends bits off..bits-1 only, from the start of a byte.
	nbytes := (bits - off + 7) / 8
	if len(b) < i+nbytes {
		return netip.Prefix{}, 0, 0, fmt.Errorf("prefix of %d bits cut", bits)
	}
	var a [16]byte
	if off == 0 {
		copy(a[:], b[i:i+nbytes])
	} else {
		// Placing the pattern at bit off of the address is a shift.
		for k := range bits - off {
			if b[i+k/8]&(0x80>>(k%8)) != 0 {
				a[(off+k)/8] |= 0x80 >> ((off + k) % 8)
			}
		}
	}
	var addr netip.Addr
	if ipv6 {
		addr = netip.AddrFrom16(a)
	} else {
		addr = netip.AddrFrom4([4]byte(a[:4]))
	}
	// Bits past the length are padding, ignored (RFC 8956 §3.1).
	p, err := addr.Prefix(bits)
	if err != nil {
		return netip.Prefix{}, 0, 0, err
	}
	return p, off, i + nbytes, nil
}

func decodeOps(b []byte, bitmask bool) ([]Op, int, error) {
	var ops []Op
	i := 0
	for {
		if i >= len(b) {
			return nil, 0, fmt.Errorf("operator list not ended")
		}
		op := b[i]
		o := Op{And: op&opAnd != 0 && len(ops) > 0, Len: 1 << ((op & opLen) >> 4), Bits: op & 0x07}
		if op&0x08 != 0 || bitmask && op&0x04 != 0 {
			return nil, 0, fmt.Errorf("operator %#02x has reserved bits set", op)
		}
		if i+1+o.Len > len(b) {
			return nil, 0, fmt.Errorf("value of %d bytes cut", o.Len)
		}
		for _, v := range b[i+1 : i+1+o.Len] {
			o.Value = o.Value<<8 | uint64(v)
		}
		ops = append(ops, o)
		i += 1 + o.Len
		if op&opEnd != 0 {
			return ops, i, nil
		}
	}
}

// Encode writes the route as an NLRI, its length field included; Raw of
// each component is ignored. Tests and the lab use it to build routes.
func Encode(r Route) []byte {
	var body []byte
	for _, c := range r.Components {
		body = append(body, byte(c.Type))
		if c.Type == TypeDst || c.Type == TypeSrc {
			bits := c.Prefix.Bits()
			body = append(body, byte(bits))
			a := c.Prefix.Addr().AsSlice()
			if r.IPv6 {
				body = append(body, byte(c.Offset))
			}
			pat := make([]byte, (bits-c.Offset+7)/8)
			for k := range bits - c.Offset {
				if a[(c.Offset+k)/8]&(0x80>>((c.Offset+k)%8)) != 0 {
					pat[k/8] |= 0x80 >> (k % 8)
				}
			}
			body = append(body, pat...)
			continue
		}
		for i, o := range c.Ops {
			op := o.Bits & 0x07
			if o.And && i > 0 {
				op |= opAnd
			}
			if i == len(c.Ops)-1 {
				op |= opEnd
			}
			ln := 0
			for 1<<ln < o.Len {
				ln++
			}
			op |= byte(ln << 4)
			body = append(body, op)
			for k := o.Len - 1; k >= 0; k-- {
				body = append(body, byte(o.Value>>(8*k)))
			}
		}
	}
	if len(body) < 0xf0 {
		return append([]byte{byte(len(body))}, body...)
	}
	return append([]byte{0xf0 | byte(len(body)>>8), byte(len(body))}, body...)
}

// String renders the route the way `rampart flowspec show` prints it, e.g.
// "dst 192.0.2.0/24 proto =6 dport >=80&<=90 tcp-flags match(syn)".
func (r *Route) String() string {
	var parts []string
	for _, c := range r.Components {
		parts = append(parts, c.String())
	}
	return strings.Join(parts, " ")
}

func (c *Component) String() string {
	if c.Type == TypeDst || c.Type == TypeSrc {
		if c.Offset != 0 {
			return fmt.Sprintf("%s %s offset %d", typeNames[c.Type], c.Prefix, c.Offset)
		}
		return typeNames[c.Type] + " " + c.Prefix.String()
	}
	var b strings.Builder
	b.WriteString(typeNames[c.Type] + " ")
	for i, o := range c.Ops {
		if i > 0 {
			if o.And {
				b.WriteString("&")
			} else {
				b.WriteString(",")
			}
		}
		if isBitmask(c.Type) {
			if o.Bits&opNot != 0 {
				b.WriteString("!")
			}
			if o.Bits&opMatch != 0 {
				b.WriteString("=")
			}
			fmt.Fprintf(&b, "%#x", o.Value)
			continue
		}
		b.WriteString([...]string{"false", "=", ">", ">=", "<", "<=", "!=", "true"}[o.Bits])
		if o.Bits != 0 && o.Bits != 7 {
			fmt.Fprint(&b, o.Value)
		}
	}
	return b.String()
}

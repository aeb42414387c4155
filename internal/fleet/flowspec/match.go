package flowspec

import (
	"net/netip"

	"github.com/rampart-fw/rampart/internal/policy"
)

// The reference matcher: RFC 8955 §4.2 and RFC 8956 §3 read literally, on
// the packet policy.ParseFrame reads. It decides what the rules Rules
// writes must decide, and the differential tests hold the two together.

// Result is a route's answer for one packet.
type Result int

const (
	NoMatch Result = iota
	Match
	// Unknown: the answer hangs on a field the packet does not carry (an
	// IPv6 header chain that leaves the datagram, a cut transport header).
	Unknown
)

// evalOps applies a component's operator list to a value (§4.2.1): AND
// binds tighter than OR, so the list is an OR of runs of ANDed terms.
func evalOps(ops []Op, bitmask bool, v uint64) bool {
	any, run := false, false
	for i, o := range ops {
		t := term(o, bitmask, v)
		switch {
		case i == 0 || !o.And:
			any = any || (i > 0 && run)
			run = t
		default:
			run = run && t
		}
	}
	return any || run
}

func term(o Op, bitmask bool, v uint64) bool {
	if bitmask {
		var t bool
		if o.Bits&opMatch != 0 {
			t = v&o.Value == o.Value
		} else {
			t = v&o.Value != 0
		}
		return t != (o.Bits&opNot != 0)
	}
	return o.Bits&opLt != 0 && v < o.Value || o.Bits&opGt != 0 && v > o.Value || o.Bits&opEq != 0 && v == o.Value
}

// prefixHas reports whether addr's bits offset..bits-1 are the prefix's.
func prefixHas(c *Component, addr netip.Addr) bool {
	if c.Prefix.Addr().Is4() != addr.Is4() {
		return false
	}
	want, got := c.Prefix.Addr().AsSlice(), addr.AsSlice()
	for k := c.Offset; k < c.Prefix.Bits(); k++ {
		m := byte(0x80 >> (k % 8))
		if want[k/8]&m != got[k/8]&m {
			return false
		}
	}
	return true
}

// Matches decides whether the route matches a packet: the AND of its
// components (§4.2).
func (r *Route) Matches(p *policy.Packet) Result {
	if p.IsIPv6 != r.IPv6 {
		return NoMatch
	}
	res := Match
	for i := range r.Components {
		c := &r.Components[i]
		switch m := c.matches(p); m {
		case NoMatch:
			return NoMatch
		case Unknown:
			res = Unknown
		}
	}
	return res
}

func (c *Component) matches(p *policy.Packet) Result {
	tcpOrUDP := p.Proto == 6 || p.Proto == 17
	switch c.Type {
	case TypeDst:
		return result(prefixHas(c, p.Dst))
	case TypeSrc:
		return result(prefixHas(c, p.Src))
	case TypeLength:
		return result(evalOps(c.Ops, false, uint64(p.Len)))
	case TypeProto:
		if p.L4 == policy.L4Unknown {
			return Unknown
		}
		return result(evalOps(c.Ops, false, uint64(p.Proto)))
	case TypePort, TypeDport, TypeSport:
		// "never matches when the packet's IP protocol value is not 6
		// (TCP) or 17 (UDP), if the packet is fragmented and this is not
		// the first fragment, or if the system is unable to locate the
		// transport header" (§4.2.2.4); rampart's stance on the last is
		// Unknown, which its unparsed action decides.
		switch {
		case p.L4 == policy.L4Unknown:
			return Unknown
		case p.L4 == policy.L4None || !tcpOrUDP:
			return NoMatch
		case p.L4Len < 4:
			return Unknown
		}
		s, d := uint64(p.Sport), uint64(p.Dport)
		switch c.Type {
		case TypePort:
			return result(evalOps(c.Ops, false, s) || evalOps(c.Ops, false, d))
		case TypeDport:
			return result(evalOps(c.Ops, false, d))
		}
		return result(evalOps(c.Ops, false, s))
	case TypeTCPFlags:
		switch {
		case p.L4 == policy.L4Unknown:
			return Unknown
		case p.L4 == policy.L4None || p.Proto != 6:
			return NoMatch
		case p.L4Len < 14:
			return Unknown
		}
		// A 2-byte value covers bytes 12-13 with the data offset read as
		// 0 (RFC 8955 §4.2.2.9).
		return result(evalOps(c.Ops, true, uint64(p.TCPRes)<<8|uint64(p.TCPFlags)))
	case TypeDSCP:
		return result(evalOps(c.Ops, false, uint64(p.DSCP)))
	case TypeFragment:
		// IPv6's bits are in the header chain's fragment header.
		if p.IsIPv6 && p.L4 == policy.L4Unknown {
			return Unknown
		}
		return result(evalOps(c.Ops, true, uint64(p.Frag)))
	case TypeICMPType, TypeICMPCode:
		// "never matches when the packet's upper-layer IP protocol value
		// is not 58" (RFC 8956 §3.5; 1 for IPv4, RFC 8955 §4.2.2.7).
		icmp := 1
		if p.IsIPv6 {
			icmp = 58
		}
		switch {
		case p.L4 == policy.L4Unknown:
			return Unknown
		case p.L4 == policy.L4None || p.Proto != icmp:
			return NoMatch
		case p.L4Len < 2:
			return Unknown
		case c.Type == TypeICMPType:
			return result(evalOps(c.Ops, false, uint64(p.ICMPType)))
		}
		return result(evalOps(c.Ops, false, uint64(p.ICMPCode)))
	}
	// The flow label (RFC 8956 §3.7), an IPv6 route's only.
	if !p.IsIPv6 {
		return NoMatch
	}
	return result(evalOps(c.Ops, false, uint64(p.FlowLabel)))
}

func result(b bool) Result {
	if b {
		return Match
	}
	return NoMatch
}

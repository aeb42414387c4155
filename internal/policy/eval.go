package policy

import "net/netip"

// Verdict is the reference decision for one frame.
type Verdict struct {
	Action Action
	Class  Class
	// Rule is the index of the matching rule; -1 for the default, a
	// malformed or non-IP frame, and an unparsed one.
	Rule int
	// Unparsed: the verdict hung on fields the frame does not carry, and
	// the policy's Unparsed action decided it.
	Unparsed bool
}

// match is a rule's answer for one packet.
type match int

const (
	noMatch match = iota
	matched
	// matchUnknown: every field the packet carries matches, and one it does
	// not carry (a cut L4 header, a protocol behind an IPv6 chain that
	// leaves the datagram) decides.
	matchUnknown
)

// Eval decides a frame the way the data plane must. Non-IP frames pass. An
// IP frame takes the action of the first matching rule, or the default,
// unless an earlier rule that might have matched had the frame carried the
// fields it needs would have acted otherwise: then the verdict hangs on what
// the frame lacks, and Unparsed decides. A malformed frame could be read as
// anything: it takes the action every rule and the default agree on, else
// Unparsed's.
func (pol *Policy) Eval(frame []byte) Verdict {
	p, class := ParseFrame(frame)
	switch class {
	case ClassNonIP:
		return Verdict{Action: Pass, Class: class, Rule: -1}
	case ClassMalformed:
		return Verdict{Action: pol.MalformedAction(), Class: class, Rule: -1}
	}
	var maybe [2]bool // an earlier rule might have passed ([0]) or kept the frame from the stack ([1])
	v := Verdict{Action: pol.Default, Class: ClassIP, Rule: -1}
	for i := range pol.Rules {
		r := &pol.Rules[i]
		m := pol.match(r, &p)
		if m == matchUnknown {
			maybe[b2i(r.Action.MayDrop())] = true
		}
		if m == matched {
			v.Action, v.Rule = r.Action, i
			break
		}
	}
	if maybe[b2i(!v.Action.MayDrop())] {
		return Verdict{Action: pol.Unparsed, Class: ClassIP, Rule: -1, Unparsed: true}
	}
	return v
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// MalformedAction is the verdict for a frame nothing can be read of: the
// action every rule and the default share, or Unparsed when they differ.
func (pol *Policy) MalformedAction() Action {
	for _, r := range pol.Rules {
		if r.Action != pol.Default {
			return pol.Unparsed
		}
	}
	return pol.Default
}

func (pol *Policy) inAny(names []string, addr netip.Addr) bool {
	for _, n := range names {
		if pol.Lists[n].Contains(addr) {
			return true
		}
	}
	return false
}

func (pol *Policy) match(r *Rule, p *Packet) match {
	if len(r.Alt) > 0 {
		res := noMatch
		for i := range r.Alt {
			switch pol.match(&r.Alt[i], p) {
			case matched:
				return matched
			case matchUnknown:
				res = matchUnknown
			}
		}
		return res
	}
	if r.Family == 4 && p.IsIPv6 || r.Family == 6 && !p.IsIPv6 {
		return noMatch
	}
	if len(r.Src) > 0 && !pol.inAny(r.Src, p.Src) {
		return noMatch
	}
	if len(r.Dst) > 0 && !pol.inAny(r.Dst, p.Dst) {
		return noMatch
	}
	if r.SrcBits != nil && !(p.IsIPv6 && r.SrcBits.Has(p.Src)) || r.DstBits != nil && !(p.IsIPv6 && r.DstBits.Has(p.Dst)) {
		return noMatch
	}
	if r.Length != nil && (p.Len < int(r.Length.Lo) || p.Len > int(r.Length.Hi)) {
		return noMatch
	}
	// DSCP and the flow label are the IP header's: known whatever follows.
	if r.DSCP != nil && (p.DSCP < uint8(r.DSCP.Lo) || p.DSCP > uint8(r.DSCP.Hi)) {
		return noMatch
	}
	if r.FlowLabel != nil && (!p.IsIPv6 || p.FlowLabel < r.FlowLabel.Lo || p.FlowLabel > r.FlowLabel.Hi) {
		return noMatch
	}
	if r.Proto != nil {
		if p.L4 == L4Unknown {
			return matchUnknown
		}
		if !r.Proto.Has(uint32(p.Proto)) {
			return noMatch
		}
	}
	// In the data plane's order (rule_matches_more).
	if r.HasFrag {
		if p.IsIPv6 && p.L4 == L4Unknown {
			return matchUnknown
		}
		if p.Frag&r.FragOn != r.FragOn || p.Frag&r.FragOff != 0 {
			return noMatch
		}
	}
	if r.ICMPType != nil || r.ICMPCode != nil {
		switch {
		case p.L4 == L4None:
			return noMatch
		case p.L4 == L4Unknown:
			return matchUnknown
		case p.Proto != icmpOf(p.IsIPv6):
			return noMatch
		case p.L4Len < l4ICMP:
			return matchUnknown
		case r.ICMPType != nil && (p.ICMPType < uint8(r.ICMPType.Lo) || p.ICMPType > uint8(r.ICMPType.Hi)):
			return noMatch
		case r.ICMPCode != nil && (p.ICMPCode < uint8(r.ICMPCode.Lo) || p.ICMPCode > uint8(r.ICMPCode.Hi)):
			return noMatch
		}
	}
	if r.NeedsL4Header() {
		switch {
		case p.L4 == L4None:
			return noMatch
		case p.L4 == L4Unknown:
			return matchUnknown
		case p.Proto != protoTCP && p.Proto != protoUDP:
			return noMatch
		case r.HasFlags && p.Proto != protoTCP:
			return noMatch
		}
		if r.Sport != nil || r.Dport != nil {
			switch {
			case p.L4Len < l4Ports:
				return matchUnknown
			case r.Sport != nil && !InRanges(r.Sport, p.Sport):
				return noMatch
			case r.Dport != nil && !InRanges(r.Dport, p.Dport):
				return noMatch
			}
		}
		if r.HasFlags {
			switch {
			case p.L4Len < l4Flags:
				return matchUnknown
			case p.TCPFlags&r.FlagsOn != r.FlagsOn || p.TCPFlags&r.FlagsOff != 0,
				p.TCPRes&r.ResOn != r.ResOn || p.TCPRes&r.ResOff != 0:
				return noMatch
			}
		}
	}
	return matched
}

// NeedsL4Header reports whether the rule reads the L4 header: ports or TCP
// flags.
func (r *Rule) NeedsL4Header() bool { return r.Sport != nil || r.Dport != nil || r.HasFlags }

// NeedsL4 reports whether the rule looks past the L3 header: at the
// protocol, ports, flags, ICMP type or code, or IPv6's fragment header.
func (r *Rule) NeedsL4() bool {
	for _, a := range r.Alt {
		if a.NeedsL4() {
			return true
		}
	}
	// Fragment bits: IPv6's are in the header chain, walked for L4.
	return r.Proto != nil || r.NeedsL4Header() || r.ICMPType != nil || r.ICMPCode != nil || r.HasFrag
}

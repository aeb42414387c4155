package policy

import "net/netip"

// Verdict is the reference decision for one frame.
type Verdict struct {
	Action Action
	Class  Class
	Rule   int // index of the matching rule, -1 for the default or an unparsed frame
}

// Eval decides a frame the way the data plane must: unparsed frames pass,
// otherwise the first matching rule wins and the default ends the list.
func (pol *Policy) Eval(frame []byte) Verdict {
	p, class := ParseFrame(frame)
	if class != ClassIP {
		return Verdict{Action: Pass, Class: class, Rule: -1}
	}
	for i := range pol.Rules {
		if pol.matches(&pol.Rules[i], &p) {
			return Verdict{Action: pol.Rules[i].Action, Class: ClassIP, Rule: i}
		}
	}
	return Verdict{Action: pol.Default, Class: ClassIP, Rule: -1}
}

func (pol *Policy) inAny(names []string, addr netip.Addr) bool {
	for _, n := range names {
		if pol.Lists[n].Contains(addr) {
			return true
		}
	}
	return false
}

func (pol *Policy) matches(r *Rule, p *Packet) bool {
	if r.Family == 4 && p.IsIPv6 || r.Family == 6 && !p.IsIPv6 {
		return false
	}
	if len(r.Src) > 0 && !pol.inAny(r.Src, p.Src) {
		return false
	}
	if len(r.Dst) > 0 && !pol.inAny(r.Dst, p.Dst) {
		return false
	}
	if r.Proto >= 0 && p.Proto != r.Proto {
		return false
	}
	if r.Length != nil && (p.Len < int(r.Length.Lo) || p.Len > int(r.Length.Hi)) {
		return false
	}
	if r.Sport != nil || r.Dport != nil || r.HasFlags {
		if !p.HasPorts {
			return false
		}
		if r.Sport != nil && (p.Sport < r.Sport.Lo || p.Sport > r.Sport.Hi) {
			return false
		}
		if r.Dport != nil && (p.Dport < r.Dport.Lo || p.Dport > r.Dport.Hi) {
			return false
		}
		if r.HasFlags && (p.Proto != protoTCP || p.TCPFlags&r.FlagsOn != r.FlagsOn || p.TCPFlags&r.FlagsOff != 0) {
			return false
		}
	}
	return true
}

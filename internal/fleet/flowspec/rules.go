package flowspec

import (
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/rampart-fw/rampart/internal/policy"
)

// ActionKind is what a route does with the traffic it matches (RFC 8955
// §7).
type ActionKind int

const (
	// Accept: no traffic-rate: "treat the packet according to the normal
	// forwarding behavior", a pass.
	Accept      ActionKind = iota
	Drop                   // a traffic-rate of 0
	RateBytes              // traffic-rate-bytes, bytes per second
	RatePackets            // traffic-rate-packets
)

var kindNames = []string{"accept", "drop", "rate-bytes", "rate-packets"}

func (k ActionKind) String() string { return kindNames[k] }

// Action is what a route's extended communities ask.
type Action struct {
	Kind ActionKind
	Rate float64 // per second, for the rates
	// Continue is traffic-action's T bit: evaluation goes on to the routes
	// after this one (§7.3: set means "evaluate any subsequent Flow
	// Specifications").
	Continue bool
	Sample   bool
	// NotApplicable are the actions a host cannot take (redirect,
	// traffic-marking): counted and shown, the rest of the route applies.
	NotApplicable []string
}

func (a Action) String() string {
	s := a.Kind.String()
	switch a.Kind {
	case RateBytes:
		s += " " + strconv.FormatFloat(a.Rate, 'f', -1, 64) + "B/s"
	case RatePackets:
		s += " " + strconv.FormatFloat(a.Rate, 'f', -1, 64) + "/s"
	}
	if a.Continue {
		s += " continue"
	}
	return s
}

// Unsupported is why a valid route cannot be installed: its match or
// action needs what rampart's data plane does not have. Reason is a short
// label for metrics.
type Unsupported struct {
	Reason string
	Detail string
}

func (e *Unsupported) Error() string { return e.Detail }

func unsupported(reason, format string, args ...any) error {
	return &Unsupported{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// MaxRulesPerRoute bounds how many rampart rules one route becomes: a match
// is an OR of terms (several protocols, port or length ranges, flag
// combinations) and each combination is a rule.
const MaxRulesPerRoute = 64

// Rules writes a route as a rampart rule named name: a packet matches it
// exactly when the route matches it (the reference, Route.Matches). A
// match that is an OR (protocols, ports either side, ranges, flag terms)
// is a rule of alternatives (policy.Rule.Alt), counted and rate-limited
// as one. Prefixes become lists named by the prefix, added to lists when
// missing. A route that can never match gives no rule; nor does one with
// Continue and accept, which does nothing.
func Rules(r *Route, a Action, name string, lists map[string]*policy.List) ([]policy.Rule, error) {
	base := policy.Rule{Name: name, Family: 4}
	if r.IPv6 {
		base.Family = 6
	}
	switch {
	case a.Continue && a.Kind == Accept:
		return nil, nil
	case a.Continue && a.Kind != Drop:
		return nil, unsupported("continue", "a rate with the terminal bit set (evaluate the routes after it): rampart's rules stop at the first match")
	case a.Kind == Drop:
		base.Action = policy.Drop
	case a.Kind == Accept:
		base.Action = policy.Pass
	default:
		base.Action = policy.Limit
		l := &policy.RateLimit{Rate: a.Rate, Burst: 5}
		if a.Kind == RateBytes {
			// As a limit rule's bit rate: a burst of 10 ms of bytes, at
			// least a full-size frame.
			l.Rate, l.Bits = a.Rate*8, true
			l.Burst = max(1514, uint64(a.Rate/100))
		}
		base.Limit = l
	}
	// Each component narrows the variants; some multiply them.
	variants := []policy.Rule{base}
	var ports []policy.Range // the port component's ranges, either side
	protos := []policy.Range{{Lo: 0, Hi: 255}}
	hasPorts := false
	for i := range r.Components {
		c := &r.Components[i]
		var err error
		switch c.Type {
		case TypeDst, TypeSrc:
			if c.Offset != 0 {
				// Bits from the middle of the address: the rule's leaf
				// checks them, no list can hold them.
				bits := &policy.AddrBits{Prefix: c.Prefix, Offset: c.Offset}
				for k := range variants {
					if c.Type == TypeDst {
						variants[k].DstBits = bits
					} else {
						variants[k].SrcBits = bits
					}
				}
				break
			}
			l := policy.InlineList(c.Prefix)
			ln := l.Name
			if lists[ln] == nil {
				lists[ln] = l
			}
			for k := range variants {
				if c.Type == TypeDst {
					variants[k].Dst = []string{ln}
				} else {
					variants[k].Src = []string{ln}
				}
			}
		case TypeProto:
			protos = ranges(c.Ops, 255)
		case TypePort:
			ports, hasPorts = ranges(c.Ops, 65535), true
		case TypeDport, TypeSport:
			vals := ranges(c.Ops, 65535)
			for k := range variants {
				if c.Type == TypeDport {
					variants[k].Dport = vals
				} else {
					variants[k].Sport = vals
				}
			}
		case TypeTCPFlags:
			// Two bytes: the flags, and byte 12 with its data offset
			// read as 0 (RFC 8955 §4.2.2.9): a term that wants an offset
			// bit set never matches, one that wants it clear always does.
			terms, terr := bitTerms(c.Ops, 0xffff, "tcp-flags")
			if terr != nil {
				return nil, terr
			}
			const offset = 0xf000
			terms = slices.DeleteFunc(terms, func(t [2]uint16) bool { return t[0]&offset != 0 })
			for i := range terms {
				terms[i][1] &^= offset
			}
			terms = compactTerms(terms)
			variants, err = multiply(variants, len(terms), func(v policy.Rule, out *[]policy.Rule) {
				for _, t := range terms {
					v.FlagsOn, v.FlagsOff, v.HasFlags = uint8(t[0]), uint8(t[1]), true
					v.ResOn, v.ResOff = uint8(t[0]>>8), uint8(t[1]>>8)
					*out = append(*out, v)
				}
			})
		case TypeLength, TypeICMPType, TypeICMPCode, TypeDSCP, TypeFlowLabel:
			// One range per rule: a variant for each.
			maxV := map[int]uint64{TypeLength: 65535, TypeICMPType: 255, TypeICMPCode: 255, TypeDSCP: 63, TypeFlowLabel: policy.MaxFlowLabel}[c.Type]
			vals := ranges(c.Ops, maxV)
			variants, err = multiply(variants, len(vals), func(v policy.Rule, out *[]policy.Rule) {
				for _, rg := range vals {
					switch c.Type {
					case TypeLength:
						v.Length = &rg
					case TypeICMPType:
						v.ICMPType = &rg
					case TypeICMPCode:
						v.ICMPCode = &rg
					case TypeFlowLabel:
						v.FlowLabel = &rg
					default:
						v.DSCP = &rg
					}
					*out = append(*out, v)
				}
			})
		case TypeFragment:
			terms, terr := bitTerms(c.Ops, 0x0f, "fragment")
			if terr != nil {
				return nil, terr
			}
			variants, err = multiply(variants, len(terms), func(v policy.Rule, out *[]policy.Rule) {
				for _, t := range terms {
					v.FragOn, v.FragOff, v.HasFrag = uint8(t[0]), uint8(t[1]), true
					*out = append(*out, v)
				}
			})
		default:
			return nil, unsupported(typeNames[c.Type], "%s is not matched by rampart's data plane", typeNames[c.Type])
		}
		if err != nil {
			return nil, err
		}
	}
	// Ports and flags never match other protocols than TCP and UDP: only
	// those of the protocols matter then, and a rule is one protocol.
	if r.Get(TypePort) != nil || r.Get(TypeDport) != nil || r.Get(TypeSport) != nil {
		protos = intersect(protos, []policy.Range{{Lo: 6, Hi: 6}, {Lo: 17, Hi: 17}})
	}
	if r.Get(TypeTCPFlags) != nil {
		protos = intersect(protos, []policy.Range{{Lo: 6, Hi: 6}})
	}
	if r.Get(TypeICMPType) != nil || r.Get(TypeICMPCode) != nil {
		icmp := uint32(1)
		if r.IPv6 {
			icmp = 58
		}
		protos = intersect(protos, []policy.Range{{Lo: icmp, Hi: icmp}})
	}
	if !slices.Equal(protos, []policy.Range{{Lo: 0, Hi: 255}}) {
		var err error
		variants, err = multiply(variants, len(protos), func(v policy.Rule, out *[]policy.Rule) {
			for _, rg := range protos {
				v.Proto = &rg
				*out = append(*out, v)
			}
		})
		if err != nil {
			return nil, err
		}
	}
	if hasPorts {
		// Port matches either side: a variant for each, with the side's
		// own component narrowing it.
		var err error
		variants, err = multiply(variants, 2, func(v policy.Rule, out *[]policy.Rule) {
			s, d := v, v
			s.Sport = intersect(orAll(v.Sport), ports)
			d.Dport = intersect(orAll(v.Dport), ports)
			*out = append(*out, s, d)
		})
		if err != nil {
			return nil, err
		}
	}
	var out []policy.Rule
	for _, v := range variants {
		if v.Sport != nil && len(v.Sport) == 0 || v.Dport != nil && len(v.Dport) == 0 {
			continue // an empty set of ports: never matches
		}
		out = append(out, v)
	}
	switch len(out) {
	case 0:
		return nil, nil
	case 1:
		return out, nil
	}
	// One rule of alternatives: one counter and one rate for the route.
	r0 := base
	for k := range out {
		out[k].Name, out[k].Action, out[k].Limit = "", 0, nil
	}
	r0.Alt = out
	return []policy.Rule{r0}, nil
}

// multiply replaces each variant by what each gives, within
// MaxRulesPerRoute.
func multiply(vs []policy.Rule, each int, f func(policy.Rule, *[]policy.Rule)) ([]policy.Rule, error) {
	if len(vs)*each > MaxRulesPerRoute {
		return nil, unsupported("too-complex", "the match is an OR of more than %d combinations", MaxRulesPerRoute)
	}
	var out []policy.Rule
	for _, v := range vs {
		f(v, &out)
	}
	return out, nil
}

// orAll is a side's ranges, or the whole domain when it has none.
func orAll(rs []policy.Range) []policy.Range {
	if rs == nil {
		return []policy.Range{{Lo: 0, Hi: 65535}}
	}
	return rs
}

// ranges is the set of values in 0..maxV a numeric operator list accepts,
// as sorted disjoint ranges: each term is a range or two, an AND run their
// intersection, the list the union of its runs.
func ranges(ops []Op, maxV uint64) []policy.Range {
	var union, run []policy.Range
	for i, o := range ops {
		t := termRanges(o, maxV)
		if i == 0 || !o.And {
			union = append(union, run...)
			run = t
		} else {
			run = intersect(run, t)
		}
	}
	return normalize(append(union, run...))
}

func termRanges(o Op, maxV uint64) []policy.Range {
	v := o.Value
	var out []policy.Range
	add := func(lo, hi uint64) {
		if lo <= hi && lo <= maxV {
			out = append(out, policy.Range{Lo: uint32(lo), Hi: uint32(min(hi, maxV))})
		}
	}
	if o.Bits&opLt != 0 && v > 0 {
		add(0, v-1)
	}
	if o.Bits&opEq != 0 {
		add(v, v)
	}
	if o.Bits&opGt != 0 && v < math.MaxUint64 {
		add(v+1, maxV)
	}
	return normalize(out)
}

func intersect(a, b []policy.Range) []policy.Range {
	out := []policy.Range{}
	for _, x := range a {
		for _, y := range b {
			lo, hi := max(x.Lo, y.Lo), min(x.Hi, y.Hi)
			if lo <= hi {
				out = append(out, policy.Range{Lo: lo, Hi: hi})
			}
		}
	}
	return normalize(out)
}

func normalize(rs []policy.Range) []policy.Range {
	slices.SortFunc(rs, func(a, b policy.Range) int { return int(a.Lo) - int(b.Lo) })
	out := []policy.Range{}
	for _, r := range rs {
		if n := len(out); n > 0 && int(r.Lo) <= int(out[n-1].Hi)+1 {
			out[n-1].Hi = max(out[n-1].Hi, r.Hi)
			continue
		}
		out = append(out, r)
	}
	return out
}

// bitTerms writes a bitmask operator list (TCP flags, fragment bits) as
// an OR of (set, clear) pairs, the rule model's match of such bits. Bits
// past mask are beyond it: a 2-byte TCP flags value's data offset,
// fragment bits RFC 8955 does not define.
func bitTerms(ops []Op, mask uint64, what string) ([][2]uint16, error) {
	var union, run [][2]uint16
	for i, o := range ops {
		if o.Value&^mask != 0 {
			return nil, unsupported(what, "%s %#x test bits rampart's data plane does not read", what, o.Value)
		}
		t := flagTerm(o)
		if i == 0 || !o.And {
			union = append(union, run...)
			run = t
			continue
		}
		var next [][2]uint16
		for _, x := range run {
			for _, y := range t {
				on, off := x[0]|y[0], x[1]|y[1]
				if on&off == 0 {
					next = append(next, [2]uint16{on, off})
				}
			}
		}
		run = next
		if len(run) > MaxRulesPerRoute {
			return nil, unsupported("too-complex", "the %s are an OR of more than %d combinations", what, MaxRulesPerRoute)
		}
	}
	return compactTerms(append(union, run...)), nil
}

// compactTerms sorts terms and drops repeats.
func compactTerms(terms [][2]uint16) [][2]uint16 {
	slices.SortFunc(terms, func(a, b [2]uint16) int { return int(a[0])<<16 | int(a[1]) - (int(b[0])<<16 | int(b[1])) })
	return slices.Compact(terms)
}

// flagTerm is one bitmask term as an OR of (set, clear) pairs.
func flagTerm(o Op) [][2]uint16 {
	v := uint16(o.Value)
	match, not := o.Bits&opMatch != 0, o.Bits&opNot != 0
	var out [][2]uint16
	switch {
	case match && !not: // every bit of v set
		out = append(out, [2]uint16{v, 0})
	case !match && not: // no bit of v set
		out = append(out, [2]uint16{0, v})
	case match && not: // some bit of v clear
		for b := uint16(1); b != 0; b <<= 1 {
			if v&b != 0 {
				out = append(out, [2]uint16{0, b})
			}
		}
	default: // some bit of v set
		for b := uint16(1); b != 0; b <<= 1 {
			if v&b != 0 {
				out = append(out, [2]uint16{b, 0})
			}
		}
	}
	return out
}

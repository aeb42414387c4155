// Package policy holds rampart's validated policy model: the rules file and
// its prefix lists parsed into a Policy, and Eval, the reference verdict that
// the BPF data plane is tested against.
package policy

import (
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/rampart-fw/rampart/internal/abi"
)

// Action is what a rule, or the default, does with a packet.
type Action uint8

const (
	Pass Action = iota
	Drop
	// Limit passes what is under the rule's rate and drops the rest.
	Limit
	// Syncookie answers TCP SYNs with a SYN-ACK carrying a cookie; the
	// ACK that returns it becomes a connection without state kept before.
	// Other segments pass.
	Syncookie
)

var actionNames = []string{"pass", "drop", "limit", "syncookie"}

func (a Action) String() string { return actionNames[a] }

// MayDrop tells the actions that keep a frame from the stack, or may.
// Frames whose verdict hangs on fields they lack are unparsed when an
// action of the other kind was possible (see Eval).
func (a Action) MayDrop() bool { return a != Pass }

// RateLimit is a limit rule's rate and scope.
type RateLimit struct {
	Rate  float64 // per second: packets, or bits when Bits
	Bits  bool
	Burst uint64 // packets, or bytes when Bits
	// PerSource: one bucket per source prefix of Prefix4 (IPv4) or Prefix6
	// (IPv6) bits; else one bucket for the rule.
	PerSource        bool
	Prefix4, Prefix6 int
}

func (l *RateLimit) String() string {
	rate := strconv.FormatFloat(l.Rate, 'f', -1, 64) + "/s"
	if l.Bits {
		rate = strconv.FormatFloat(l.Rate, 'f', -1, 64) + "bit/s"
	}
	per := "rule"
	if l.PerSource {
		per = fmt.Sprintf("source/%d,%d", l.Prefix4, l.Prefix6)
	}
	return fmt.Sprintf("%s burst %d per %s", rate, l.Burst, per)
}

// Range is an inclusive range of ports, lengths, ICMP types and codes,
// DSCP values or flow labels.
type Range struct{ Lo, Hi uint32 }

// Has reports whether v is in the range.
func (r Range) Has(v uint32) bool { return v >= r.Lo && v <= r.Hi }

func (r Range) String() string { return string(r.append(nil)) }

// append appends the range as String writes it: strconv, not fmt, since
// every rule's match key is written at every apply.
func (r Range) append(b []byte) []byte {
	b = strconv.AppendUint(b, uint64(r.Lo), 10)
	if r.Lo == r.Hi {
		return b
	}
	return strconv.AppendUint(append(b, '-'), uint64(r.Hi), 10)
}

// AddrBits matches bits Offset to Prefix.Bits()-1 of an IPv6 address: an
// RFC 8956 prefix with an offset, its pattern at its place in Prefix.
type AddrBits struct {
	Prefix netip.Prefix
	Offset int
}

// Mask has the bits the match looks at set.
func (b AddrBits) Mask() [16]byte {
	var m [16]byte
	for k := b.Offset; k < b.Prefix.Bits(); k++ {
		m[k/8] |= 0x80 >> (k % 8)
	}
	return m
}

// Has reports whether an IPv6 address has the bits.
func (b AddrBits) Has(addr netip.Addr) bool {
	m, a, want := b.Mask(), addr.As16(), b.Prefix.Addr().As16()
	for i := range m {
		if a[i]&m[i] != want[i]&m[i] {
			return false
		}
	}
	return true
}

func (b AddrBits) String() string { return fmt.Sprintf("%s offset %d", b.Prefix, b.Offset) }

// MaxFlowLabel is the largest IPv6 flow label.
const MaxFlowLabel = 1<<20 - 1

// TCP flag bits as they sit in byte 13 of the TCP header.
const (
	FlagFIN = 1 << iota
	FlagSYN
	FlagRST
	FlagPSH
	FlagACK
	FlagURG
	FlagECE
	FlagCWR
)

var tcpFlagNames = []string{"fin", "syn", "rst", "psh", "ack", "urg", "ece", "cwr"}

// Fragment bits, as BGP FlowSpec names them (RFC 8955 §4.2.2.12): IPv4's
// don't-fragment, a fragment other than the first, the first, the last.
const (
	FragDF = 1 << iota
	FragIs
	FragFirst
	FragLast
)

var fragNames = []string{"df", "is", "first", "last"}

// Rule is one ordered rule. Zero-valued fields do not take part in the match.
type Rule struct {
	Name     string
	Line     int
	Src      []string // names of lists; inline prefixes become lists of their own
	Dst      []string
	Family   int     // 0 (any), 4 or 6
	Proto    *Range  // IP protocol numbers (IPv6: the upper layer's); nil matches any
	Sport    []Range // any of them; nil matches any
	Dport    []Range
	Length   *Range
	FlagsOn  uint8 // TCP flags that must be set
	FlagsOff uint8 // TCP flags that must be clear
	// ResOn and ResOff: TCP's byte 12 under the data offset (the reserved
	// bits and NS) that must be set and clear, what a two-byte BGP
	// FlowSpec TCP flags value tests besides (RFC 8955 §4.2.2.9); with
	// HasFlags.
	ResOn, ResOff uint8
	HasFlags      bool
	ICMPType      *Range // ICMP or ICMPv6 type, 0-255
	ICMPCode      *Range
	DSCP          *Range // 0-63
	// FlowLabel: IPv6's; a rule with one matches no IPv4 frame.
	FlowLabel *Range
	// SrcBits and DstBits: IPv6 address bits no list holds (BGP FlowSpec
	// prefixes with an offset); a rule with them matches no IPv4 frame.
	SrcBits, DstBits *AddrBits
	FragOn           uint8 // fragment bits (FragDF…) that must be set
	FragOff          uint8 // and clear
	HasFrag          bool
	Action           Action
	Limit            *RateLimit // for action limit
	// Alt, when set, is what the rule matches instead of its own fields:
	// any of these alternatives (their match fields; name, action and
	// limit are the rule's). A BGP FlowSpec route whose match is an OR
	// is one rule so, with one counter and one rate.
	Alt []Rule
}

// ProtoIs reports whether the rule matches protocol p alone.
func (r *Rule) ProtoIs(p int) bool { return r.Proto != nil && *r.Proto == One(p) }

// ProtoAllows reports whether the rule may match protocol p.
func (r *Rule) ProtoAllows(p int) bool { return r.Proto == nil || r.Proto.Has(uint32(p)) }

// One is the range of v alone.
func One(v int) Range { return Range{Lo: uint32(v), Hi: uint32(v)} }

// Alternatives are what the rule matches: its Alt, or itself.
func (r *Rule) Alternatives() []Rule {
	if len(r.Alt) > 0 {
		return r.Alt
	}
	return []Rule{*r}
}

// MatchKeys are the rules' MatchKeys, made on every CPU: a feed's 10,000
// take 15-20 ms one after another, at every apply, twice (warnings,
// counters).
func MatchKeys(rules []Rule) []string {
	keys := make([]string, len(rules))
	InPieces(len(rules), piecesOf(len(rules)), func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			keys[i] = rules[i].MatchKey()
		}
	})
	return keys
}

// InPieces runs do over [0, n) cut into pieces, each on a goroutine of its
// own (one piece on the caller's), and returns once every piece is done.
func InPieces(n, pieces int, do func(piece, lo, hi int)) {
	if pieces == 1 {
		do(0, 0, n)
		return
	}
	var wg sync.WaitGroup
	for p := range pieces {
		wg.Go(func() { do(p, n*p/pieces, n*(p+1)/pieces) })
	}
	wg.Wait()
}

// piecesOf is how many pieces n items are worth: one per CPU, and none of
// fewer than 1,000 items, whose goroutine would cost more than it saves.
func piecesOf(n int) int { return max(1, min(runtime.GOMAXPROCS(0), n/1000)) }

// MatchKey is a canonical text of what the rule matches. A rule whose name and
// MatchKey survive a re-apply keeps its counters.
func (r *Rule) MatchKey() string {
	if len(r.Alt) > 0 {
		keys := make([]string, len(r.Alt))
		for i := range r.Alt {
			keys[i] = r.Alt[i].matchKey()
		}
		return "any(" + strings.Join(keys, "|") + ")" + r.actionKey()
	}
	return r.matchKey() + r.actionKey()
}

func (r *Rule) actionKey() string {
	k := ";action=" + r.Action.String()
	if r.Limit != nil {
		k += ";limit=" + r.Limit.String()
	}
	return k
}

func (r *Rule) matchKey() string {
	// The common fields without fmt: a policy's every rule is keyed at
	// every apply, twice (warnings, counters).
	b := make([]byte, 0, 96)
	b = append(append(b, "src="...), strings.Join(r.Src, ",")...)
	b = append(append(b, ";dst="...), strings.Join(r.Dst, ",")...)
	b = strconv.AppendInt(append(b, ";family="...), int64(r.Family), 10)
	b = append(b, ";proto="...)
	if r.Proto == nil {
		b = append(b, "-1"...)
	} else {
		b = r.Proto.append(b)
	}
	for _, f := range []struct {
		k string
		r []Range
	}{{";sport=", r.Sport}, {";dport=", r.Dport}} {
		if f.r != nil {
			b = append(b, f.k...)
			for i, rg := range f.r {
				if i > 0 {
					b = append(b, ',')
				}
				b = rg.append(b)
			}
		}
	}
	if r.Length != nil {
		b = r.Length.append(append(b, ";length="...))
	}
	return string(b) + r.moreKey()
}

// moreKey is the rest of matchKey: fields fewer rules have.
func (r *Rule) moreKey() string {
	var b strings.Builder
	if r.HasFlags {
		fmt.Fprintf(&b, ";flags=%s", FormatTCPFlags(r.FlagsOn, r.FlagsOff))
		if r.ResOn|r.ResOff != 0 {
			fmt.Fprintf(&b, ";tcp_res=%#x/%#x", r.ResOn, r.ResOff)
		}
	}
	for _, f := range []struct {
		k string
		r *Range
	}{{"icmp_type", r.ICMPType}, {"icmp_code", r.ICMPCode}, {"dscp", r.DSCP}, {"flow_label", r.FlowLabel}} {
		if f.r != nil {
			fmt.Fprintf(&b, ";%s=%s", f.k, f.r)
		}
	}
	for _, f := range []struct {
		k    string
		bits *AddrBits
	}{{"src_bits", r.SrcBits}, {"dst_bits", r.DstBits}} {
		if f.bits != nil {
			fmt.Fprintf(&b, ";%s=%s", f.k, f.bits)
		}
	}
	if r.HasFrag {
		fmt.Fprintf(&b, ";fragment=%s", FormatFragment(r.FragOn, r.FragOff))
	}
	return b.String()
}

// Entries is how many match entries of the data plane the rule takes, its
// lists and inline prefixes among lists: one per pair of its source and
// destination port ranges, for each pair of ways of checking its sides
// (SplitSide).
func (r *Rule) Entries(lists map[string]*List) int {
	n := 0
	for _, a := range r.Alternatives() {
		n += max(1, len(a.Sport)) * max(1, len(a.Dport)) *
			sideEntries(a.Src, a.SrcBits, lists) * sideEntries(a.Dst, a.DstBits, lists)
	}
	return n
}

// InRanges reports whether v is in any of the ranges.
func InRanges(rs []Range, v uint16) bool {
	for _, r := range rs {
		if uint32(v) >= r.Lo && uint32(v) <= r.Hi {
			return true
		}
	}
	return false
}

// FormatFragment renders fragment bits in the policy syntax, e.g. "is,!last".
func FormatFragment(on, off uint8) string { return formatBits(fragNames, on, off) }

// FormatTCPFlags renders flags in the policy syntax, e.g. "syn,!ack".
func FormatTCPFlags(on, off uint8) string { return formatBits(tcpFlagNames, on, off) }

func formatBits(names []string, on, off uint8) string {
	var parts []string
	for i, n := range names {
		if on&(1<<i) != 0 {
			parts = append(parts, n)
		}
		if off&(1<<i) != 0 {
			parts = append(parts, "!"+n)
		}
	}
	return strings.Join(parts, ",")
}

// Policy is a validated rules file with its lists resolved.
type Policy struct {
	File      string
	ListFiles []string // the list files read, as paths the policy file's directory anchors
	Lists     map[string]*List
	Rules     []Rule
	Default   Action
	// Unparsed decides a frame whose verdict hangs on fields it does not
	// carry (see Eval). Drop unless the policy says otherwise: a flood
	// defence must not let a crafted frame around a drop rule, and the
	// kernel discards such frames anyway, but tiny first fragments.
	Unparsed Action
	// CrowdSec, when set, feeds one of Lists from a CrowdSec Local API
	// (rampart serve does).
	CrowdSec *CrowdSec
	// Live names lists about to take in-place changes (rampart serve's:
	// those its saved changes name at its start, and a static list its
	// ban API is asked to change). Past MaxLists ways of naming lists,
	// their ways take bits after those of lists holding changes and those
	// CrowdSec feeds (ListUse).
	Live map[string]bool
	// FlowSpec, when set, is a BGP speaker whose FlowSpec routes become
	// rules at FlowSpecAt (rampart serve runs it).
	FlowSpec *FlowSpec
	// Warnings are legal but suspect things (a rule that can never match).
	Warnings []Error
}

// ListNames are the names of the policy's lists, sorted.
func (pol *Policy) ListNames() []string {
	names := make([]string, 0, len(pol.Lists))
	for n := range pol.Lists {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// MaxRules bounds what one policy may hold: the data plane's rule array;
// MaxLists is the lists (or ways of naming them, ListUse) that take a bit
// of its list membership mask (bpf/common.h), the others being static.
const (
	MaxRules = abi.MaxRules
	MaxLists = abi.MaxLists
)

// Usage is what the policy takes of the data plane's limits: match
// entries, and how its rules name the lists that take bits of the
// membership mask.
func (pol *Policy) Usage() (entries int, lists *ListUse) {
	for i := range pol.Rules {
		entries += pol.Rules[i].Entries(pol.Lists)
	}
	return entries, pol.ListUse()
}

// ListUse is how pol's rules name the lists that take bits of the
// membership mask; the lists that take live changes take them first:
// those holding some, then those CrowdSec feeds, then those Live names.
func (pol *Policy) ListUse() *ListUse {
	u := NewListUse()
	u.live = func(list string) int {
		switch l := pol.Lists[list]; {
		case l != nil && len(l.Ops) > 0:
			return liveHeld
		case pol.CrowdSec.Feeds(list):
			return liveFed
		case pol.Live[list]:
			return liveAsked
		}
		return 0
	}
	for i := range pol.Rules {
		u.Add(&pol.Rules[i], pol.Lists)
	}
	return u
}

// SplitSide is a side of a rule alternative (its lists and address bits)
// as the data plane checks it: the named lists together, by their bits of
// the membership mask, and each inline prefix apart, in entries of its own
// that compare the address's bits. So inline prefixes take no bit, and a
// policy names any number of them, as a feed of victims' prefixes does.
// A side with address bits (a BGP FlowSpec prefix with an offset) has no
// room in its entries for a prefix: its lists are all masked.
func SplitSide(refs []string, bits *AddrBits, lists map[string]*List) (masked []string, inline []netip.Prefix) {
	for _, n := range refs {
		if l := lists[n]; bits == nil && l != nil && l.Inline.IsValid() {
			inline = append(inline, l.Inline)
		} else {
			masked = append(masked, n)
		}
	}
	return masked, inline
}

// sideEntries is how many ways the data plane checks a side (SplitSide):
// its masked lists as one, each inline prefix as one; a side naming
// nothing is one that any address passes.
func sideEntries(refs []string, bits *AddrBits, lists map[string]*List) int {
	masked, inline := SplitSide(refs, bits, lists)
	n := len(inline)
	if len(masked) > 0 {
		n++
	}
	return max(1, n)
}

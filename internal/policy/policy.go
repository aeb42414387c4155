// Package policy holds rampart's validated policy model: the rules file and
// its prefix lists parsed into a Policy, and Eval, the reference verdict that
// the BPF data plane is tested against.
package policy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/rampart-fw/rampart/internal/abi"
)

// Action is what a rule, or the default, does with a packet.
type Action uint8

const (
	Pass Action = iota
	Drop
)

func (a Action) String() string {
	if a == Drop {
		return "drop"
	}
	return "pass"
}

// Range is an inclusive range of ports or lengths.
type Range struct{ Lo, Hi uint16 }

func (r Range) String() string {
	if r.Lo == r.Hi {
		return fmt.Sprint(r.Lo)
	}
	return fmt.Sprintf("%d-%d", r.Lo, r.Hi)
}

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

// Rule is one ordered rule. Zero-valued fields do not take part in the match.
type Rule struct {
	Name     string
	Line     int
	Src      []string // names of lists; inline prefixes become lists of their own
	Dst      []string
	Family   int // 0 (any), 4 or 6
	Proto    int // -1 (any) or an IP protocol number
	Sport    *Range
	Dport    *Range
	Length   *Range
	FlagsOn  uint8 // TCP flags that must be set
	FlagsOff uint8 // TCP flags that must be clear
	HasFlags bool
	Action   Action
}

// MatchKey is a canonical text of what the rule matches. A rule whose name and
// MatchKey survive a re-apply keeps its counters.
func (r *Rule) MatchKey() string {
	var b strings.Builder
	fmt.Fprintf(&b, "src=%s;dst=%s;family=%d;proto=%d", strings.Join(r.Src, ","), strings.Join(r.Dst, ","), r.Family, r.Proto)
	for _, f := range []struct {
		k string
		r *Range
	}{{"sport", r.Sport}, {"dport", r.Dport}, {"length", r.Length}} {
		if f.r != nil {
			fmt.Fprintf(&b, ";%s=%s", f.k, f.r)
		}
	}
	if r.HasFlags {
		fmt.Fprintf(&b, ";flags=%s", FormatTCPFlags(r.FlagsOn, r.FlagsOff))
	}
	fmt.Fprintf(&b, ";action=%s", r.Action)
	return b.String()
}

// FormatTCPFlags renders flags in the policy syntax, e.g. "syn,!ack".
func FormatTCPFlags(on, off uint8) string {
	var parts []string
	for i, n := range tcpFlagNames {
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
	File    string
	Lists   map[string]*List
	Rules   []Rule
	Default Action
	// Unparsed decides a frame whose verdict hangs on fields it does not
	// carry (see Eval). Drop unless the policy says otherwise: a flood
	// defence must not let a crafted frame around a drop rule, and the
	// kernel discards such frames anyway, but tiny first fragments.
	Unparsed Action
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

// MaxRules and MaxLists bound what one policy may hold: the data plane's
// rule array, and list membership as one 64-bit mask (bpf/common.h).
const (
	MaxRules = abi.MaxRules
	MaxLists = abi.MaxLists
)

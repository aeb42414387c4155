package policy

import (
	"fmt"
	"strings"
)

// unreachable warns of rules that can never match: after a rule that
// matches every IP frame, after a rule with the same match, or asking for a
// family none of its lists holds. They are legal, and almost always a
// mistake.
func unreachable(file string, pol *Policy) []Error {
	var out []Error
	warn := func(r *Rule, format string, args ...any) {
		out = append(out, Error{File: file, Line: r.Line, Field: "rule", Msg: fmt.Sprintf("rule %q can never match: ", r.Name) + fmt.Sprintf(format, args...)})
	}
	seen := make(map[string]*Rule, len(pol.Rules))
	var all *Rule
	keys := MatchKeys(pol.Rules)
	for i := range pol.Rules {
		r := &pol.Rules[i]
		key := strings.TrimSuffix(keys[i], ";action="+r.Action.String())
		switch {
		case all != nil:
			warn(r, "rule %q (line %d) before it matches every IP frame", all.Name, all.Line)
		case seen[key] != nil:
			warn(r, "rule %q (line %d) before it matches the same frames", seen[key].Name, seen[key].Line)
		default:
			if why := pol.familyConflict(r); why != "" {
				warn(r, "%s", why)
			}
		}
		if seen[key] == nil {
			seen[key] = r
		}
		if all == nil && r.matchesAll() {
			all = r
		}
	}
	return out
}

// matchesAll reports whether the rule matches every IP frame.
func (r *Rule) matchesAll() bool {
	return len(r.Alt) == 0 && len(r.Src) == 0 && len(r.Dst) == 0 && r.Family == 0 && r.Proto == nil && r.Length == nil && !r.NeedsL4Header() &&
		r.ICMPType == nil && r.ICMPCode == nil && r.DSCP == nil && r.FlowLabel == nil && r.SrcBits == nil && r.DstBits == nil && !r.HasFrag
}

// familyConflict says why the rule's family and lists exclude each other
// ("" when they do not).
func (pol *Policy) familyConflict(r *Rule) string {
	if r.Family == 0 && (len(r.Src) == 0 || len(r.Dst) == 0) {
		return "" // what follows checks a family against lists, or source lists against destination lists
	}
	families := func(names []string) (v4, v6 bool) {
		for _, n := range names {
			l := pol.Lists[n]
			v4 = v4 || len(l.V4) > 0 || l.Family != 6 && len(l.V6) == 0 && len(l.V4) == 0
			v6 = v6 || len(l.V6) > 0 || l.Family != 4 && len(l.V6) == 0 && len(l.V4) == 0
		}
		return
	}
	for _, side := range []struct {
		name  string
		lists []string
	}{{"source", r.Src}, {"destination", r.Dst}} {
		if len(side.lists) == 0 {
			continue
		}
		v4, v6 := families(side.lists)
		if r.Family == 4 && !v4 || r.Family == 6 && !v6 {
			return fmt.Sprintf("family %d, but its %s lists (%s) hold no IPv%d address", r.Family, side.name, strings.Join(side.lists, ", "), r.Family)
		}
	}
	if len(r.Src) > 0 && len(r.Dst) > 0 {
		s4, s6 := families(r.Src)
		d4, d6 := families(r.Dst)
		if !(s4 && d4) && !(s6 && d6) {
			return "its source lists and its destination lists hold addresses of different families"
		}
	}
	return ""
}

package policy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/netip"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/rampart-fw/rampart/internal/yamlpos"
)

// Error is a problem in a policy or list file, located by file, line and
// field.
type Error = yamlpos.Error

// Options control how list files are read.
type Options struct {
	// Lenient skips bad lines, counting them in List.Skipped, instead of
	// failing on the first.
	Lenient bool
	// Progress, if set, is called now and then while a list file is read.
	Progress func(file string, read, total int64)
	// Context, if set, interrupts reading when it ends.
	Context context.Context
}

// Load reads and validates a policy file. List files are resolved relative to
// the policy file's directory.
func Load(path string, opt Options) (*Policy, error) {
	data, err := readRegular(path, opt.Context)
	if err != nil {
		return nil, fmt.Errorf("read policy %s: %w", path, err)
	}
	pol, err := parse(path, data, opt)
	// Reading list files leaves garbage as large as the lists (each CPU's
	// section of a file before the sections merge). Collected now, it does
	// not set the heap goal of what comes next, the tables' build: peak
	// memory for ten million IPv6 prefixes falls by a third. Small lists
	// leave too little to be worth a collection's pause.
	if pol != nil {
		for _, l := range pol.Lists {
			if l.Entries >= bigList {
				runtime.GC()
				break
			}
		}
	}
	return pol, err
}

// bigList is the size of list whose reading leaves garbage worth
// collecting before the tables are built.
const bigList = 100_000

// Parse validates policy text; path names it in errors and anchors list files.
func Parse(path string, data []byte) (*Policy, error) { return parse(path, data, Options{}) }

func parse(path string, data []byte, opt Options) (*Policy, error) {
	p := &parser{file: path, dir: filepath.Dir(path), opt: opt}
	dec := yamlpos.NewDecoder(path, data)
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if len(doc.Content) == 0 {
		return nil, &Error{File: path, Line: 1, Msg: "empty policy: it needs at least a rules list"}
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, err
		}
		return nil, &Error{File: path, Line: next.Line, Msg: "a second YAML document starts here: a policy is one document"}
	}
	pol, err := p.policy(doc.Content[0])
	if err != nil {
		return nil, err
	}
	pol.File = path
	pol.Warnings = unreachable(path, pol)
	return pol, nil
}

type parser struct {
	file string
	dir  string
	opt  Options
}

func (p *parser) errf(n *yaml.Node, field, format string, args ...any) error {
	return yamlpos.Errorf(p.file, n, field, format, args...)
}

// fields walks a mapping, refusing keys outside allowed and duplicate keys.
func (p *parser) fields(n *yaml.Node, what string, allowed ...string) (map[string]*yaml.Node, error) {
	return yamlpos.Fields(p.file, n, what, allowed...)
}

// strings reads a scalar or a sequence of scalars.
func (p *parser) strings(n *yaml.Node, field string) ([]string, error) {
	switch n.Kind {
	case yaml.ScalarNode:
		return []string{n.Value}, nil
	case yaml.SequenceNode:
		var out []string
		for _, c := range n.Content {
			if c.Kind != yaml.ScalarNode {
				return nil, p.errf(c, field, "must be a string")
			}
			out = append(out, c.Value)
		}
		return out, nil
	}
	return nil, p.errf(n, field, "must be a string or a list of strings")
}

func (p *parser) policy(root *yaml.Node) (*Policy, error) {
	top, err := p.fields(root, "policy", "lists", "rules", "default", "unparsed", "crowdsec", "flowspec")
	if err != nil {
		return nil, err
	}
	pol := &Policy{Lists: map[string]*List{}, Unparsed: Drop}
	if n := top["lists"]; n != nil {
		if err := p.lists(n, pol); err != nil {
			return nil, err
		}
	}
	if n := top["crowdsec"]; n != nil {
		if err := p.crowdsec(n, pol); err != nil {
			return nil, err
		}
	}
	if n := top["default"]; n != nil {
		if pol.Default, err = p.action(n, "default"); err != nil {
			return nil, err
		}
	}
	if n := top["unparsed"]; n != nil {
		if pol.Unparsed, err = p.action(n, "unparsed"); err != nil {
			return nil, err
		}
	}
	n := top["rules"]
	if n == nil {
		return nil, p.errf(root, "rules", "missing: a policy needs a rules list (it may be empty: rules: [])")
	}
	if n.Kind != yaml.SequenceNode {
		return nil, p.errf(n, "rules", "must be a list of rules")
	}
	if len(n.Content) > MaxRules {
		return nil, p.errf(n, "rules", "%d rules; at most %d are supported", len(n.Content), MaxRules)
	}
	if err := p.rules(n.Content, pol); err != nil {
		return nil, err
	}
	if _, use := pol.Usage(); use.Fits() != nil {
		return nil, p.errf(root, "rules", "%v", use.Fits())
	}
	if n := top["flowspec"]; n != nil {
		if err := p.flowspec(n, pol); err != nil {
			return nil, err
		}
	}
	return pol, nil
}

// rules reads items, the rules, into pol: in pieces on every CPU, since a
// feed's thousands take tens of milliseconds and each is read alone. Each
// piece gathers the inline prefixes its rules name; they become lists
// before its rules are checked against the ones before them (names used
// twice, the entries' total), so that pol, and the error when there is
// one, are what reading the rules in order makes.
func (p *parser) rules(items []*yaml.Node, pol *Policy) error {
	type piece struct {
		rules  []Rule
		inline map[string]*List
		err    error // at the rule after the last of rules
	}
	pieces := make([]piece, piecesOf(len(items)))
	InPieces(len(items), len(pieces), func(i, lo, hi int) {
		pc := &pieces[i]
		pc.rules, pc.inline = make([]Rule, 0, hi-lo), make(map[string]*List, hi-lo)
		for _, rn := range items[lo:hi] {
			r, err := p.rule(rn, pol.Lists, pc.inline)
			if err != nil {
				pc.err = err
				return
			}
			pc.rules = append(pc.rules, r)
		}
	})
	// Sized once for the inline prefixes, rather than grown as they come.
	lists := len(pol.Lists)
	for _, pc := range pieces {
		lists += len(pc.inline)
	}
	if lists > len(pol.Lists) {
		grown := make(map[string]*List, lists)
		maps.Copy(grown, pol.Lists)
		pol.Lists = grown
	}
	pol.Rules = make([]Rule, 0, len(items))
	seen := make(map[string]int, len(items))
	entries := 0
	for _, pc := range pieces {
		for name, l := range pc.inline {
			if pol.Lists[name] == nil {
				pol.Lists[name] = l
			}
		}
		for _, r := range pc.rules {
			rn := items[len(pol.Rules)]
			if line, dup := seen[r.Name]; dup {
				return p.errf(rn, "name", "rule name %q already used at line %d", r.Name, line)
			}
			seen[r.Name] = r.Line
			pol.Rules = append(pol.Rules, r)
			if entries += r.Entries(pol.Lists); entries > MaxRules {
				return p.errf(rn, "rules", "with their port lists, the rules need more than %d match entries (a rule takes one per pair of its sport and dport ranges, for each inline prefix beside its lists)", MaxRules)
			}
		}
		if pc.err != nil {
			return pc.err
		}
	}
	return nil
}

func (p *parser) lists(n *yaml.Node, pol *Policy) error {
	if n.Kind != yaml.MappingNode {
		return p.errf(n, "lists", "must map list names to {files: [...]} or {prefixes: [...]}")
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name := k.Value
		if err := validName(name); err != nil {
			return p.errf(k, "lists", "list name %q: %v", name, err)
		}
		if _, dup := pol.Lists[name]; dup {
			return p.errf(k, "lists", "list %q defined twice", name)
		}
		f, err := p.fields(v, "lists."+name, "files", "prefixes", "family")
		if err != nil {
			return err
		}
		family := 0
		if fn := f["family"]; fn != nil {
			switch fn.Value {
			case "4", "ipv4":
				family = 4
			case "6", "ipv6":
				family = 6
			default:
				return p.errf(fn, "lists."+name+".family", "%q: must be 4 or 6 (omit it for both)", fn.Value)
			}
		}
		var b listBuilder
		if fn := f["prefixes"]; fn != nil {
			vals, err := p.strings(fn, "lists."+name+".prefixes")
			if err != nil {
				return err
			}
			for j, s := range vals {
				if err := b.parseEntry([]byte(strings.TrimSpace(s)), family); err != nil {
					at := fn
					if fn.Kind == yaml.SequenceNode {
						at = fn.Content[j]
					}
					return p.errf(at, "lists."+name+".prefixes", "%v", err)
				}
			}
		}
		if fn := f["files"]; fn != nil {
			files, err := p.strings(fn, "lists."+name+".files")
			if err != nil {
				return err
			}
			for _, file := range files {
				if !filepath.IsAbs(file) {
					file = filepath.Join(p.dir, file)
				}
				pol.ListFiles = append(pol.ListFiles, file)
				if err := b.readFile(file, family, p.opt); err != nil {
					var le *Error
					if errors.As(err, &le) {
						return err
					}
					return p.errf(fn, "lists."+name+".files", "%v", err)
				}
			}
		}
		if f["files"] == nil && f["prefixes"] == nil {
			return p.errf(v, "lists."+name, "needs files or prefixes")
		}
		pol.Lists[name] = b.build(name, family)
	}
	return nil
}

func validName(s string) error {
	if s == "" {
		return errors.New("must not be empty")
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("may hold only letters, digits, '-', '_' and '.'")
		}
	}
	return nil
}

// ParsePrefix reads a CIDR prefix or a bare address (a host prefix), clearing
// host bits. An IPv4-mapped IPv6 prefix (::ffff:a.b.c.d/n, n >= 96) is the
// IPv4 prefix a.b.c.d/(n-96): the IPv4 traffic it names never carries an
// IPv6 header.
func ParsePrefix(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if addr, _, ok := strings.Cut(s, "/"); ok && strings.Contains(addr, "%") {
		return netip.Prefix{}, fmt.Errorf("%q: a zone (%s) has no place in a list: addresses on the wire carry none", s, addr[strings.Index(addr, "%"):])
	}
	if strings.Contains(s, "/") {
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("bad prefix %q: %v", s, strings.TrimPrefix(err.Error(), "netip.ParsePrefix("+strconv.Quote(s)+"): "))
		}
		return unmapPrefix(pfx.Masked()), nil
	}
	addr, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("bad address %q: neither an IP address nor a CIDR prefix", s)
	}
	if addr.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("%q: a zone (%%%s) has no place in a list: addresses on the wire carry none", s, addr.Zone())
	}
	addr = addr.Unmap()
	return netip.PrefixFrom(addr, addr.BitLen()), nil
}

func unmapPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p
}

// reservedNames are the counters every policy has besides its rules.
var reservedNames = map[string]bool{"default": true, "malformed": true, "non-ip": true, "unparsed": true}

var protoNames = map[string]int{"icmp": protoICMP, "tcp": protoTCP, "udp": protoUDP, "icmpv6": protoICMPv6}

// rule reads a rule; its inline prefixes that are not in lists yet go
// into inline.
func (p *parser) rule(n *yaml.Node, lists, inline map[string]*List) (Rule, error) {
	f, err := p.fields(n, "rule", "name", "src", "dst", "family", "proto", "sport", "dport", "tcp_flags", "length", "icmp_type", "icmp_code", "dscp", "flow_label", "fragment", "action", "rate", "burst", "per")
	if err != nil {
		return Rule{}, err
	}
	r := Rule{Line: n.Line}
	nameNode := f["name"]
	if nameNode == nil || nameNode.Value == "" {
		return r, p.errf(n, "name", "every rule needs a non-empty name")
	}
	r.Name = nameNode.Value
	if err := validName(r.Name); err != nil {
		return r, p.errf(nameNode, "name", "%q: %v", r.Name, err)
	}
	if reservedNames[r.Name] {
		return r, p.errf(nameNode, "name", "%q is reserved for rampart's own counters; choose another name", r.Name)
	}
	for _, side := range []struct {
		key string
		out *[]string
	}{{"src", &r.Src}, {"dst", &r.Dst}} {
		sn := f[side.key]
		if sn == nil {
			continue
		}
		vals, err := p.strings(sn, side.key)
		if err != nil {
			return r, err
		}
		for _, v := range vals {
			name, err := p.listRef(sn, side.key, v, lists, inline)
			if err != nil {
				return r, err
			}
			*side.out = append(*side.out, name)
		}
	}
	if fn := f["family"]; fn != nil {
		switch strings.TrimPrefix(strings.ToLower(fn.Value), "ipv") {
		case "4":
			r.Family = 4
		case "6":
			r.Family = 6
		default:
			return r, p.errf(fn, "family", "%q: must be 4 or 6", fn.Value)
		}
	}
	if fn := f["proto"]; fn != nil {
		if v, ok := protoNames[strings.ToLower(fn.Value)]; ok {
			rg := One(v)
			r.Proto = &rg
		} else if rg, err := parseRange(fn.Value, 255); err == nil {
			r.Proto = &rg
		} else {
			return r, p.errf(fn, "proto", "%q: use tcp, udp, icmp, icmpv6, a number 0-255 or a range of them (50-51)", fn.Value)
		}
	}
	for _, rf := range []struct {
		key string
		out *[]Range
	}{{"sport", &r.Sport}, {"dport", &r.Dport}} {
		fn := f[rf.key]
		if fn == nil {
			continue
		}
		vals, err := p.strings(fn, rf.key)
		if err != nil {
			return r, err
		}
		for _, v := range vals {
			rg, err := parseRange(v, 65535)
			if err != nil {
				return r, p.errf(fn, rf.key, "%v", err)
			}
			*rf.out = append(*rf.out, rg)
		}
	}
	if fn := f["length"]; fn != nil {
		rg, err := parseRange(fn.Value, 65535)
		if err != nil {
			return r, p.errf(fn, "length", "%v", err)
		}
		r.Length = &rg
	}
	if fn := f["tcp_flags"]; fn != nil {
		r.FlagsOn, r.FlagsOff, err = parseTCPFlags(fn.Value)
		if err != nil {
			return r, p.errf(fn, "tcp_flags", "%v", err)
		}
		r.HasFlags = true
	}
	for _, rf := range []struct {
		key string
		out **Range
		max uint32
	}{{"icmp_type", &r.ICMPType, 255}, {"icmp_code", &r.ICMPCode, 255}, {"dscp", &r.DSCP, 63}, {"flow_label", &r.FlowLabel, MaxFlowLabel}} {
		fn := f[rf.key]
		if fn == nil {
			continue
		}
		rg, err := parseRange(fn.Value, uint64(max(65535, rf.max)))
		if err == nil && rg.Hi > rf.max {
			err = fmt.Errorf("%q: at most %d", fn.Value, rf.max)
		}
		if err != nil {
			return r, p.errf(fn, rf.key, "%v", err)
		}
		*rf.out = &rg
	}
	if fn := f["fragment"]; fn != nil {
		r.FragOn, r.FragOff, err = parseBits(fn.Value, fragNames, "fragment bit")
		if err != nil {
			return r, p.errf(fn, "fragment", "%v", err)
		}
		r.HasFrag = true
	}
	an := f["action"]
	if an == nil {
		return r, p.errf(n, "action", "rule %q needs an action (drop, pass, limit or syncookie)", r.Name)
	}
	if r.Action, err = p.ruleAction(an); err != nil {
		return r, err
	}
	if err := p.limit(n, f, &r); err != nil {
		return r, err
	}
	if r.Action == Syncookie {
		switch {
		case r.Proto != nil && !r.ProtoIs(protoTCP):
			return r, p.errf(f["proto"], "proto", "rule %q: syncookie answers TCP SYNs; its proto must be tcp", r.Name)
		case r.Dport == nil:
			return r, p.errf(an, "dport", "rule %q: syncookie needs the listening ports (dport)", r.Name)
		}
		tcp := One(protoTCP)
		r.Proto = &tcp
	}
	return r, p.consistent(n, &r)
}

func (p *parser) ruleAction(n *yaml.Node) (Action, error) {
	for a, name := range actionNames {
		if strings.EqualFold(n.Value, name) {
			return Action(a), nil
		}
	}
	return Pass, p.errf(n, "action", "%q: must be drop, pass, limit or syncookie", n.Value)
}

// limit reads rate, burst and per, which only limit rules take.
func (p *parser) limit(n *yaml.Node, f map[string]*yaml.Node, r *Rule) error {
	if r.Action != Limit {
		for _, k := range []string{"rate", "burst", "per"} {
			if f[k] != nil {
				return p.errf(f[k], k, "rule %q: %s is for action: limit", r.Name, k)
			}
		}
		return nil
	}
	rn := f["rate"]
	if rn == nil {
		return p.errf(n, "rate", "rule %q: a limit needs a rate, e.g. rate: 200/s or rate: 10Mbit/s", r.Name)
	}
	l := &RateLimit{Prefix4: 32, Prefix6: 64}
	var err error
	if l.Rate, l.Bits, err = parseRate(rn.Value); err != nil {
		return p.errf(rn, "rate", "%v", err)
	}
	// Without a burst, as iptables' hashlimit and nft: 5 packets; for a
	// bit rate, 10 ms worth of bytes, at least one full-size frame.
	l.Burst = 5
	if l.Bits {
		l.Burst = max(1514, uint64(l.Rate/8/100))
	}
	if bn := f["burst"]; bn != nil {
		b, err := parseSize(bn.Value, l.Bits)
		if err != nil {
			return p.errf(bn, "burst", "%v", err)
		}
		l.Burst = b
	}
	if pn := f["per"]; pn != nil {
		if err := parsePer(pn.Value, r.Family, l); err != nil {
			return p.errf(pn, "per", "%v", err)
		}
	}
	r.Limit = l
	return nil
}

// parseRate reads "200/s" (packets) or "10Mbit/s", "500kbit/s", "1.5Gbit/s"
// (bits).
func parseRate(s string) (rate float64, bits bool, err error) {
	v, ok := strings.CutSuffix(strings.TrimSpace(s), "/s")
	if !ok {
		return 0, false, fmt.Errorf("%q: write the rate per second, e.g. 200/s or 10Mbit/s", s)
	}
	mult := 1.0
	for _, u := range []struct {
		suffix string
		mult   float64
	}{{"Gbit", 1e9}, {"Mbit", 1e6}, {"kbit", 1e3}, {"bit", 1}} {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			v, mult, bits = n, u.mult, true
			break
		}
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	switch {
	case err != nil || math.IsNaN(f) || math.IsInf(f, 0):
		return 0, false, fmt.Errorf("%q: not a rate; write e.g. 200/s or 10Mbit/s", s)
	case f <= 0:
		return 0, false, fmt.Errorf("%q: a rate must be above 0 (to drop everything, use action: drop)", s)
	case f*mult > 1e12:
		return 0, false, fmt.Errorf("%q: above a terabit or a trillion packets a second", s)
	case !bits && f < 1e-3:
		return 0, false, fmt.Errorf("%q: below one packet in a thousand seconds", s)
	}
	return f * mult, bits, nil
}

// parseSize reads a burst: packets, or bytes (with an optional kB, MB
// suffix) for a bit rate.
func parseSize(s string, bytes bool) (uint64, error) {
	v, mult := strings.TrimSpace(s), uint64(1)
	if bytes {
		for _, u := range []struct {
			suffix string
			mult   uint64
		}{{"MB", 1 << 20}, {"kB", 1 << 10}, {"B", 1}} {
			if n, ok := strings.CutSuffix(v, u.suffix); ok {
				v, mult = strings.TrimSpace(n), u.mult
				break
			}
		}
	}
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil || n == 0 {
		unit := "packets"
		if bytes {
			unit = "bytes (or kB, MB)"
		}
		return 0, fmt.Errorf("%q: want a whole number of %s, at least 1", s, unit)
	}
	return n * mult, nil
}

// parsePer reads rule, source, source/N or source/N,M (IPv4 /N, IPv6 /M;
// IPv6 defaults to /64, what one host is usually given). On a family: 6
// rule source/N is the IPv6 prefix.
func parsePer(s string, family int, l *RateLimit) error {
	v := strings.ToLower(strings.TrimSpace(s))
	if v == "rule" {
		return nil
	}
	rest, ok := strings.CutPrefix(v, "source")
	if !ok {
		return fmt.Errorf("%q: use rule, source, source/N (IPv4 prefix) or source/N,M (IPv4 and IPv6 prefixes)", s)
	}
	l.PerSource = true
	if rest == "" {
		return nil
	}
	spec, ok := strings.CutPrefix(rest, "/")
	if !ok {
		return fmt.Errorf("%q: use source/N or source/N,M", s)
	}
	v4, v6, both := strings.Cut(spec, ",")
	if family == 6 && !both {
		v4, v6, both = "32", v4, true
	}
	n, err := strconv.Atoi(strings.TrimSpace(v4))
	if err != nil || n < 1 || n > 32 {
		return fmt.Errorf("%q: an IPv4 prefix length is 1 to 32", s)
	}
	l.Prefix4 = n
	if both {
		m, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(v6), "/"))
		if err != nil || m < 1 || m > 128 {
			return fmt.Errorf("%q: an IPv6 prefix length is 1 to 128", s)
		}
		l.Prefix6 = m
	}
	return nil
}

// consistent refuses rules that could never match.
func (p *parser) consistent(n *yaml.Node, r *Rule) error {
	hasPorts := r.Sport != nil || r.Dport != nil
	if hasPorts && !r.ProtoAllows(protoTCP) && !r.ProtoAllows(protoUDP) {
		return p.errf(n, "proto", "rule %q matches ports, which only tcp and udp have", r.Name)
	}
	if r.HasFlags && !r.ProtoAllows(protoTCP) {
		return p.errf(n, "tcp_flags", "rule %q matches TCP flags but its proto is not tcp", r.Name)
	}
	if r.ICMPType != nil || r.ICMPCode != nil {
		switch {
		case !r.ProtoAllows(protoICMP) && !r.ProtoAllows(protoICMPv6):
			return p.errf(n, "icmp_type", "rule %q matches an ICMP type or code but its proto is not icmp or icmpv6", r.Name)
		case hasPorts || r.HasFlags:
			return p.errf(n, "icmp_type", "rule %q matches an ICMP type or code and ports or TCP flags: no packet has both", r.Name)
		}
	}
	if r.FlowLabel != nil && (r.Family == 4 || r.ProtoIs(protoICMP)) {
		return p.errf(n, "flow_label", "rule %q matches a flow label, which only IPv6 has, and IPv4 alone", r.Name)
	}
	if r.ProtoIs(protoICMP) && r.Family == 6 || r.ProtoIs(protoICMPv6) && r.Family == 4 {
		return p.errf(n, "proto", "rule %q: icmp is IPv4's and icmpv6 is IPv6's", r.Name)
	}
	return nil
}

// listRef resolves a src/dst value: a list name, or an inline prefix that
// becomes a list of its own named by the prefix.
func (p *parser) listRef(n *yaml.Node, field, v string, lists, inline map[string]*List) (string, error) {
	if lists[v] != nil || inline[v] != nil {
		return v, nil
	}
	pfx, err := ParsePrefix(v)
	if err != nil {
		if strings.ContainsAny(v, ".:/") {
			return "", p.errf(n, field, "%v", err)
		}
		return "", p.errf(n, field, "%q is neither a list defined under lists nor a prefix", v)
	}
	name := pfx.String()
	if lists[name] == nil && inline[name] == nil {
		inline[name] = inlineList(pfx, name)
	}
	return name, nil
}

// action reads the default and unparsed actions: pass or drop.
func (p *parser) action(n *yaml.Node, field string) (Action, error) {
	switch strings.ToLower(n.Value) {
	case "drop":
		return Drop, nil
	case "pass":
		return Pass, nil
	}
	return Pass, p.errf(n, field, "%q: must be drop or pass", n.Value)
}

// parseRange reads a number or a range lo-hi of numbers up to max.
func parseRange(s string, max uint64) (Range, error) {
	a, b, isRange := strings.Cut(strings.TrimSpace(s), "-")
	if !isRange {
		b = a
	}
	lo, err1 := strconv.ParseUint(strings.TrimSpace(a), 10, 32)
	hi, err2 := strconv.ParseUint(strings.TrimSpace(b), 10, 32)
	switch {
	case err1 != nil || err2 != nil:
		return Range{}, fmt.Errorf("%q: want a number or a range lo-hi", s)
	case lo > max || hi > max:
		return Range{}, fmt.Errorf("%q: values go up to %d", s, max)
	case lo > hi:
		return Range{}, fmt.Errorf("%q: start is above end", s)
	}
	return Range{uint32(lo), uint32(hi)}, nil
}

func parseTCPFlags(s string) (on, off uint8, err error) { return parseBits(s, tcpFlagNames, "flag") }

func parseBits(s string, names []string, what string) (on, off uint8, err error) {
	for _, part := range strings.Split(s, ",") {
		part = strings.ToLower(strings.TrimSpace(part))
		neg := strings.HasPrefix(part, "!")
		name := strings.TrimPrefix(part, "!")
		bit := slices.Index(names, name)
		if bit < 0 {
			return 0, 0, fmt.Errorf("%q: unknown %s %q (%ss: %s; prefix ! for must-be-clear)", s, what, name, what, strings.Join(names, ","))
		}
		if neg {
			off |= 1 << bit
		} else {
			on |= 1 << bit
		}
	}
	if on&off != 0 {
		return 0, 0, fmt.Errorf("%q: a %s cannot be both set and clear", s, what)
	}
	return on, off, nil
}

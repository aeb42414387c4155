package policy

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestParseExample(t *testing.T) {
	pol, err := Parse("testdata/p.yaml", []byte(`
lists:
  blocklist: {files: [block.netset]}
  mgmt: {prefixes: [192.0.2.0/24, "2001:db8::/32"]}
rules:
  - {name: ssh-from-mgmt, src: mgmt, proto: tcp, dport: 22, action: pass}
  - {name: drop-blocklist, src: blocklist, action: drop}
  - {name: dns-amplification, proto: udp, sport: 53, length: 512-65535, action: drop}
  - {name: syn-to-closed, proto: tcp, dport: 1-1023, tcp_flags: "syn,!ack", action: drop}
  - {name: inline, dst: [10.0.0.1, "2001:db8::/64"], family: 6, action: drop}
default: pass
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(pol.Rules) != 5 || pol.Default != Pass {
		t.Fatalf("rules %d default %v", len(pol.Rules), pol.Default)
	}
	if got := pol.Lists["blocklist"].Entries; got != 3 {
		t.Errorf("blocklist has %d prefixes, want 3", got)
	}
	r := pol.Rules[3]
	if !r.ProtoIs(6) || !slices.Equal(r.Dport, []Range{{1, 1023}}) || r.FlagsOn != FlagSYN || r.FlagsOff != FlagACK {
		t.Errorf("syn-to-closed parsed as %+v", r)
	}
	if r := pol.Rules[2]; *r.Length != (Range{512, 65535}) || !slices.Equal(r.Sport, []Range{{53, 53}}) {
		t.Errorf("dns rule parsed as %+v", r)
	}
	if got := pol.Rules[4].Dst; len(got) != 2 || got[0] != "10.0.0.1/32" || got[1] != "2001:db8::/64" {
		t.Errorf("inline prefixes became lists %v", got)
	}
	if !pol.Lists["blocklist"].Contains(netip.MustParseAddr("203.0.113.7")) || pol.Lists["blocklist"].Contains(netip.MustParseAddr("203.0.113.8")) {
		t.Error("list membership wrong")
	}
}

func TestErrors(t *testing.T) {
	for _, c := range []struct{ name, yaml, want string }{
		{"unknown top key", "rulez: []", `p.yaml:1: policy: unknown key "rulez"`},
		{"unknown rule key", "rules:\n  - {name: a, action: drop, dprt: 5}", `p.yaml:2: rule: unknown key "dprt"`},
		{"missing rules", "default: drop", "p.yaml:1: rules: missing"},
		{"bad cidr", "lists:\n  x: {prefixes: [10.0.0.0/33]}\nrules: []", `p.yaml:2: lists.x.prefixes: bad prefix "10.0.0.0/33"`},
		{"bad inline cidr", "rules:\n  - {name: a, src: 10.0.0.0/40, action: drop}", `p.yaml:2: src: bad prefix "10.0.0.0/40"`},
		{"port over 65535", "rules:\n  - {name: a, proto: udp, dport: 70000, action: drop}", `p.yaml:2: dport: "70000": values go up to 65535`},
		{"range backwards", "rules:\n  - {name: a, proto: udp, dport: 90-80, action: drop}", `p.yaml:2: dport: "90-80": start is above end`},
		{"empty name", "rules:\n  - {name: '', action: drop}", "p.yaml:2: name: every rule needs a non-empty name"},
		{"no name", "rules:\n  - {action: drop}", "p.yaml:2: name: every rule needs a non-empty name"},
		{"reserved name", "rules:\n  - {name: default, action: drop}", `p.yaml:2: name: "default" is reserved`},
		{"duplicate name", "rules:\n  - {name: a, action: drop}\n  - {name: a, action: pass}", `p.yaml:3: name: rule name "a" already used at line 2`},
		{"missing list file", "lists:\n  x: {files: [nope.netset]}\nrules: []", "p.yaml:2: lists.x.files: list file testdata/nope.netset: open testdata/nope.netset: no such file or directory"},
		{"bad line in list file", "lists:\n  x: {files: [bad.netset]}\nrules: []", `testdata/bad.netset:2: bad address "10.0.0.300"`},
		{"unknown list", "rules:\n  - {name: a, src: nolist, action: drop}", `p.yaml:2: src: "nolist" is neither a list defined under lists nor a prefix`},
		{"bad action", "rules:\n  - {name: a, action: reject}", `p.yaml:2: action: "reject": must be drop, pass, limit or syncookie`},
		{"limit without rate", "rules:\n  - {name: a, action: limit}", `p.yaml:2: rate: rule "a": a limit needs a rate`},
		{"rate 0", "rules:\n  - {name: a, action: limit, rate: 0/s}", `p.yaml:2: rate: "0/s": a rate must be above 0`},
		{"negative rate", "rules:\n  - {name: a, action: limit, rate: -5/s}", `p.yaml:2: rate: "-5/s": a rate must be above 0`},
		{"rate unparsable", "rules:\n  - {name: a, action: limit, rate: lots/s}", `p.yaml:2: rate: "lots/s": not a rate`},
		{"rate without unit", "rules:\n  - {name: a, action: limit, rate: 200}", `p.yaml:2: rate: "200": write the rate per second`},
		{"per source/33", "rules:\n  - {name: a, action: limit, rate: 200/s, per: source/33}", `p.yaml:2: per: "source/33": an IPv4 prefix length is 1 to 32`},
		{"per source/129 on IPv6", "rules:\n  - {name: a, family: 6, action: limit, rate: 200/s, per: source/129}", `an IPv6 prefix length is 1 to 128`},
		{"per source v6 129", "rules:\n  - {name: a, action: limit, rate: 200/s, per: 'source/24,129'}", `an IPv6 prefix length is 1 to 128`},
		{"per nonsense", "rules:\n  - {name: a, action: limit, rate: 200/s, per: flow}", `p.yaml:2: per: "flow": use rule, source`},
		{"burst 0", "rules:\n  - {name: a, action: limit, rate: 200/s, burst: 0}", `p.yaml:2: burst: "0": want a whole number of packets`},
		{"burst bytes", "rules:\n  - {name: a, action: limit, rate: 10Mbit/s, burst: 64kb}", `burst: "64kb": want a whole number of bytes`},
		{"rate on drop", "rules:\n  - {name: a, action: drop, rate: 5/s}", `p.yaml:2: rate: rule "a": rate is for action: limit`},
		{"syncookie on udp", "rules:\n  - {name: a, proto: udp, dport: 53, action: syncookie}", `p.yaml:2: proto: rule "a": syncookie answers TCP SYNs; its proto must be tcp`},
		{"syncookie without port", "rules:\n  - {name: a, proto: tcp, action: syncookie}", `p.yaml:2: dport: rule "a": syncookie needs the listening ports`},
		{"bad port in list", "rules:\n  - {name: a, proto: tcp, dport: [80, x], action: drop}", `p.yaml:2: dport: "x": want a number`},
		{"missing action", "rules:\n  - {name: a}", `p.yaml:2: action: rule "a" needs an action`},
		{"bad proto", "rules:\n  - {name: a, proto: sctpx, action: drop}", `p.yaml:2: proto: "sctpx"`},
		{"proto 256", "rules:\n  - {name: a, proto: 256, action: drop}", `p.yaml:2: proto: "256"`},
		{"ports on icmp", "rules:\n  - {name: a, proto: icmp, dport: 5, action: drop}", `p.yaml:2: proto: rule "a" matches ports`},
		{"flags on udp", "rules:\n  - {name: a, proto: udp, tcp_flags: syn, action: drop}", `p.yaml:2: tcp_flags: rule "a" matches TCP flags`},
		{"bad flag", "rules:\n  - {name: a, tcp_flags: 'syn,foo', action: drop}", `p.yaml:2: tcp_flags: "syn,foo": unknown flag "foo"`},
		{"flag both ways", "rules:\n  - {name: a, tcp_flags: 'syn,!syn', action: drop}", `cannot be both set and clear`},
		{"bad family", "rules:\n  - {name: a, family: 5, action: drop}", `p.yaml:2: family: "5": must be 4 or 6`},
		{"bad default", "default: maybe\nrules: []", `p.yaml:1: default: "maybe"`},
		{"list twice key", "lists:\n  x: {prefixes: [10.0.0.0/8], prefixes: [10.0.0.0/8]}\nrules: []", `p.yaml:2: lists.x: key "prefixes" given twice`},
		{"list without source", "lists:\n  x: {}\nrules: []", `p.yaml:2: lists.x: needs files or prefixes`},
		{"bad yaml", "rules: [", "p.yaml:1: syntax: sequence end token ']' not found"},
		{"empty file", "", "p.yaml:1: empty policy"},
		{"rules not a list", "rules: {a: 1}", "p.yaml:1: rules: must be a list"},
		{"icmp with v6", "rules:\n  - {name: a, proto: icmp, family: 6, action: drop}", "icmp is IPv4's"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("testdata/p.yaml", []byte(c.yaml))
			if err == nil {
				t.Fatalf("no error, want %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q\nwant it to contain %q", err, c.want)
			}
		})
	}
}

func TestTooManyRules(t *testing.T) {
	var b strings.Builder
	b.WriteString("rules:\n")
	for i := 0; i <= MaxRules; i++ {
		b.WriteString("  - {name: r" + strconv.Itoa(i) + ", action: drop}\n")
	}
	if _, err := Parse("p.yaml", []byte(b.String())); err == nil || !strings.Contains(err.Error(), "at most "+strconv.Itoa(MaxRules)) {
		t.Fatalf("got %v", err)
	}
}

// TestManyPrefixes: inline prefixes take no list bit, alone on their side
// or beside lists, so a policy names thousands; lists are held to
// MaxListWays ways, and a prefix beside lists takes entries of its own.
func TestManyPrefixes(t *testing.T) {
	var b strings.Builder
	b.WriteString("rules:\n")
	for i := range 5000 {
		fmt.Fprintf(&b, "  - {name: r%d, src: 10.%d.%d.0/24, dst: \"2001:db8::%x\", action: drop}\n", i, i>>8, i&0xff, i)
	}
	pol, err := Parse("p.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if _, masked := pol.Usage(); len(pol.Lists) != 10_000 || masked.Lists() != 0 {
		t.Fatalf("%d prefixes, %d taking a list bit; want 10,000 and none", len(pol.Lists), masked.Lists())
	}
	b.Reset()
	b.WriteString("lists:\n  l: {prefixes: [192.0.2.0/24]}\nrules:\n")
	for i := range 2000 {
		fmt.Fprintf(&b, "  - {name: r%d, src: [l, 10.0.%d.0/24, \"2001:db8:%x::/48\"], dport: [1, 2], action: drop}\n", i, i%256, i)
	}
	pol, err = Parse("p.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if entries, masked := pol.Usage(); masked.Lists() != 1 || entries != 2000*3*2 {
		t.Fatalf("2,000 rules of a list and two prefixes, two ports each: %d lists taking a bit, %d entries; want 1 and 12,000", masked.Lists(), entries)
	}
	// Lists named in more than MaxLists ways load, up to MaxListWays.
	many := func(n int) error {
		b.Reset()
		b.WriteString("lists:\n")
		for i := range n {
			fmt.Fprintf(&b, "  l%d: {prefixes: [10.%d.%d.0/24]}\n", i, i>>8, i&0xff)
		}
		b.WriteString("rules:\n")
		for i := range n {
			fmt.Fprintf(&b, "  - {name: r%d, src: [l%d, 192.0.2.%d], action: drop}\n", i, i, i&0xff)
		}
		_, err := Parse("p.yaml", []byte(b.String()))
		return err
	}
	if err := many(MaxLists + 1); err != nil {
		t.Fatalf("%d lists in as many ways: %v", MaxLists+1, err)
	}
	if err := many(MaxListWays + 1); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("rules refer to %d distinct lists in %d distinct ways; at most %d", MaxListWays+1, MaxListWays+1, MaxListWays)) {
		t.Fatalf("%d lists: got %v", MaxListWays+1, err)
	}
}

func TestListFileRelativeToPolicy(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "l.txt"), []byte("192.0.2.1\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "p.yaml"), []byte("lists:\n  l: {files: [l.txt]}\nrules:\n  - {name: a, src: l, action: drop}\n"), 0o644)
	pol, err := Load(filepath.Join(dir, "p.yaml"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !pol.Lists["l"].Contains(netip.MustParseAddr("192.0.2.1")) {
		t.Fatal("list not loaded")
	}
}

func TestParseFrameShort(t *testing.T) {
	for n := 0; n < 14; n++ {
		if _, c := ParseFrame(make([]byte, n)); c != ClassMalformed {
			t.Errorf("%d-byte frame: class %v, want malformed", n, c)
		}
	}
}

// TestLimitAndSyncookie parses the flood actions as the README writes them.
func TestLimitAndSyncookie(t *testing.T) {
	pol, err := Parse("p.yaml", []byte(`
rules:
  - {name: dns-per-source, proto: udp, dport: 53, action: limit, rate: 200/s, burst: 400, per: source/24}
  - {name: bulk, proto: udp, action: limit, rate: 1.5Mbit/s, burst: 64kB}
  - {name: v6-hosts, family: 6, action: limit, rate: 10/s, per: source/56}
  - {name: web, dport: [80, 443, 8000-8010], action: syncookie}
default: pass
`))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []RateLimit{
		{Rate: 200, Burst: 400, PerSource: true, Prefix4: 24, Prefix6: 64},
		{Rate: 1.5e6, Bits: true, Burst: 64 << 10, Prefix4: 32, Prefix6: 64},
		{Rate: 10, Burst: 5, PerSource: true, Prefix4: 32, Prefix6: 56},
	} {
		if r := pol.Rules[i]; r.Action != Limit || r.Limit == nil || *r.Limit != want {
			t.Errorf("rule %d: %v %+v, want %+v", i, r.Action, r.Limit, want)
		}
	}
	web := pol.Rules[3]
	if web.Action != Syncookie || !web.ProtoIs(protoTCP) || !slices.Equal(web.Dport, []Range{{80, 80}, {443, 443}, {8000, 8010}}) {
		t.Errorf("web: %+v", web)
	}
	if k := web.MatchKey(); !strings.Contains(k, "dport=80,443,8000-8010") || !strings.Contains(k, "action=syncookie") {
		t.Errorf("match key %q", k)
	}
}

// TestRulesInPieces: rules read in pieces on several CPUs make the policy
// rules read in order make, inline prefixes shared across pieces
// included, and the error reported is the first in the file, whichever
// piece finds it and whatever the check.
func TestRulesInPieces(t *testing.T) {
	feed := func(n int, bad map[int]string) []byte {
		var b strings.Builder
		b.WriteString("lists:\n  l: {prefixes: [192.0.2.0/24]}\nrules:\n")
		for i := range n {
			if line, ok := bad[i]; ok {
				b.WriteString(line + "\n")
				continue
			}
			// Prefixes repeat within and across pieces; every tenth is not canonical.
			src := fmt.Sprintf("10.%d.%d.0/24", i%7, i%250)
			if i%10 == 0 {
				src = fmt.Sprintf("10.%d.%d.9/24", i%7, i%250)
			}
			fmt.Fprintf(&b, "  - {name: r%d, src: [l, %s], dport: %d, action: drop}\n", i, src, 1+i%1000)
		}
		return []byte(b.String())
	}
	parse := func(procs int, data []byte) (*Policy, error) {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
		return Parse("p.yaml", data)
	}
	data := feed(8000, nil)
	inOrder, err := parse(1, data)
	if err != nil {
		t.Fatal(err)
	}
	inPieces, err := parse(4, data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(inOrder, inPieces) {
		t.Errorf("read in pieces, the policy differs from the one read in order")
	}
	for _, c := range []struct {
		name string
		bad  map[int]string
		want string
	}{
		// The line of rule i is i+4.
		{"a bad rule in a later piece than a name used twice", map[int]string{1500: "  - {name: r1, action: drop}", 6500: "  - {name: x, action: jump}"}, `p.yaml:1504: name: rule name "r1" already used at line 5`},
		{"a name used twice in a later piece than a bad rule", map[int]string{1500: "  - {name: x, action: jump}", 6500: "  - {name: r1, action: drop}"}, `p.yaml:1504: action: "jump"`},
		{"two bad rules in one piece", map[int]string{7000: "  - {name: x, proto: sctp-ish, action: drop}", 7001: "  - {name: y, action: jump}"}, `p.yaml:7004: proto:`},
	} {
		for _, procs := range []int{1, 4} {
			_, err := parse(procs, feed(8000, c.bad))
			if err == nil || !strings.HasPrefix(err.Error(), c.want) {
				t.Errorf("%s, %d CPUs: got %v, want %s…", c.name, procs, err, c.want)
			}
		}
	}
}

// TestMatchKeys: the keys made on every CPU are each rule's MatchKey, in
// order.
func TestMatchKeys(t *testing.T) {
	var b strings.Builder
	b.WriteString("rules:\n")
	for i := range 5000 {
		fmt.Fprintf(&b, "  - {name: r%d, src: 10.0.%d.0/24, dport: %d, action: drop}\n", i, i%250, i+1)
	}
	pol, err := Parse("p.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	keys := MatchKeys(pol.Rules)
	for i := range pol.Rules {
		if keys[i] != pol.Rules[i].MatchKey() {
			t.Fatalf("rule %d: key %q, want %q", i, keys[i], pol.Rules[i].MatchKey())
		}
	}
}

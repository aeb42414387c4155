package engine

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/rampart-fw/rampart/internal/compile"
	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/packet"
	"github.com/rampart-fw/rampart/internal/policy"
)

// TestListFileChanges: a change to what list files hold, the policy
// otherwise the same, is carried by a new generation over the live one's
// tables, and the program the kernel runs judges as a compile would.
// Random contents for two lists' files (nested prefixes of both
// families), live changes, reverts and applies that fold, in random
// order; after each step every probe (each prefix's edges and random
// addresses) is judged as the files with the live changes say.
func TestListFileChanges(t *testing.T) {
	p, fw := firewallOnPair(t)
	h := Hook{Iface: p.IfB}
	defer func(n int) { baseRanges = n }(baseRanges)
	baseRanges = 1 // every list keeps its base

	pool := []string{"10.0.0.0/8", "10.1.0.0/16", "10.1.2.0/24", "10.1.2.3/32", "10.1.2.128/25", "10.2.3.4/32", "10.3.0.0/16",
		"10.1.2.4/30", "10.2.0.0/15", "2001:db8::/32", "2001:db8:1::/48", "2001:db8:1:2::/64", "2001:db8:1:2::5/128",
		"2001:db8:2::/48", "2001:db8:1:2::4/126"}
	probes := probesOf(pool, rand.New(rand.NewPCG(1, 2)))
	rng := rand.New(rand.NewPCG(7, 9))
	dir := t.TempDir()
	files := map[string]string{"a": filepath.Join(dir, "a.list"), "b": filepath.Join(dir, "b.list")}
	write := func(list string) {
		var lines []string
		for _, s := range pool {
			if rng.IntN(3) == 0 {
				lines = append(lines, s)
			}
		}
		if err := os.WriteFile(files[list], []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a")
	write("b")
	text := "lists:\n  a: {files: [" + files["a"] + "]}\n  b: {files: [" + files["b"] + "]}\n" +
		"rules:\n  - {name: b, src: b, action: pass}\n  - {name: a, src: a, action: drop}\ndefault: pass\n"
	all := func(string) bool { return true }
	apply := func(fold func(string) bool) Applied {
		t.Helper()
		res, err := fw.Apply(ApplyRequest{Policy: parse(t, dir, "p.yaml", text), Ifaces: []string{p.IfB}, Mode: datapath.ModeXDPNative, Fold: fold})
		if err != nil {
			t.Fatal(err)
		}
		return res.Applied[0]
	}
	apply(nil)

	check := func(step string) {
		t.Helper()
		judgeLists(t, fw, h, probes, step, parse(t, dir, "p.yaml", text))
	}

	carried, compiled := 0, 0
	for i := range 150 {
		step := ""
		switch k := rng.IntN(20); {
		case k < 8:
			before, program := liveGen(t, fw, h), linkProgram(t, fw, h)
			ops, err := fw.Changes()
			if err != nil {
				t.Fatal(err)
			}
			list := []string{"a", "b"}[rng.IntN(2)]
			write(list)
			if rng.IntN(4) == 0 { // lists of the same contents, which share a base
				other := map[string]string{"a": "b", "b": "a"}[list]
				if b, err := os.ReadFile(files[list]); err != nil || os.WriteFile(files[other], b, 0o644) != nil {
					t.Fatal(err)
				}
			}
			// With changes folded, as the daemon does (an apply that does
			// not fold compiles them out of the tables): carried when
			// there is nothing more to fold.
			var fold func(string) bool
			if slices.ContainsFunc(ops, before.folded) {
				fold = all
			}
			a := apply(fold)
			g := liveGen(t, fw, h)
			if fold != nil && !before.foldsAll(ops, all) {
				compiled++
				step = "files changed, changes folded"
				break
			}
			if linkProgram(t, fw, h) != program {
				t.Fatalf("step %d: a change of the files alone loaded a new program", i)
			}
			if g.BaseHash != before.BaseHash || len(g.FileOps) != a.FileChanges {
				t.Fatalf("step %d: a change of the files alone compiled (base %s, was %s) or misreports its %d overlay prefixes (%d)",
					i, g.BaseHash, before.BaseHash, len(g.FileOps), a.FileChanges)
			}
			if len(g.FileOps) == 0 && g.PolicyHash != g.BaseHash {
				t.Fatalf("step %d: the files back as compiled, yet the policy hash is %s, not the tables' %s", i, g.PolicyHash, g.BaseHash)
			}
			for name, info := range g.Lists {
				if was := before.Lists[name]; !info.Base || !was.Base || info.Digest != was.Digest {
					t.Fatalf("step %d: list %s keeps base %v of %s, was %v of %s", i, name, info.Base, info.Digest, was.Base, was.Digest)
				}
			}
			carried++
			step = "files changed"
		case k < 14:
			c := ListChange{List: []string{"a", "b"}[rng.IntN(2)], Add: rng.IntN(3) != 0}
			for range 1 + rng.IntN(2) {
				c.Prefixes = append(c.Prefixes, netip.MustParsePrefix(pool[rng.IntN(len(pool))]))
			}
			if _, err := fw.ChangeList(c); err != nil {
				t.Fatal(err)
			}
			step = "live change"
		case k < 16:
			g := liveGen(t, fw, h)
			removed, err := fw.RevertList([]string{"a", "b"}[rng.IntN(2)], nil)
			if err != nil {
				t.Fatal(err)
			}
			if slices.ContainsFunc(removed, g.folded) {
				apply(all) // as the daemon does: the rebuild a folded change reverted owes
			}
			step = "revert"
		default:
			ops, err := fw.Changes()
			if err != nil {
				t.Fatal(err)
			}
			before := liveGen(t, fw, h)
			apply(all)
			g := liveGen(t, fw, h)
			if toFold := !before.foldsAll(ops, all); toFold && len(g.FileOps) != 0 {
				t.Fatalf("step %d: a fold with changes to take compiles the files, yet %d of their changes stay in the overlay", i, len(g.FileOps))
			} else if !toFold && g.BaseHash != before.BaseHash {
				t.Fatalf("step %d: a fold with nothing to take compiled", i)
			}
			compiled++
			step = "fold"
		}
		check(step)
	}
	t.Logf("%d changes of the files carried, %d folds", carried, compiled)
	if carried < 30 || compiled < 10 {
		t.Errorf("too few file changes (%d) or folds (%d) to mean anything", carried, compiled)
	}

	// A rule changed compiles, and what a generation's base is, goes with
	// the generations that keep it.
	before := liveGen(t, fw, h)
	text = strings.Replace(text, "default: pass", "default: pass\nunparsed: pass", 1)
	if a := apply(nil); a.FileChanges != 0 || liveGen(t, fw, h).BaseHash == before.BaseHash {
		t.Fatalf("a rule changed: %d changes carried over the old tables", a.FileChanges)
	}
	check("rule changed")
	left, err := filepath.Glob(filepath.Join(fw.stateDir(h), "gen-*.lists", "*"))
	bases := map[string]bool{}
	for _, info := range liveGen(t, fw, h).Lists {
		bases[info.Digest] = info.Base
	}
	if err != nil || len(left) != len(bases) || slices.Contains(slices.Collect(maps.Values(bases)), false) {
		t.Fatalf("bases kept: %v, %v: want the live generation's %v", left, err, bases)
	}
}

// probesOf are the edges of each prefix of pool, and random addresses in
// and around them.
func probesOf(pool []string, rng *rand.Rand) []netip.Addr {
	var probes []netip.Addr
	for _, s := range pool {
		pf := netip.MustParsePrefix(s)
		last := policy.PrefixRange6(pf).Hi.Addr()
		if pf.Addr().Is4() {
			last = policy.UintToV4(policy.PrefixRange4(pf).Hi)
		}
		probes = append(probes, pf.Addr(), pf.Addr().Prev(), last, last.Next())
	}
	for range 100 {
		probes = append(probes, netip.AddrFrom4([4]byte{10, byte(rng.IntN(4)), byte(rng.IntN(4)), byte(rng.IntN(256))}),
			netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, byte(rng.IntN(3)), 0, byte(rng.IntN(3)), 15: byte(rng.IntN(8))}))
	}
	return slices.DeleteFunc(probes, func(a netip.Addr) bool { return !a.IsValid() })
}

// judgeLists judges probes as pol's lists a and b with the live changes
// say: dropped when in a and not in b.
func judgeLists(t *testing.T, fw *Firewall, h Hook, probes []netip.Addr, step string, pol *policy.Policy) {
	t.Helper()
	ops, err := fw.Changes()
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		pol.Lists[op.List].Ops = append(pol.Lists[op.List].Ops, op)
	}
	judge(t, fw, h, probes, step, func(a netip.Addr) bool { return !pol.Lists["b"].Contains(a) && pol.Lists["a"].Contains(a) })
}

// judge runs a UDP frame from each probe through the program the hook's
// link runs: dropped exactly where drop says.
func judge(t *testing.T, fw *Firewall, h Hook, probes []netip.Addr, step string, drop func(netip.Addr) bool) {
	t.Helper()
	prog, err := fw.Program(h)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	for _, a := range probes {
		dst := netip.MustParseAddr("192.0.2.1")
		if a.Is6() {
			dst = netip.MustParseAddr("2001:db8:ff::1")
		}
		want := uint32(2) // XDP_PASS
		if drop(a) {
			want = 1 // XDP_DROP
		}
		got, err := prog.Run(&ebpf.RunOptions{Data: packet.Frame{Src: a, Dst: dst, Proto: 17, Sport: 1, Dport: 2}.Bytes()})
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("%s: %s judged %d, want %d", step, a, got, want)
		}
	}
}

// TestSameBits: a list change is carried only while the lists keep their
// bits, which past 63 ways the lists the service favours decide
// (Policy.Live): the ban API makes a static list live so, and a reload
// carried over the old bits would leave it static.
func TestSameBits(t *testing.T) {
	var b strings.Builder
	b.WriteString("lists:\n")
	for i := range 70 {
		fmt.Fprintf(&b, "  l%d: {prefixes: [10.%d.0.0/16]}\n", i, i)
	}
	b.WriteString("rules:\n")
	for i := range 70 {
		fmt.Fprintf(&b, "  - {name: r%d, src: l%d, action: drop}\n", i, i)
	}
	dir := t.TempDir()
	pol := parse(t, dir, "p.yaml", b.String())
	g := describe(pol, compile.Build(pol), "hash")
	static := ""
	for name, info := range g.Lists {
		if info.Bit == 0 {
			static = name
		}
	}
	if static == "" || !sameBits(pol, &g) {
		t.Fatalf("70 ways: no static list (%q), or the policy's own bits differ from themselves", static)
	}
	again := parse(t, dir, "p.yaml", b.String())
	again.Live = map[string]bool{static: true}
	if sameBits(again, &g) {
		t.Fatalf("list %s made live takes a bit, yet the bits count as the same", static)
	}
}

// TestSkeletonSeesRules: the skeleton is the rules' JSON, which sees
// every field of a rule and of what it holds only while none is
// unexported or left out by a tag. A field added so would let two
// policies of different rules share a skeleton, and a change to it be
// carried as a change of lists.
func TestSkeletonSeesRules(t *testing.T) {
	seen := map[reflect.Type]bool{}
	var walk func(reflect.Type, string)
	walk = func(ty reflect.Type, path string) {
		for ty.Kind() == reflect.Pointer || ty.Kind() == reflect.Slice {
			ty = ty.Elem()
		}
		if ty.Kind() != reflect.Struct || seen[ty] || ty.PkgPath() != reflect.TypeFor[policy.Rule]().PkgPath() {
			return
		}
		seen[ty] = true
		for f := range ty.Fields() {
			if !f.IsExported() || f.Tag.Get("json") == "-" {
				t.Errorf("%s.%s: the skeleton's JSON does not see it", path, f.Name)
			}
			walk(f.Type, path+"."+f.Name)
		}
	}
	walk(reflect.TypeFor[policy.Rule](), "Rule")
	pol := parse(t, t.TempDir(), "p.yaml", "rules:\n  - {name: a, proto: udp, dport: 53, action: drop}\n")
	other := parse(t, t.TempDir(), "p.yaml", "rules:\n  - {name: a, proto: udp, dport: 54, action: drop}\n")
	if skeleton(pol) == "" || skeleton(pol) == skeleton(other) {
		t.Errorf("skeletons %q and %q of two policies of different ports", skeleton(pol), skeleton(other))
	}
}

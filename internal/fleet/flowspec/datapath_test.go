package flowspec

import (
	"bytes"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/compile"
	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/packet"
	"github.com/rampart-fw/rampart/internal/policy"
	"github.com/rampart-fw/rampart/internal/testutil"
)

// rfcPrecedes is RFC 8955 Appendix A's flow_rule_cmp (with RFC 8956 §4's offsets), transliterated
// line by line: whether a has precedence over b. The reference orders
// routes with it; the service orders them with Compare.
func rfcPrecedes(a, b *Route) bool {
	for i := 0; i < max(len(a.Components), len(b.Components)); i++ {
		if i >= len(a.Components) {
			return false // B_HAS_PRECEDENCE
		}
		if i >= len(b.Components) {
			return true
		}
		ca, cb := a.Components[i], b.Components[i]
		if ca.Type < cb.Type {
			return true
		}
		if ca.Type > cb.Type {
			return false
		}
		if ca.Type == TypeDst || ca.Type == TypeSrc {
			// RFC 8956 §4: "offset not equal, lowest offset has precedence".
			if ca.Offset != cb.Offset {
				return ca.Offset < cb.Offset
			}
			if ca.Prefix.Overlaps(cb.Prefix) {
				if ca.Prefix.Bits() > cb.Prefix.Bits() {
					return true
				}
				if ca.Prefix.Bits() < cb.Prefix.Bits() {
					return false
				}
			} else if ca.Prefix.Addr().Compare(cb.Prefix.Addr()) > 0 {
				return false
			} else if ca.Prefix.Addr().Compare(cb.Prefix.Addr()) < 0 {
				return true
			}
			continue
		}
		va, vb := ca.Raw[1:], cb.Raw[1:]
		if len(va) == len(vb) {
			if c := bytes.Compare(va, vb); c != 0 {
				return c < 0
			}
			continue
		}
		common := min(len(va), len(vb))
		if c := bytes.Compare(va[:common], vb[:common]); c != 0 {
			return c < 0
		}
		return len(va) > len(vb)
	}
	return false // EQUAL
}

// refVerdict is the reference: the first route of the packet's family, in
// the RFC's order, that matches decides (§5.1); with the terminal bit set
// (Continue) an accept goes on to the next. No route: the local rules,
// here the default (pass).
func refVerdict(routes []*Entry, p *policy.Packet) (kind ActionKind, matched *Entry, unknown bool) {
	for _, e := range routes {
		switch e.Route.Matches(p) {
		case Unknown:
			return 0, nil, true
		case Match:
			if e.Action.Continue && e.Action.Kind == Accept {
				continue
			}
			return e.Action.Kind, e, false
		}
	}
	return Accept, nil, false
}

// TestDataPlaneAgreesWithRFC runs frames through the XDP program of a
// policy made of random FlowSpec routes (10,000 by default) and through
// the reference: every verdict must agree. RAMPART_FLOWSPEC_FRAMES sets
// the frame count (default 200,000; 1,000,000 for the target).
func TestDataPlaneAgreesWithRFC(t *testing.T) {
	testutil.Privileged(t)
	nRoutes, frames := 10_000, 200_000
	if s := os.Getenv("RAMPART_FLOWSPEC_FRAMES"); s != "" {
		frames, _ = strconv.Atoi(s)
	}
	if testing.Short() {
		nRoutes, frames = 1000, 20_000
	}
	rng := rand.New(rand.NewPCG(26, 8955))
	table := NewTable()
	nb := netip.MustParseAddr("192.0.2.2")
	for table.Len(nb) < nRoutes {
		r := randomRoute(rng, rng.IntN(3) == 0)
		a := Action{Kind: []ActionKind{Drop, Drop, Accept, Accept, Drop, RatePackets}[rng.IntN(6)], Rate: 1000}
		if rng.IntN(20) == 0 {
			a.Continue = true
		}
		if a.Kind == RatePackets && a.Continue {
			a.Continue = false // unsupported: refused (Rules)
		}
		table.Announce(nb, r, Encode(r), a, nRoutes, time.Now())
	}
	pol := &policy.Policy{Lists: map[string]*policy.List{}, Default: policy.Pass, Unparsed: policy.Drop, FlowSpec: &policy.FlowSpec{Position: "auto"}}
	entries := table.Entries()
	Place(pol, entries)
	var installed []*Entry
	complex := 0
	for _, e := range entries {
		switch e.State {
		case StateUnsupported:
			// Many protocols or ranges combined: the random operators make
			// more of them than feeds do. Counted, and left out of both.
			complex++
		case StateInstalled:
			installed = append(installed, e)
		case StateNever:
			if !e.Action.Continue {
				installed = append(installed, e) // never matches: harmless in the reference
			}
		default:
			t.Fatalf("route %s: %s: %s", e.Route.String(), e.State, e.Reason)
		}
	}
	// The reference's order, by the RFC's own algorithm.
	ref := slices.Clone(installed)
	sort.SliceStable(ref, func(i, j int) bool { return rfcPrecedes(&ref[i].Route, &ref[j].Route) })
	objs, err := datapath.Load(compile.Build(pol))
	if err != nil {
		t.Fatal(err)
	}
	defer objs.Close()
	prog := objs.Program(datapath.KindXDP)
	t.Logf("%d routes became %d rules over %d distinct prefixes; %d routes too complex to install", len(installed), len(pol.Rules), len(pol.Lists), complex)
	if _, masked := pol.Usage(); len(pol.Lists) < 10*policy.MaxLists || masked.Lists() != 0 {
		t.Errorf("%d prefixes, %d taking a bit of the membership mask: want many, none", len(pol.Lists), masked.Lists())
	}
	if complex > nRoutes/10 {
		t.Errorf("%d of %d routes too complex", complex, nRoutes)
	}
	var counts [4]int // by reference verdict
	skipped := 0
	byRule := map[string]int{}
	for i, r := range pol.Rules {
		byRule[r.Name] = i
	}
	for n := 0; n < frames; {
		var f []byte
		ipv6 := rng.IntN(3) == 0
		if rng.IntN(2) == 0 { // aimed at a route
			f = frameFor(rng, &installed[rng.IntN(len(installed))].Route)
		} else {
			f = randomFrame(rng, ipv6)
		}
		p, class := policy.ParseFrame(f)
		if class != policy.ClassIP {
			continue
		}
		kind, e, unknown := refVerdict(ref, &p)
		if unknown {
			skipped++
			continue
		}
		ret, err := prog.Run(&ebpf.RunOptions{Data: f})
		if err != nil {
			t.Fatal(err)
		}
		got := abi.ActionPass
		if ret == 1 { // XDP_DROP
			got = abi.ActionDrop
		}
		ok := true
		switch kind {
		case Accept:
			ok = got == abi.ActionPass
		case Drop:
			ok = got == abi.ActionDrop
		}
		if !ok {
			name := "none"
			if e != nil {
				name = e.Name + " " + e.Route.String() + " " + e.Action.String()
			}
			t.Fatalf("frame %x (%+v): the data plane says %d, the RFC %v by route %s", f, p, got, kind, name)
		}
		counts[kind]++
		n++
	}
	t.Logf("%d frames agreed: %d passed, %d dropped, %d rate-limited by the reference; %d skipped (a field they lack decides)", frames, counts[Accept], counts[Drop], counts[RatePackets], skipped)
	if counts[Drop] < frames/10 || counts[Accept] < frames/10 {
		t.Errorf("the frames do not exercise both verdicts: %v", counts)
	}
}

// frameFor makes a frame the route may well match: its prefixes, values
// its operators name.
func frameFor(rng *rand.Rand, r *Route) []byte {
	f := packet.Frame{Proto: uint8(pick(rng, testProtos))}
	pfx := testPrefixes4
	if r.IPv6 {
		pfx = testPrefixes6
	}
	pickAddr := func(c *Component) netip.Addr {
		if c != nil && rng.IntN(4) != 0 {
			// Bits before an offset are any: the route matches the rest.
			a := c.Prefix.Addr().AsSlice()
			for k := range c.Offset {
				if rng.IntN(2) == 0 {
					a[k/8] ^= 0x80 >> (k % 8)
				}
			}
			addr, _ := netip.AddrFromSlice(a)
			return addr
		}
		return netip.MustParsePrefix(pick(rng, pfx)).Addr()
	}
	f.Dst, f.Src = pickAddr(r.Get(TypeDst)), pickAddr(r.Get(TypeSrc))
	value := func(c *Component, dflt uint64) uint64 {
		if c == nil || rng.IntN(4) == 0 {
			return dflt
		}
		o := c.Ops[rng.IntN(len(c.Ops))]
		return o.Value + uint64(rng.IntN(3)) - 1
	}
	f.Proto = uint8(value(r.Get(TypeProto), uint64(f.Proto)))
	f.Sport = uint16(value(r.Get(TypeSport), value(r.Get(TypePort), pick(rng, testPorts))))
	f.Dport = uint16(value(r.Get(TypeDport), value(r.Get(TypePort), pick(rng, testPorts))))
	flags := value(r.Get(TypeTCPFlags), uint64(rng.IntN(1<<12)))
	f.TCPFlags, f.TCPRes = uint8(flags), uint8(flags>>8)
	f.ICMPType = uint8(value(r.Get(TypeICMPType), pick(rng, testICMP)))
	f.ICMPCode = uint8(value(r.Get(TypeICMPCode), uint64(rng.IntN(4))))
	f.TOS = uint8(value(r.Get(TypeDSCP), 0)&63) << 2
	f.FlowLabel = uint32(value(r.Get(TypeFlowLabel), 0)) & policy.MaxFlowLabel
	f.DF = rng.IntN(2) == 0
	if frag := value(r.Get(TypeFragment), 0); frag&(FragIsF|FragFF) != 0 {
		f.Fragment, f.MoreFrags = true, frag&FragLF == 0
		if frag&FragIsF != 0 {
			f.FragOff = 1
		}
	}
	f.Payload = max(0, int(value(r.Get(TypeLength), pick(rng, testLengths)))-48)
	return f.Bytes()
}

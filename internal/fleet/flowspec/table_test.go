package flowspec

import (
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/osrg/gobgp/v4/pkg/packet/bgp"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/compile"
	"github.com/rampart-fw/rampart/internal/policy"
)

func routeTo(t *testing.T, dst string, port uint64) (Route, []byte) {
	t.Helper()
	r := Route{Components: []Component{{Type: TypeDst, Prefix: netip.MustParsePrefix(dst)},
		{Type: TypeProto, Ops: []Op{{Bits: opEq, Value: 17, Len: 1}}}, {Type: TypeDport, Ops: []Op{{Bits: opEq, Value: port, Len: 2}}}}}
	b := Encode(r)
	r, _, err := Decode(b, false)
	if err != nil {
		t.Fatal(err)
	}
	return r, b
}

// The table: max_routes refuses new routes (not updates of held ones), a
// lost session keeps its routes until the hold time, a route sent again
// is no longer stale, and Place marks what does not fit or repeats.
func TestTable(t *testing.T) {
	tb := NewTable()
	a, b := netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.3")
	now := time.Now()
	r1, n1 := routeTo(t, "10.0.0.1/32", 53)
	r2, n2 := routeTo(t, "10.0.0.2/32", 53)
	r3, n3 := routeTo(t, "10.0.0.3/32", 53)
	if !tb.Announce(a, r1, n1, Action{Kind: Drop}, 2, now) || !tb.Announce(a, r2, n2, Action{Kind: Drop}, 2, now) {
		t.Fatal("routes under the cap refused")
	}
	if tb.Announce(a, r3, n3, Action{Kind: Drop}, 2, now) || tb.Refused["max-routes"] != 1 {
		t.Fatalf("a third route past max_routes 2 taken (refused %v)", tb.Refused)
	}
	if !tb.Announce(a, r1, n1, Action{Kind: RatePackets, Rate: 10}, 2, now) {
		t.Fatal("an update of a held route refused at the cap")
	}
	tb.Announce(b, r1, n1, Action{Kind: Drop}, 2, now) // the same NLRI from another neighbor
	tb.SessionLost(a, 5*time.Second, now)
	if n := tb.Expire(now.Add(4 * time.Second)); n != 0 {
		t.Fatalf("%d routes expired before the hold time", n)
	}
	tb.Announce(a, r2, n2, Action{Kind: Drop}, 2, now.Add(4*time.Second)) // sent again: no longer stale
	if n := tb.Expire(now.Add(5 * time.Second)); n != 1 || tb.Len(a) != 1 {
		t.Fatalf("expired %d, %d left; want the one not sent again gone", n, tb.Len(a))
	}
	if !tb.Withdraw(a, n2) || tb.Withdraw(a, n2) {
		t.Fatal("withdraw")
	}
	tb.Announce(a, r1, n1, Action{Kind: Drop}, 2, now)
	pol := &policy.Policy{Lists: map[string]*policy.List{}, FlowSpec: &policy.FlowSpec{Position: "auto"}}
	es := tb.Entries()
	Place(pol, es)
	if len(es) != 2 || es[0].State != StateInstalled || es[1].State != StateShadowed || len(pol.Rules) != 1 {
		t.Fatalf("placed %+v, rules %+v", es, pol.Rules)
	}
	// Every bit of the membership mask taken by the policy's lists: a
	// route's prefix alone on its side takes none, and is installed.
	pol = &policy.Policy{Lists: map[string]*policy.List{}, FlowSpec: &policy.FlowSpec{Position: "auto"}}
	for i := range policy.MaxLists {
		p := netip.AddrFrom4([4]byte{198, 51, 100, byte(i)})
		pol.Lists["l"+p.String()] = policy.NewList("l"+p.String(), []netip.Prefix{netip.PrefixFrom(p, 32)})
		pol.Rules = append(pol.Rules, policy.Rule{Name: "r" + p.String(), Src: []string{"l" + p.String()}, Action: policy.Drop})
	}
	Place(pol, es)
	if es[0].State != StateInstalled {
		t.Fatalf("a route beside a policy whose lists take every bit: %s (%s)", es[0].State, es[0].Reason)
	}
	// Past the policy's entries: no room.
	pol = &policy.Policy{Lists: map[string]*policy.List{}, FlowSpec: &policy.FlowSpec{Position: "auto"}}
	ports := make([]policy.Range, 256)
	for i := range ports {
		ports[i] = policy.Range{Lo: uint32(i), Hi: uint32(i)}
	}
	tcp := policy.One(6)
	for i := 0; i < policy.MaxRules/len(ports); i++ {
		pol.Rules = append(pol.Rules, policy.Rule{Name: fmt.Sprint("r", i), Proto: &tcp, Dport: ports, Action: policy.Drop})
	}
	Place(pol, es)
	if es[0].State != StateNoRoom || len(pol.Lists) != 0 {
		t.Fatalf("a route past the policy's entries: %s, lists %v", es[0].State, pol.ListNames())
	}
}

// TestTableWaiting: routes refused at max_routes wait (as many more as
// max_routes), first come first, and are taken as withdrawals, expiry or a
// higher max_routes make room; a withdrawn or lost session's waiting route
// is forgotten.
func TestTableWaiting(t *testing.T) {
	tb := NewTable()
	a := netip.MustParseAddr("192.0.2.2")
	now := time.Now()
	var rs []Route
	var ns [][]byte
	for i := range 8 {
		r, n := routeTo(t, fmt.Sprintf("10.0.0.%d/32", i), 53)
		rs, ns = append(rs, r), append(ns, n)
	}
	held := func() []string {
		var out []string
		for _, e := range tb.Entries() {
			out = append(out, e.Route.String())
		}
		return out
	}
	for i := range 2 {
		if !tb.Announce(a, rs[i], ns[i], Action{Kind: Drop}, 2, now) {
			t.Fatalf("route %d refused under the cap", i)
		}
	}
	for i := 2; i < 5; i++ { // 2 and 3 wait; 4 finds the queue full
		if tb.Announce(a, rs[i], ns[i], Action{Kind: Drop}, 2, now) {
			t.Fatalf("route %d taken past the cap", i)
		}
	}
	if tb.Waiting(a) != 2 || tb.Refused["max-routes"] != 3 || tb.Len(a) != 2 {
		t.Fatalf("waiting %d, refused %v, held %d; want 2, 3, 2", tb.Waiting(a), tb.Refused, tb.Len(a))
	}
	if !tb.Withdraw(a, ns[0]) || tb.Len(a) != 2 || tb.Waiting(a) != 1 || !slices.Contains(held(), rs[2].String()) {
		t.Fatalf("a withdrawal did not let the first waiting route in: held %v, waiting %d", held(), tb.Waiting(a))
	}
	if tb.Withdraw(a, ns[3]) || tb.Waiting(a) != 0 { // waiting: forgotten, nothing held changes
		t.Fatalf("withdrawing a waiting route: waiting %d", tb.Waiting(a))
	}
	if !tb.Withdraw(a, ns[1]) || tb.Len(a) != 1 {
		t.Fatalf("a withdrawal with nothing waiting: held %v", held())
	}
	// A higher max_routes takes what waits.
	tb.Announce(a, rs[5], ns[5], Action{Kind: Drop}, 2, now)
	tb.Announce(a, rs[6], ns[6], Action{Kind: Drop}, 2, now)
	if tb.Len(a) != 2 || tb.Waiting(a) != 1 || !tb.Limit(a, 3) || tb.Len(a) != 3 || tb.Waiting(a) != 0 {
		t.Fatalf("a higher max_routes: held %v, waiting %d", held(), tb.Waiting(a))
	}
	// Expiry makes room; a lost session's waiting routes go.
	tb.Announce(a, rs[7], ns[7], Action{Kind: Drop}, 3, now)
	tb.SessionLost(a, time.Second, now)
	if tb.Waiting(a) != 0 {
		t.Fatalf("a lost session's route still waits")
	}
	tb.Announce(a, rs[7], ns[7], Action{Kind: Drop}, 3, now) // the session back: sent again, waits for the stale ones
	if tb.Waiting(a) != 1 || tb.Expire(now.Add(time.Second)) != 3 || tb.Len(a) != 1 || held()[0] != rs[7].String() {
		t.Fatalf("after expiry: held %v, waiting %d", held(), tb.Waiting(a))
	}
	// First come first: a route withdrawn while waiting and refused again
	// queues anew, behind the ones that came meanwhile; sent again while
	// waiting, it is not refused twice.
	tb = NewTable()
	tb.Announce(a, rs[0], ns[0], Action{Kind: Drop}, 2, now) // held
	tb.Announce(a, rs[3], ns[3], Action{Kind: Drop}, 2, now) // held
	tb.Announce(a, rs[1], ns[1], Action{Kind: Drop}, 2, now) // waits
	tb.Withdraw(a, ns[1])
	tb.Announce(a, rs[2], ns[2], Action{Kind: Drop}, 2, now) // waits
	tb.Announce(a, rs[1], ns[1], Action{Kind: Drop}, 2, now) // waits, after rs[2]
	tb.Announce(a, rs[1], ns[1], Action{Kind: RatePackets, Rate: 5}, 2, now)
	if tb.Refused["max-routes"] != 3 || tb.Waiting(a) != 2 {
		t.Errorf("refused %d, %d waiting; want 3 (a waiting route sent again is not refused again), 2", tb.Refused["max-routes"], tb.Waiting(a))
	}
	tb.Withdraw(a, ns[0])
	if h := held(); len(h) != 2 || !slices.Contains(h, rs[2].String()) {
		t.Fatalf("held %v, want the route that waited longest, %s", h, rs[2].String())
	}
	tb.Withdraw(a, ns[3])
	var last *Entry
	for _, e := range tb.Entries() {
		if e.Route.String() == rs[1].String() {
			last = e
		}
	}
	if last == nil || last.Action.Kind != RatePackets || tb.Waiting(a) != 0 {
		t.Fatalf("held %v, want %s with its last action", held(), rs[1].String())
	}
	// A lower max_routes sends the routes sent last back to wait, first in
	// line; raised again, it takes them back.
	tb = NewTable()
	for i := range 4 {
		tb.Announce(a, rs[i], ns[i], Action{Kind: Drop}, 4, now.Add(time.Duration(i)*time.Second))
	}
	tb.Announce(a, rs[4], ns[4], Action{Kind: Drop}, 4, now) // waits
	if !tb.Limit(a, 2) || tb.Len(a) != 2 || tb.Waiting(a) != 2 || !slices.Contains(held(), rs[0].String()) || !slices.Contains(held(), rs[1].String()) {
		t.Fatalf("max_routes lowered to 2: held %v, %d waiting", held(), tb.Waiting(a))
	}
	if !tb.Limit(a, 3) || tb.Len(a) != 3 || !slices.Contains(held(), rs[2].String()) || tb.Limit(a, 3) {
		t.Fatalf("max_routes raised to 3: held %v, %d waiting", held(), tb.Waiting(a))
	}
	// Churn of a waiting route keeps its queue bounded.
	for range 1000 {
		tb.Announce(a, rs[0], ns[0], Action{Kind: Drop}, 1, now)
		tb.Withdraw(a, ns[0])
	}
	if q := tb.waiting[a]; len(q.order) > 2*len(q.byKey)+65 {
		t.Errorf("%d keys queued for %d waiting routes", len(q.order), len(q.byKey))
	}
}

func TestActionOf(t *testing.T) {
	ec := func(cs ...bgp.ExtendedCommunityInterface) []bgp.PathAttributeInterface {
		return []bgp.PathAttributeInterface{bgp.NewPathAttributeExtendedCommunities(cs)}
	}
	packets := func(rate uint32) bgp.ExtendedCommunityInterface {
		v := []byte{0x0c, 0, 0, byte(rate >> 24), byte(rate >> 16), byte(rate >> 8), byte(rate)}
		return &bgp.UnknownExtended{Type: 0x80, Value: v}
	}
	for _, c := range []struct {
		attrs []bgp.PathAttributeInterface
		want  string
	}{
		{nil, "accept"},
		{ec(bgp.NewTrafficRateExtended(0, 0)), "drop"},
		{ec(bgp.NewTrafficRateExtended(0, -5)), "drop"},
		{ec(bgp.NewTrafficRateExtended(0, 1000), bgp.NewTrafficRateExtended(0, 500)), "rate-bytes 500B/s"},
		{ec(bgp.NewTrafficRateExtended(0, 1000), packets(0x447a0000)), "rate-packets 1000/s"}, // 1000.0
		{ec(bgp.NewTrafficRateExtended(0, 1000), bgp.NewTrafficRateExtended(0, 0)), "drop"},
		{ec(bgp.NewTrafficActionExtended(true, false)), "accept continue"},
	} {
		if got := actionOf(c.attrs).String(); got != c.want {
			t.Errorf("%v: %q, want %q", c.attrs, got, c.want)
		}
	}
	a := actionOf(ec(bgp.NewRedirectTwoOctetAsSpecificExtended(65000, 1), bgp.NewTrafficRemarkExtended(10)))
	if a.Kind != Accept || len(a.NotApplicable) != 2 {
		t.Errorf("redirect and remark: %+v", a)
	}
}

// FuzzDecode: whatever the bytes, Decode does not panic, what it reads
// encodes into bytes that read the same (padding, a first AND bit and a
// long length form are not kept), and Rules and Compare take it.
func FuzzDecode(f *testing.F) {
	for _, h := range []string{"0b0118c00002038106048119", "120118c000020218cb0071040389458b911f90", "090120c00002010c8005"} {
		b, _ := hex.DecodeString(h)
		f.Add(b, false)
	}
	f.Add([]byte{0x12, 1, 0x20, 0, 0x20, 1, 0x0d, 0xb8, 2, 0x68, 0x40, 0x12, 0x34, 0x56, 0x78, 0x9a, 3, 0x81, 6}, true)
	f.Fuzz(func(t *testing.T, b []byte, ipv6 bool) {
		r, rest, err := Decode(b, ipv6)
		if err != nil {
			return
		}
		read := b[:len(b)-len(rest)]
		again, left, err := Decode(Encode(r), ipv6)
		if err != nil || len(left) != 0 || again.String() != r.String() {
			t.Fatalf("%x decodes to %s, which encodes as %x: %s, %v", read, r.String(), Encode(r), again.String(), err)
		}
		Rules(&r, Action{Kind: Drop}, "f", map[string]*policy.List{})
		Compare(&r, &r)
	})
}

// A rate over a match that is an OR is one rule of alternatives: its
// entries all count, and are limited, as that one rule.
func TestRateOverAlternatives(t *testing.T) {
	r := Route{Components: []Component{{Type: TypePort, Ops: []Op{{Bits: opEq, Value: 53, Len: 1}}}}}
	r, _, _ = Decode(Encode(r), false)
	pol := &policy.Policy{Lists: map[string]*policy.List{}}
	rules, err := Rules(&r, Action{Kind: RatePackets, Rate: 1000}, "fs", pol.Lists)
	if err != nil || len(rules) != 1 || len(rules[0].Alt) != 4 || rules[0].Limit == nil {
		t.Fatalf("port =53 at 1000/s: %+v, %v", rules, err)
	}
	pol.Rules = rules
	img := compile.Build(pol)
	if len(img.Rules) != 4 || len(img.Limits) != 1 {
		t.Fatalf("%d entries, %d limits; want 4 entries of one limited rule", len(img.Rules), len(img.Limits))
	}
	for _, e := range img.Rules {
		if e.Rule != 0 || e.Action != abi.ActionLimit {
			t.Fatalf("entry %+v is not rule 0's limit", e)
		}
	}
}

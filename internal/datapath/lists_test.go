package datapath_test

import (
	"math/bits"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/compile"
	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/packet"
	"github.com/rampart-fw/rampart/internal/policy"
	"github.com/rampart-fw/rampart/internal/testutil"
)

// bigPrefix draws a prefix of either family inside 10.0.0.0/8 or a /44, so
// that lists overlap and nest, or, three IPv6 draws in sixteen, a /128 or a /64
// in one of 2a00::/12's /24s, most of which it then holds alone.
func bigPrefix(rng *rand.Rand, v6 bool) netip.Prefix {
	if !v6 {
		a := policy.UintToV4(0x0a000000 | rng.Uint32()&0x00ffffff)
		bits := []int{20, 24, 24, 24, 25, 26, 28, 30, 31, 32, 32, 32, 32, 32, 32}[rng.IntN(15)]
		switch rng.IntN(20000) {
		case 0:
			bits = 12
		case 1, 2, 3, 4, 5, 6, 7, 8, 9, 10:
			bits = 16
		}
		return netip.PrefixFrom(a, bits).Masked()
	}
	var b [16]byte
	if lone := rng.IntN(16); lone < 3 {
		// A /24 of 2a00::/12 that holds a length or two alone: the
		// data plane decides most such blocks without a walk.
		b[0], b[1], b[2] = 0x2a, byte(rng.IntN(16)), byte(rng.IntN(256))
		for i := 3; i < 16; i++ {
			b[i] = byte(rng.IntN(4))
		}
		return netip.PrefixFrom(netip.AddrFrom16(b), []int{128, 128, 64}[lone]).Masked()
	}
	b[0], b[1], b[2], b[3], b[4], b[5] = 0x20, 0x01, 0x0d+byte(rng.IntN(3)), 0xb8, byte(rng.IntN(16)), byte(rng.IntN(256))
	for i := 6; i < 16; i++ {
		b[i] = byte(rng.IntN(4)) // few distinct values: prefixes collide and nest
	}
	bits := []int{44, 48, 56, 64, 96, 120, 127, 128, 128, 128}[rng.IntN(10)]
	if rng.IntN(2000) == 0 {
		bits = []int{19, 24, 29, 32, 36, 40}[rng.IntN(6)] // rare prefixes that span blocks or hold many others
	}
	return netip.PrefixFrom(netip.AddrFrom16(b), bits).Masked()
}

// addrNear picks an address inside, at the edge of, or just outside p.
func addrNear(rng *rand.Rand, p netip.Prefix) netip.Addr {
	switch rng.IntN(4) {
	case 0:
		return p.Addr()
	case 1:
		return p.Addr().Prev()
	}
	last := p.Addr()
	if p.Addr().Is4() {
		last = policy.UintToV4(policy.PrefixRange4(p).Hi)
	} else {
		b := p.Addr().As16()
		for i := p.Bits(); i < 128; i++ {
			b[i/8] |= 0x80 >> (i % 8)
		}
		last = netip.AddrFrom16(b)
	}
	if rng.IntN(2) == 0 {
		return last
	}
	if n := last.Next(); n.IsValid() {
		return n
	}
	return last
}

type bigLists struct {
	pol      *policy.Policy
	prefixes []netip.Prefix // every prefix of every list, to aim frames at
}

// newBigLists builds a policy over three big lists: deny, allow (prefixes
// nested inside deny, matched first) and a destination list; first, a rule
// on both sides that names them the other way round, so that a class's
// first entry differs by side and the data plane must not confuse them.
func newBigLists(rng *rand.Rand, n int) *bigLists {
	var deny, allow, dst []netip.Prefix
	for i := 0; i < n; i++ {
		p := bigPrefix(rng, i%4 == 3)
		deny = append(deny, p)
		if rng.IntN(4) == 0 && p.Bits() < p.Addr().BitLen() {
			sub, _ := addrNear(rng, p).Prefix(min(p.Addr().BitLen(), p.Bits()+1+rng.IntN(8)))
			allow = append(allow, sub)
		}
		if rng.IntN(8) == 0 {
			dst = append(dst, bigPrefix(rng, i%2 == 0))
		}
	}
	udp := policy.One(17)
	pol := &policy.Policy{
		Lists: map[string]*policy.List{"deny": policy.NewList("deny", deny), "allow": policy.NewList("allow", allow), "dst": policy.NewList("dst", dst)},
		Rules: []policy.Rule{
			{Name: "crossed", Src: []string{"dst"}, Dst: []string{"allow"}, Action: policy.Pass},
			{Name: "allow", Src: []string{"allow"}, Action: policy.Pass},
			{Name: "deny", Src: []string{"deny"}, Action: policy.Drop},
			{Name: "dst", Dst: []string{"dst"}, Proto: &udp, Action: policy.Drop},
		},
		Default: policy.Pass,
	}
	all := append(append(append([]netip.Prefix{}, deny...), allow...), dst...)
	return &bigLists{pol, all}
}

func (b *bigLists) frame(rng *rand.Rand) []byte {
	pick := func(v6 bool) netip.Addr {
		for {
			if rng.IntN(5) == 0 {
				return bigPrefix(rng, v6).Addr()
			}
			if p := b.prefixes[rng.IntN(len(b.prefixes))]; p.Addr().Is6() == v6 {
				return addrNear(rng, p)
			}
		}
	}
	v6 := rng.IntN(2) == 0
	src, dst := pick(v6), pick(v6)
	if src.Is4() != dst.Is4() {
		return nil
	}
	return packet.Frame{Src: src, Dst: dst, Proto: 17, Sport: 1, Dport: 2}.Bytes()
}

// check runs frames through prog and policy.Eval; every action must agree.
func (b *bigLists) check(t *testing.T, rng *rand.Rand, prog *ebpf.Program, frames int, what string) {
	t.Helper()
	for i := 0; i < frames; {
		f := b.frame(rng)
		if f == nil {
			continue
		}
		ret, err := prog.Run(&ebpf.RunOptions{Data: f})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := actionOf(prog.Type(), ret), b.pol.Eval(f); got != uint8(want.Action) {
			t.Fatalf("%s: disagreement on frame %x: data plane %d, reference %+v", what, f, got, want)
		}
		i++
	}
}

// TestBigListsDifferential loads big random lists of both families with
// mixed lengths and nested allow/deny, then changes them in place and lets
// changes expire, checking every frame against policy.Eval.
// RAMPART_BIGLIST_PREFIXES sets the list size (default 300,000). The
// tables are written 64 KiB at a time: big lists' tables take many of
// writeArray's windows.
func TestBigListsDifferential(t *testing.T) {
	testutil.Privileged(t)
	defer datapath.SmallWriteWindow()()
	n := 300_000
	if s := os.Getenv("RAMPART_BIGLIST_PREFIXES"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	rng := rand.New(rand.NewPCG(11, 12))
	b := newBigLists(rng, n)
	img := compile.Build(b.pol)
	inline, pairs := 0, 0
	for _, b := range img.V4Blocks {
		for _, s := range b.Slot {
			if s.Key != 0 && s.Entry>>abi.V4ETypeShift == abi.V4EInline {
				inline++
			}
			if s.Key != 0 && s.Entry>>abi.V4ETypeShift == abi.V4EPairs {
				pairs++
			}
		}
	}
	if inline == 0 || pairs == 0 || img.V4DenseBlocks() == 0 || len(img.V4Tbl8s) == 0 || len(img.V6Short) == 0 || len(img.V6Long) == 0 {
		t.Fatalf("the lists do not exercise every table: %d inline entries, %d of pairs, %d bitmaps, %d tbl8s, IPv6 tables of %d and %d slots",
			inline, pairs, img.V4DenseBlocks(), len(img.V4Tbl8s), len(img.V6Short), len(img.V6Long))
	}
	// IPv6 blocks the data plane decides inline (the hot length alone)
	// and those it walks (another length alone, or several).
	hotAlone, otherAlone, several := 0, 0, 0
	for _, bucket := range img.V6Blocks {
		for _, n := range bucket.Slot {
			switch lens := bits.OnesCount64(n.ShortLens) + bits.OnesCount64(n.LongLens); {
			case n.Key == 0 || lens == 0:
			case lens > 1:
				several++
			case img.V6HotLen > 64 && n.LongLens == 1<<(img.V6HotLen-abi.V6LongMin), img.V6HotLen <= 64 && n.ShortLens == 1<<(img.V6HotLen-abi.V6ShortMin):
				hotAlone++
			default:
				otherAlone++
			}
		}
	}
	if hotAlone == 0 || otherAlone == 0 || several == 0 {
		t.Fatalf("the IPv6 blocks do not exercise every path: %d of the hot length (/%d) alone, %d of another alone, %d of several", hotAlone, img.V6HotLen, otherAlone, several)
	}
	t.Logf("%d inline entries, %d of pairs, %d bitmaps, %d tbl8s; IPv6 blocks: %d of the hot length (/%d) alone, %d of another alone, %d of several",
		inline, pairs, img.V4DenseBlocks(), len(img.V4Tbl8s), hotAlone, img.V6HotLen, otherAlone, several)
	objs, err := datapath.Load(img)
	if err != nil {
		t.Fatal(err)
	}
	defer objs.Close()
	b.check(t, rng, objs.RampartXdp, 200_000, "loaded")
	b.check(t, rng, objs.RampartTc, 50_000, "loaded (tc)")

	// In-place changes: adds and deletes on every list, some covering
	// others, in an order that matters.
	var ops []policy.ListOp
	for i := 0; i < 3000; i++ {
		list := []string{"deny", "allow", "dst"}[rng.IntN(3)]
		p := b.prefixes[rng.IntN(len(b.prefixes))]
		if rng.IntN(3) == 0 {
			p = bigPrefix(rng, rng.IntN(2) == 0)
		}
		if rng.IntN(4) == 0 && p.Bits() > 8 {
			p, _ = p.Addr().Prefix(p.Bits() - 1 - rng.IntN(8))
		}
		ops = append(ops, policy.ListOp{List: list, Prefix: p, Add: rng.IntN(2) == 0})
	}
	setOps := func(ops []policy.ListOp) {
		for _, l := range b.pol.Lists {
			l.Ops = nil
		}
		for _, op := range ops {
			l := b.pol.Lists[op.List]
			l.Ops = append(l.Ops, op)
		}
		v4, v6 := compile.Overlay(img.Lists, ops)
		if err := objs.ReplaceOverlay(v4, v6); err != nil {
			t.Fatal(err)
		}
	}
	setOps(ops)
	b.check(t, rng, objs.RampartXdp, 200_000, "after adds and deletes")

	// Expiry: half of the changes go, the rest stay.
	var live []policy.ListOp
	for i, op := range ops {
		if i%2 == 0 {
			live = append(live, op)
		}
	}
	setOps(live)
	b.check(t, rng, objs.RampartXdp, 200_000, "after half the changes expired")
	setOps(nil)
	b.check(t, rng, objs.RampartXdp, 100_000, "after every change expired")
}

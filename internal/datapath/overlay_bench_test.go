package datapath_test

import (
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/rampart-fw/rampart/internal/compile"
	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/packet"
	"github.com/rampart-fw/rampart/internal/policy"
)

// BenchmarkLiveEntries compares, per packet, 100,000 listed addresses
// compiled from a file with the same addresses added live (the overlay),
// and added live then folded into the tables (as the daemon folds them),
// for a listed source and an unlisted one:
//
//	go test -run '^$' -bench LiveEntries ./internal/datapath/
func BenchmarkLiveEntries(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	var addrs []string
	var ops []policy.ListOp
	for range 100_000 {
		a := netip.AddrFrom4([4]byte{10, byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256))})
		addrs = append(addrs, a.String())
		ops = append(ops, policy.ListOp{List: "ban", Prefix: netip.PrefixFrom(a, 32), Add: true})
	}
	list := func(prefixes string) *datapath.Objects {
		return load(b, datapath.KindXDP, "lists:\n  ban: {prefixes: ["+prefixes+"]}\nrules:\n  - {name: r, src: ban, action: drop}\n").objs
	}
	compiled, live := list(strings.Join(addrs, ", ")), list("192.0.2.1")
	v4, v6 := compile.Overlay(map[string]uint64{"ban": 1}, ops)
	if err := live.ReplaceOverlay(v4, v6); err != nil {
		b.Fatal(err)
	}
	pol, err := policy.Parse("test.yaml", []byte("lists:\n  ban: {prefixes: [192.0.2.1]}\nrules:\n  - {name: r, src: ban, action: drop}\n"))
	if err != nil {
		b.Fatal(err)
	}
	pol.Lists["ban"] = pol.Lists["ban"].Fold(ops)
	folded, err := datapath.Load(compile.Build(pol))
	if err != nil {
		b.Fatal(err)
	}
	defer folded.Close()
	frame := func(src string) []byte {
		return packet.Frame{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr("192.0.2.2"), Proto: 17, Sport: 1, Dport: 2, Payload: 18}.Bytes()
	}
	for _, c := range []struct {
		name string
		objs *datapath.Objects
		src  string
	}{{"compiled/listed", compiled, addrs[500]}, {"live/listed", live, addrs[500]}, {"folded/listed", folded, addrs[500]},
		{"compiled/unlisted", compiled, "11.0.0.1"}, {"live/unlisted", live, "11.0.0.1"}, {"folded/unlisted", folded, "11.0.0.1"}} {
		b.Run(c.name, func(b *testing.B) {
			_, d, err := c.objs.Program(datapath.KindXDP).Benchmark(frame(c.src), b.N, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(d.Nanoseconds()), "ns/pkt")
		})
	}
}

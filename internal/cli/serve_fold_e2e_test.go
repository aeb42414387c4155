package cli_test

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/rampart-fw/rampart/internal/engine"
	"github.com/rampart-fw/rampart/internal/packet"
	"github.com/rampart-fw/rampart/internal/serve"
	"github.com/rampart-fw/rampart/internal/testutil"
)

// TestServeFoldsBans: 100,000 bans through the API are folded into the
// tables by the service in the background, and judged as before: real
// datagrams from a banned A are dropped, and the program drops a sample of
// the other bans; an unban after the fold passes A at once, through the
// overlay; a revert of folded bans owes a fold, which the service makes,
// after which the reverted addresses pass.
func TestServeFoldsBans(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "block.txt"), []byte("192.0.2.0/24\n"), 0o644)
	pol := filepath.Join(dir, "policy.yaml")
	os.WriteFile(pol, []byte("lists:\n  block: {files: [block.txt]}\nrules:\n  - {name: block, src: block, proto: udp, action: drop}\ndefault: pass\n"), 0o644)
	_, api, log := startServe(t, "--netns", p.NsB, "-f", pol, "--iface", p.IfB, "--persist", filepath.Join(dir, "var"))
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })
	fw, err := engine.New(engine.Options{PinRoot: os.Getenv("RAMPART_PIN_ROOT"), StateRoot: os.Getenv("RAMPART_STATE_ROOT"), Netns: p.NsB})
	if err != nil {
		t.Fatal(err)
	}
	hook := engine.Hook{Iface: p.IfB}

	rx := testutil.UDPListener(t, p.NsB, p.B4, 9310)
	arrive := func() int {
		testutil.SendUDP(t, p.NsA, p.B4, 9310, 20)
		return testutil.CountUDP(rx, 200*time.Millisecond)
	}
	folded := func() int {
		var st struct{ Hooks []engine.HookStatus }
		if err := api.Do("GET", "/v1/status", nil, &st); err != nil || len(st.Hooks) != 1 {
			t.Fatalf("status: %+v, %v", st, err)
		}
		return st.Hooks[0].FoldedChanges
	}
	eventually := func(what string, ok func() bool) {
		t.Helper()
		for end := time.Now().Add(20 * time.Second); !ok(); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%s: not within 20 s\n%s", what, log.String())
			}
		}
	}
	// Judged by the program the kernel runs, for sources no datagram of
	// this test can come from.
	drops := func(addrs []netip.Addr) (n int) {
		t.Helper()
		prog, err := fw.Program(hook)
		if err != nil {
			t.Fatal(err)
		}
		defer prog.Close()
		for _, a := range addrs {
			ret, err := prog.Run(&ebpf.RunOptions{Data: packet.Frame{Src: a, Dst: netip.MustParseAddr("10.255.0.1"), Proto: 17, Sport: 1, Dport: 2}.Bytes()})
			if err != nil {
				t.Fatal(err)
			}
			if ret == 1 { // XDP_DROP
				n++
			}
		}
		return n
	}
	eventually("before any ban, A's datagrams arrive", func() bool { return arrive() == 20 })

	rng := rand.New(rand.NewPCG(9, 10))
	seen := map[netip.Addr]bool{}
	var bans []netip.Addr
	for len(bans) < 100_000 {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], 0x64400000|rng.Uint32()&0x3fffff) // 100.64.0.0/10
		if a := netip.AddrFrom4(b); !seen[a] {
			seen[a] = true
			bans = append(bans, a)
		}
	}
	prefixes := []string{netip.MustParseAddr(p.A4.String()).String()}
	for _, a := range bans {
		prefixes = append(prefixes, a.String())
	}
	start := time.Now()
	if err := api.Do("POST", "/v1/ban", serve.BanRequest{List: "block", Prefixes: prefixes}, &struct{}{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("100,001 bans in one call: %v", time.Since(start).Round(time.Millisecond))
	if n := arrive(); n != 0 {
		t.Errorf("A banned: %d of 20 arrived", n)
	}
	eventually("the bans folded into the tables", func() bool { return folded() == len(prefixes) })
	t.Logf("folded %v after the call", time.Since(start).Round(time.Millisecond))
	sample := bans[:2000]
	if n := drops(sample); n != len(sample) {
		t.Fatalf("after the fold the program drops %d of %d banned sources", n, len(sample))
	}
	if n := arrive(); n != 0 {
		t.Errorf("A banned, folded: %d of 20 arrived", n)
	}

	// An unban is a change of its own, in the overlay at once.
	if err := api.Do("POST", "/v1/unban", serve.BanRequest{List: "block", Prefixes: prefixes[:1]}, &struct{}{}); err != nil {
		t.Fatal(err)
	}
	if n := arrive(); n != 20 {
		t.Errorf("A unbanned after the fold: %d of 20 arrived", n)
	}
	// A revert of folded bans: the tables hold them until the fold it
	// owes, which the service makes.
	reverted := sample[:500]
	var rp []string
	for _, a := range reverted {
		rp = append(rp, a.String())
	}
	if err := api.Do("POST", "/v1/revert", serve.BanRequest{List: "block", Prefixes: rp}, &struct{}{}); err != nil {
		t.Fatal(err)
	}
	eventually("the reverted bans pass", func() bool { return drops(reverted) == 0 })
	if n := drops(sample[500:]); n != len(sample)-500 {
		t.Fatalf("after the revert the program drops %d of the %d bans kept", n, len(sample)-500)
	}
	if n := arrive(); n != 20 {
		t.Errorf("A unbanned after the second fold: %d of 20 arrived", n)
	}
	if got, want := folded(), len(prefixes)-500+1; got != want {
		t.Errorf("%d changes folded after the revert, want %d (the bans kept and A's unban)", got, want)
	}
	t.Log(fmt.Sprint(log.String()[max(0, len(log.String())-600):]))
}

package cli_test

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/engine"
	"github.com/rampart-fw/rampart/internal/packet"
	"github.com/rampart-fw/rampart/internal/policy"
	"github.com/rampart-fw/rampart/internal/testutil"
)

// writeBigList writes n random host addresses outside 10/8, then extra.
func writeBigList(t *testing.T, name string, seed uint64, n int, extra []netip.Addr) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	rng := rand.New(rand.NewPCG(seed, seed))
	for i := 0; i < n; i++ {
		a := rng.Uint32()
		if a>>24 == 10 {
			a ^= 0x80000000
		}
		fmt.Fprintln(w, policy.UintToV4(a))
	}
	for _, a := range extra {
		fmt.Fprintln(w, a)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return path
}

// TestSwapHammer runs frames through whatever program the hook's link runs,
// in a tight loop, while policies with million-entry lists are swapped in
// and out. Policy A drops the probe addresses (they are in its list);
// policy B passes them (in its list) and drops everything else. Every
// generation seen must answer all probes alike: a list seen half loaded
// would pass some probes and drop others. (Policies of one shape are
// generations of one program: a round of probes that a swap straddles, the
// program's live generation not the same before and after it, may see
// both.)
func TestSwapHammer(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	var probes []netip.Addr
	for i := 0; i < 32; i++ {
		probes = append(probes, netip.AddrFrom4([4]byte{10, byte(i), byte(i * 7), byte(i*13 + 1)}))
	}
	// Probes at the end of B's file: they are the last lines read.
	la := writeBigList(t, "a.txt", 1, 1_000_000, probes)
	lb := writeBigList(t, "b.txt", 2, 1_000_000, probes)
	polA := writeFile(t, "a.yaml", fmt.Sprintf("lists:\n  big: {files: [%s]}\nrules:\n  - {name: a, src: big, action: drop}\ndefault: pass\n", la))
	polB := writeFile(t, "b.yaml", fmt.Sprintf("lists:\n  big: {files: [%s]}\nrules:\n  - {name: b, src: big, action: pass}\ndefault: drop\n", lb))
	fw, err := engine.New(engine.Options{PinRoot: os.Getenv("RAMPART_PIN_ROOT"), StateRoot: os.Getenv("RAMPART_STATE_ROOT"), Netns: p.NsB})
	if err != nil {
		t.Fatal(err)
	}
	hook := engine.Hook{Iface: p.IfB}
	mustRampart(t, "apply", "-f", polA, "--netns", p.NsB, "--iface", p.IfB, "--mode", "xdp-native")
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })

	var frames [][]byte
	for _, a := range probes {
		frames = append(frames, packet.Frame{Src: a, Dst: netip.MustParseAddr("10.255.0.1"), Proto: 17, Sport: 1, Dport: 2}.Bytes())
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var rounds, drops, passes, straddled int
	var failure string
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			prog, err := fw.Program(hook)
			if err != nil {
				failure = fmt.Sprintf("open the hook's program: %v", err)
				return
			}
			before := generationOf(prog)
			var verdicts []uint32
			for _, f := range frames {
				ret, err := prog.Run(&ebpf.RunOptions{Data: f})
				if err != nil {
					failure = err.Error()
					prog.Close()
					return
				}
				verdicts = append(verdicts, ret)
			}
			after := generationOf(prog)
			prog.Close()
			if before == 0 || after != before {
				straddled++
				continue
			}
			for _, v := range verdicts {
				if v != verdicts[0] {
					failure = fmt.Sprintf("one generation answered the probes %v: a list half loaded", verdicts)
					return
				}
			}
			rounds++
			if verdicts[0] == 1 {
				drops++
			} else {
				passes++
			}
		}
	}()
	for i := 0; i < 6; i++ {
		pol := polB
		if i%2 == 1 {
			pol = polA
		}
		mustRampart(t, "apply", "-f", pol, "--netns", p.NsB, "--iface", p.IfB, "--mode", "xdp-native")
	}
	stop.Store(true)
	wg.Wait()
	if failure != "" {
		t.Fatal(failure)
	}
	if drops == 0 || passes == 0 {
		t.Fatalf("the hammer saw %d rounds: %d with A's verdict, %d with B's; want both", rounds, drops, passes)
	}
	t.Logf("%d rounds of %d probes across 6 swaps of 1M-entry lists: %d under A, %d under B (%d more straddled a swap)", rounds, len(probes), drops, passes, straddled)
}

// generationOf names the generation prog reads now, read from the kernel
// without the engine's lock (which a swap holds): the ID of the settings
// map in the slot its live map names; 0 when it cannot be read.
func generationOf(prog *ebpf.Program) ebpf.MapID {
	info, err := prog.Info()
	if err != nil {
		return 0
	}
	ids, _ := info.MapIDs()
	byName := map[string]*ebpf.Map{}
	for _, id := range ids {
		if m, err := ebpf.NewMapFromID(id); err == nil {
			defer m.Close()
			if mi, err := m.Info(); err == nil {
				byName[mi.Name] = m
			}
		}
	}
	var live abi.Live
	var settings ebpf.MapID
	if byName["live"] == nil || byName["configs"] == nil || byName["live"].Lookup(uint32(0), &live) != nil ||
		byName["configs"].Lookup(live.Gen&1, &settings) != nil {
		return 0
	}
	return settings
}

// TestListInPlace changes a live list with list add/del and lets a change
// with a TTL expire by itself, with real packets through the hook.
func TestListInPlace(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	list := writeFile(t, "block.txt", "192.0.2.0/24\n2001:db8:ffff::/48\n")
	pol := writeFile(t, "p.yaml", fmt.Sprintf("lists:\n  block: {files: [%s]}\nrules:\n  - {name: block, src: block, proto: udp, action: drop}\ndefault: pass\n", list))
	ns := []string{"--netns", p.NsB}
	mustRampart(t, append([]string{"apply", "-f", pol, "--iface", p.IfB}, ns...)...)
	t.Cleanup(func() { rampart(t, append([]string{"detach", "--iface", p.IfB}, ns...)...) })
	rx4 := testutil.UDPListener(t, p.NsB, p.B4, 9100)
	rx6 := testutil.UDPListener(t, p.NsB, p.B6, 9100)
	arrive := func() (int, int) {
		testutil.SendUDP(t, p.NsA, p.B4, 9100, 50)
		testutil.SendUDP(t, p.NsA, p.B6, 9100, 50)
		return testutil.CountUDP(rx4, 300*time.Millisecond), testutil.CountUDP(rx6, 300*time.Millisecond)
	}
	if v4, v6 := arrive(); v4 != 50 || v6 != 50 {
		t.Fatalf("before any change: %d and %d of 50 arrived", v4, v6)
	}

	if _, err := rampart(t, append([]string{"list", "add", "nolist", p.A4.String()}, ns...)...); err == nil || !strings.Contains(err.Error(), `list "nolist" is not used by any applied policy`) {
		t.Errorf("add to an unknown list: %v", err)
	}
	if _, err := rampart(t, append([]string{"list", "add", "block", "192.0.2.0/33"}, ns...)...); err == nil || !strings.Contains(err.Error(), "bad prefix") {
		t.Errorf("add of a bad prefix: %v", err)
	}

	mustRampart(t, append([]string{"list", "add", "block", p.A4.String(), p.A6.String(), "--ttl", "4s"}, ns...)...)
	added := time.Now()
	if v4, v6 := arrive(); v4 != 0 || v6 != 0 {
		t.Fatalf("after list add: %d and %d of 50 arrived, want none", v4, v6)
	}
	var show struct {
		Changes []struct {
			List, Prefix string
			Add          bool
		}
	}
	jsonOf(t, &show, append([]string{"list", "show"}, ns...)...)
	if len(show.Changes) != 2 || show.Changes[0].List != "block" || !show.Changes[0].Add {
		t.Errorf("list show: %+v", show)
	}

	mustRampart(t, append([]string{"list", "del", "block", p.A4.String()}, ns...)...)
	if v4, v6 := arrive(); v4 != 50 || v6 != 0 {
		t.Fatalf("after list del of the IPv4 address: %d and %d of 50 arrived, want 50 and 0", v4, v6)
	}

	// No rampart command runs from here: the expiry process alone must
	// undo the IPv6 add.
	for time.Since(added) < 12*time.Second {
		if _, v6 := arrive(); v6 == 50 {
			if time.Since(added) < 4*time.Second {
				t.Fatalf("the change expired after %v, before its 4s TTL", time.Since(added))
			}
			t.Logf("expired %v after the add", time.Since(added).Round(100*time.Millisecond))
			// A delete with no TTL stays; the added entry is gone.
			jsonOf(t, &show, append([]string{"list", "show"}, ns...)...)
			if len(show.Changes) != 1 || show.Changes[0].Add {
				t.Errorf("list show after expiry: %+v", show)
			}
			return
		}
	}
	t.Fatal("the IPv6 add never expired")
}

// TestListSurvivesReapply checks that a live change outlasts a re-apply.
func TestListSurvivesReapply(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	pol := writeFile(t, "p.yaml", "lists:\n  block: {prefixes: [192.0.2.0/24]}\nrules:\n  - {name: block, src: block, proto: udp, action: drop}\ndefault: pass\n")
	ns := []string{"--netns", p.NsB}
	mustRampart(t, append([]string{"apply", "-f", pol, "--iface", p.IfB}, ns...)...)
	t.Cleanup(func() { rampart(t, append([]string{"detach", "--iface", p.IfB}, ns...)...) })
	rx := testutil.UDPListener(t, p.NsB, p.B4, 9200)
	mustRampart(t, append([]string{"list", "add", "block", p.A4.String()}, ns...)...)
	mustRampart(t, append([]string{"apply", "-f", pol, "--iface", p.IfB}, ns...)...)
	testutil.SendUDP(t, p.NsA, p.B4, 9200, 50)
	if got := testutil.CountUDP(rx, 300*time.Millisecond); got != 0 {
		t.Fatalf("after a re-apply %d of 50 arrived: the live add was lost", got)
	}
	if got := ruleCount(t, "block"); got != 50 {
		t.Errorf("rule block counted %d, want 50", got)
	}
}

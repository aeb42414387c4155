package cli_test

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/netns"
	"github.com/rampart-fw/rampart/internal/packet"
	"github.com/rampart-fw/rampart/internal/testutil"
)

const limitPolicy = `rules:
  - {name: per-rule, proto: udp, dport: 7001, action: limit, rate: 20000/s, burst: 2000}
  - {name: per-source, proto: udp, dport: 7002, action: limit, rate: 200/s, burst: 20, per: source}
  - {name: per-64, family: 6, proto: udp, dport: 7003, action: limit, rate: 200/s, burst: 20, per: source/64}
  - {name: fair-share, proto: udp, dport: [7004, 7005], action: limit, rate: 100/s, burst: 20, per: source}
  - {name: fast, proto: udp, dport: 7006, action: limit, rate: 50000/s, burst: 5}
default: pass
`

// sources draws a flood's source addresses: entropy distinct IPv4
// addresses (0 for any of 2^32), or with v6 random /64s of fd77::/16 with
// random interface identifiers.
type sources struct {
	v6      bool
	entropy uint32
	pool    []netip.Addr
}

func (s sources) pick(rng *rand.Rand) netip.Addr {
	if s.pool != nil {
		return s.pool[rng.IntN(len(s.pool))]
	}
	if s.v6 {
		var a [16]byte
		binary.BigEndian.PutUint64(a[:8], 0xfd77<<48|rng.Uint64()>>16)
		binary.BigEndian.PutUint64(a[8:], rng.Uint64())
		return netip.AddrFrom16(a)
	}
	v := rng.Uint32()
	if s.entropy != 0 {
		v = 0x0a500000 + v%s.entropy // 10.80.0.0 and on
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// blast sends UDP frames to port from A on every CPU (so that B's XDP runs
// on every CPU: a veth runs its peer's receive path on the sending CPU)
// for d, and returns how long the senders ran.
func blast(t *testing.T, p *testutil.Pair, src sources, port uint16, d time.Duration) time.Duration {
	t.Helper()
	dst4, _ := netip.AddrFromSlice(p.B4.To4())
	dst6, _ := netip.AddrFromSlice(p.B6)
	dst := dst4
	if src.v6 {
		dst = dst6
	}
	srcMAC, dstMAC := macOf(p.NsA, p.IfA), macOf(p.NsB, p.IfB)
	var wg sync.WaitGroup
	var first, last atomic.Int64
	first.Store(1 << 62)
	for cpu := 0; cpu < runtime.NumCPU(); cpu++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := netns.Run(p.NsA, func() error {
				var set unix.CPUSet
				set.Set(cpu)
				if err := unix.SchedSetaffinity(0, &set); err != nil {
					return err
				}
				fd, ifindex, err := packetSocket(p.IfA)
				if err != nil {
					return err
				}
				defer unix.Close(fd)
				sa := &unix.SockaddrLinklayer{Ifindex: ifindex}
				rng := rand.New(rand.NewPCG(uint64(cpu), uint64(time.Now().UnixNano())))
				// One frame, its source rewritten in place: the checksums go
				// stale, which XDP does not read, and the sender keeps up a
				// flood without allocating.
				frame := packet.Frame{SrcMAC: srcMAC, DstMAC: dstMAC, Src: src.pick(rng), Dst: dst, Proto: 17, Sport: 4000, Dport: port}.Bytes()
				at := 14 + 12
				if src.v6 {
					at = 14 + 8
				}
				start := time.Now()
				for n := 0; n&1023 != 0 || time.Since(start) < d; n++ {
					a := src.pick(rng).AsSlice()
					copy(frame[at:], a)
					// The veth's queue full (ENOBUFS) is a flood's packet lost
					// before the receiver, as on a wire.
					if err := unix.Sendto(fd, frame, 0, sa); err != nil && err != unix.ENOBUFS {
						return err
					}
				}
				stop := time.Now()
				for v := first.Load(); start.UnixNano() < v && !first.CompareAndSwap(v, start.UnixNano()); v = first.Load() {
				}
				for v := last.Load(); stop.UnixNano() > v && !last.CompareAndSwap(v, stop.UnixNano()); v = last.Load() {
				}
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	return time.Duration(last.Load() - first.Load())
}

// TestLimitRates: the rate a limit rule admits under a flood sent from
// every CPU is its configured rate within 5%, per rule as source entropy
// goes from one address to 2^32 and to random IPv6 /64s, and per source
// for each of many sources.
func TestLimitRates(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	mustRampart(t, "apply", "-f", writeFile(t, "p.yaml", limitPolicy), "--netns", p.NsB, "--iface", p.IfB, "--mode", "xdp-native")
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })

	cases := []struct {
		name    string
		rule    string
		port    uint16
		src     sources
		rate    float64 // admitted per second, burst aside
		burst   float64
		sources int // sources with a schedule of their own
	}{
		{"one source", "per-rule", 7001, sources{entropy: 1}, 20000, 2000, 1},
		{"256 sources", "per-rule", 7001, sources{entropy: 256}, 20000, 2000, 1},
		{"65536 sources", "per-rule", 7001, sources{entropy: 65536}, 20000, 2000, 1},
		{"2^32 sources", "per-rule", 7001, sources{}, 20000, 2000, 1},
		{"random /64s", "per-rule", 7001, sources{v6: true}, 20000, 2000, 1},
		{"per source, one", "per-source", 7002, sources{entropy: 1}, 200, 20, 1},
		{"per source, 100", "per-source", 7002, sources{entropy: 100}, 200, 20, 100},
		{"per /64, 100", "per-64", 7003, v6Pool(100), 200, 20, 100},
		// The coarse clock steps by up to 10 ms, so a schedule's burst is at
		// least the rate's 10 ms (500 here, not 5); the rate still holds.
		{"fast, small burst", "fast", 7006, sources{entropy: 1}, 50000, 500, 1},
	}
	for _, c := range cases {
		// The last case left its schedule a burst in debt: wait until it
		// has paid, so that this one starts with the full burst.
		time.Sleep(time.Duration(c.burst/c.rate*float64(time.Second)) + 50*time.Millisecond)
		before := floodStats(t, p.NsB, c.rule)
		d := blast(t, p, c.src, c.port, 500*time.Millisecond)
		after := floodStats(t, p.NsB, c.rule)
		// A limit rule's packets are those it admitted; over, those it dropped.
		admitted := float64(after.Packets - before.Packets)
		offered := after.Packets + after.Over - before.Packets - before.Over
		// Each schedule starts with its burst and then admits rate per
		// second; sources with a schedule of their own add theirs.
		want := float64(c.sources) * (c.burst + c.rate*d.Seconds())
		ratio := admitted / want
		t.Logf("%s: %d offered in %v, %.0f admitted, %.0f configured (%.3f×)", c.name, offered, d, admitted, want, ratio)
		if offered < uint64(3*want) {
			t.Errorf("%s: only %d packets offered for %.0f admitted: not a flood", c.name, offered, want)
		}
		if ratio < 0.95 || ratio > 1.05 {
			t.Errorf("%s: admitted %.0f, want %.0f ±5%%", c.name, admitted, want)
		}
	}
}

// v6Pool is n random /64s, each source with a random interface identifier.
func v6Pool(n int) sources {
	rng := rand.New(rand.NewPCG(7, 7))
	any6 := sources{v6: true}
	s := sources{v6: true}
	for range n {
		s.pool = append(s.pool, any6.pick(rng))
	}
	return s
}

// TestLimitKeepsSourcesUnderAFlood: 1,000 sources within their per-source
// limit keep their traffic while random sources flood the same rule from
// every CPU; the kernel (what reaches the socket) says what got through.
func TestLimitKeepsSourcesUnderAFlood(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	// The sources are off-link: reverse-path filtering would drop them.
	testutil.Run(t, "ip", "-n", p.NsB, "route", "add", "default", "via", p.A4.String())
	testutil.Run(t, "ip", "netns", "exec", p.NsB, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf."+p.IfB+".rp_filter=0")
	mustRampart(t, "apply", "-f", writeFile(t, "p.yaml", limitPolicy), "--netns", p.NsB, "--iface", p.IfB, "--mode", "xdp-native")
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })
	ln := testutil.UDPListener(t, p.NsB, p.B4, 7004)
	received := make(chan int)
	go func() { received <- testutil.CountUDP(ln, time.Second) }()

	// Each legitimate source sends 20 packets a second, a fifth of its limit.
	const legit, rounds = 1000, 20
	done := make(chan struct{})
	var flooded time.Duration
	go func() {
		defer close(done)
		flooded = blast(t, p, sources{}, 7005, rounds*50*time.Millisecond+200*time.Millisecond)
	}()
	time.Sleep(100 * time.Millisecond)
	sent := 0
	err := netns.Run(p.NsA, func() error {
		fd, ifindex, err := packetSocket(p.IfA)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		sa := &unix.SockaddrLinklayer{Ifindex: ifindex}
		srcMAC, dstMAC := macOf(p.NsA, p.IfA), macOf(p.NsB, p.IfB)
		dst, _ := netip.AddrFromSlice(p.B4.To4())
		for r := 0; r < rounds; r++ {
			next := time.Now().Add(50 * time.Millisecond)
			for i := 0; i < legit; i++ {
				src := netip.AddrFrom4([4]byte{10, 90, byte(i >> 8), byte(i)})
				f := packet.Frame{SrcMAC: srcMAC, DstMAC: dstMAC, Src: src, Dst: dst, Proto: 17, Sport: 5000, Dport: 7004, Data: []byte("legit")}
				// A full veth queue (ENOBUFS) refuses the packet before it
				// leaves: sent again, it is still one legitimate packet.
				for err := error(unix.ENOBUFS); err == unix.ENOBUFS; {
					err = unix.Sendto(fd, f.Bytes(), 0, sa)
					if err != nil && err != unix.ENOBUFS {
						return err
					}
				}
				sent++
			}
			time.Sleep(time.Until(next))
		}
		return nil
	})
	<-done
	if err != nil {
		t.Fatal(err)
	}
	got := <-received
	fr := floodStats(t, p.NsB, "fair-share")
	t.Logf("%d of %d legitimate packets delivered; the rule saw %d packets in %v, %d over limit", got, sent, fr.Packets, flooded, fr.Over)
	if float64(got) < 0.99*float64(sent) {
		t.Errorf("%d of %d legitimate packets delivered under the flood, want ≥ 99%%", got, sent)
	}
	if fr.Packets+fr.Over < uint64(5*sent) {
		t.Errorf("the flood was %d packets against %d legitimate: not a flood", fr.Packets+fr.Over-uint64(sent), sent)
	}
}

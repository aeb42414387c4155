package cli_test

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/netns"
	"github.com/rampart-fw/rampart/internal/packet"
	"github.com/rampart-fw/rampart/internal/testutil"
)

const syncookiePolicy = `rules:
  - {name: web, dport: [9010, 9011], action: syncookie}
default: pass
`

// floodRow is a rule's row of stats --json with its flood counters.
type floodRow struct {
	Name     string `json:"name"`
	Packets  uint64 `json:"packets"`
	Over     uint64 `json:"over_limit"`
	Sent     uint64 `json:"cookies_sent"`
	OK       uint64 `json:"cookies_validated"`
	Rejected uint64 `json:"cookies_rejected"`
}

func floodStats(t *testing.T, ns, name string) floodRow {
	t.Helper()
	var s struct {
		Rules []floodRow `json:"rules"`
	}
	jsonOf(t, &s, "stats", "--netns", ns)
	for _, r := range s.Rules {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no rule %s in stats: %+v", name, s)
	return floodRow{}
}

// exchange connects, sends a line and reads it back.
func exchange(ns string, ip net.IP, port int) error {
	c, err := testutil.DialTCP(ns, ip, port, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("hello")); err != nil {
		return err
	}
	buf := make([]byte, 5)
	if _, err := c.Read(buf); err != nil || string(buf) != "hello" {
		return fmt.Errorf("echo %q: %v", buf, err)
	}
	return nil
}

// TestSyncookieConnections: real TCP clients complete handshakes through
// rampart's cookies, IPv4 and IPv6, at XDP (native and generic) and at tc,
// while a flood of SYNs from random sources hits the same port; a forged ACK
// is refused; the counters say so. (VLAN-tagged SYNs are answered with their
// tags, TestSynAckFrames; this kernel has no 802.1Q devices for a tagged
// handshake end to end.)
func TestSyncookieConnections(t *testing.T) {
	testutil.Privileged(t)
	if err := datapath.Require(datapath.FeatureTCPReqsk); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"xdp-native", "xdp-generic", "tc"} {
		t.Run(mode, func(t *testing.T) {
			p := testutil.NewPair(t)
			testutil.PeerXDP(t, p.NsA, p.IfA) // where XDP_TX's SYN-ACKs arrive
			testutil.ListenTCP(t, p.NsB, p.B4, 9010)
			testutil.ListenTCP(t, p.NsB, p.B6, 9011)
			mustRampart(t, "apply", "-f", writeFile(t, "p.yaml", syncookiePolicy), "--netns", p.NsB, "--iface", p.IfB, "--mode", mode)
			t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })

			stop := make(chan struct{})
			var flooded atomic.Int64
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				synFlood(t, p, stop, &flooded)
			}()
			const n = 40
			fails := 0
			for i := 0; i < n; i++ {
				if err := exchange(p.NsA, p.B4, 9010); err != nil {
					fails++
					t.Logf("IPv4 connection %d: %v", i, err)
				}
				if err := exchange(p.NsA, p.B6, 9011); err != nil {
					fails++
					t.Logf("IPv6 connection %d: %v", i, err)
				}
			}
			close(stop)
			wg.Wait()
			if fails > 0 {
				t.Errorf("%d of %d connections failed under a flood of %d SYNs", fails, 2*n, flooded.Load())
			}
			forgedACK(t, p)
			time.Sleep(100 * time.Millisecond)
			r := floodStats(t, p.NsB, "web")
			if r.OK < 2*n || r.Sent < 2*n+uint64(flooded.Load())/2 || r.Rejected == 0 {
				t.Errorf("web: %d cookies sent (flood %d), %d validated (want %d), %d rejected (want the forged ACK)", r.Sent, flooded.Load(), r.OK, 2*n, r.Rejected)
			}
		})
	}
}

// synFlood sends SYNs from random IPv4 sources to port 9010 from A's
// interface until stop.
func synFlood(t *testing.T, p *testutil.Pair, stop chan struct{}, sent *atomic.Int64) {
	err := netns.Run(p.NsA, func() error {
		fd, ifindex, err := packetSocket(p.IfA)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		dst, _ := netip.AddrFromSlice(p.B4.To4())
		sa := &unix.SockaddrLinklayer{Ifindex: ifindex}
		rng := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				return nil
			default:
			}
			src := netip.AddrFrom4([4]byte{198, 18, byte(rng.IntN(256)), byte(rng.IntN(256))})
			f := packet.Frame{SrcMAC: macOf(p.NsA, p.IfA), DstMAC: macOf(p.NsB, p.IfB), Src: src, Dst: dst, Proto: 6,
				Sport: uint16(1024 + rng.IntN(60000)), Dport: 9010, TCPFlags: 0x02, Seq: rng.Uint32(), TCPOpts: []byte{2, 4, 5, 0xb4}}
			if err := unix.Sendto(fd, f.Bytes(), 0, sa); err == nil {
				sent.Add(1)
			}
		}
	})
	if err != nil {
		t.Error(err)
	}
}

// forgedACK sends an ACK to the listener whose cookie is made up.
func forgedACK(t *testing.T, p *testutil.Pair) {
	t.Helper()
	err := netns.Run(p.NsA, func() error {
		fd, ifindex, err := packetSocket(p.IfA)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		src, _ := netip.AddrFromSlice(p.A4.To4())
		dst, _ := netip.AddrFromSlice(p.B4.To4())
		f := packet.Frame{SrcMAC: macOf(p.NsA, p.IfA), DstMAC: macOf(p.NsB, p.IfB), Src: src, Dst: dst, Proto: 6,
			Sport: 50505, Dport: 9010, TCPFlags: 0x10, Seq: 12345, Ack: 0xdeadbeef}
		return unix.Sendto(fd, f.Bytes(), 0, &unix.SockaddrLinklayer{Ifindex: ifindex})
	})
	if err != nil {
		t.Fatal(err)
	}
}

func packetSocket(ifc string) (int, int, error) {
	i, err := net.InterfaceByName(ifc)
	if err != nil {
		return 0, 0, err
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
	return fd, i.Index, err
}

func macOf(ns, ifc string) net.HardwareAddr {
	var m net.HardwareAddr
	netns.Run(ns, func() error {
		i, err := net.InterfaceByName(ifc)
		if err == nil {
			m = i.HardwareAddr
		}
		return err
	})
	return m
}

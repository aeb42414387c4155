package proxy

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/lab"
	"github.com/rampart-fw/rampart/internal/netns"
)

// benchBackend is the backend's servers: iperf3, a server that answers
// each connection with two bytes and closes it (recording its peers), and
// a UDP socket nobody reads (the interface counts what arrives).
type benchBackend struct {
	iperf *exec.Cmd
	ln    net.Listener
	udp   net.PacketConn
	mu    sync.Mutex
	peers map[netip.Addr]bool
}

func (t *proxyTopo) startBackend(ctx context.Context) (*benchBackend, error) {
	b := &benchBackend{peers: map[netip.Addr]bool{}}
	b.iperf = exec.CommandContext(ctx, "ip", "netns", "exec", t.backend, "iperf3", "-s", "-p", strconv.Itoa(int(pbIperf)))
	if err := b.iperf.Start(); err != nil {
		return nil, err
	}
	err := netns.Run(t.backend, func() (err error) {
		lc := net.ListenConfig{}
		lc.SetMultipathTCP(false)
		if b.ln, err = lc.Listen(ctx, "tcp4", netip.AddrPortFrom(pbBackend, pbCPSPort).String()); err != nil {
			return err
		}
		b.udp, err = net.ListenPacket("udp4", netip.AddrPortFrom(pbBackend, pbUDPPort).String())
		return err
	})
	if err != nil {
		b.stop()
		return nil, err
	}
	go func() {
		for {
			c, err := b.ln.Accept()
			if err != nil {
				return
			}
			peer := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
			b.mu.Lock()
			b.peers[peer] = true
			b.mu.Unlock()
			c.Write([]byte("ok"))
			c.Close()
		}
	}()
	return b, nil
}

func (b *benchBackend) stop() {
	if b.ln != nil {
		b.ln.Close()
	}
	if b.udp != nil {
		b.udp.Close()
	}
	b.iperf.Process.Kill()
	b.iperf.Wait()
}

func (b *benchBackend) onlyPeer(a netip.Addr) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.peers) == 1 && b.peers[a]
}

func (b *benchBackend) peerList() []netip.Addr {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []netip.Addr
	for a := range b.peers {
		out = append(out, a)
	}
	return out
}

func (t *proxyTopo) dial(ctx context.Context, target netip.Addr, port uint16) (net.Conn, error) {
	var c net.Conn
	err := netns.Run(t.client, func() (err error) {
		d := net.Dialer{Timeout: 2 * time.Second}
		d.SetMultipathTCP(false)
		c, err = d.DialContext(ctx, "tcp4", netip.AddrPortFrom(target, port).String())
		return err
	})
	return c, err
}

func (t *proxyTopo) waitListening(ctx context.Context, target netip.Addr, port uint16) error {
	var err error
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		var c net.Conn
		if c, err = t.dial(ctx, target, port); err == nil {
			_, err = io.ReadAll(c)
			c.Close()
			if err == nil {
				return nil
			}
		}
	}
	return err
}

// connRate opens connections from 16 clients at once for window and
// returns the completed ones per second: connect, read the reply, close.
func (t *proxyTopo) connRate(ctx context.Context, target netip.Addr, window time.Duration, b *benchBackend) (float64, error) {
	b.mu.Lock()
	clear(b.peers)
	b.mu.Unlock()
	var done, failed atomic.Int64
	end := time.Now().Add(window)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			buf := make([]byte, 8)
			for time.Now().Before(end) && ctx.Err() == nil {
				c, err := t.dial(ctx, target, pbCPSPort)
				if err != nil {
					failed.Add(1)
					continue
				}
				if _, err := io.ReadFull(c, buf[:2]); err == nil {
					done.Add(1)
				} else {
					failed.Add(1)
				}
				c.Close()
			}
		})
	}
	wg.Wait()
	if done.Load() == 0 {
		return 0, fmt.Errorf("no connection completed (%d failed)", failed.Load())
	}
	return float64(done.Load()) / window.Seconds(), nil
}

func (t *proxyTopo) iperf(ctx context.Context, target netip.Addr, streams int, window time.Duration) (float64, error) {
	secs := strconv.Itoa(max(1, int(window.Seconds())))
	out, _ := exec.CommandContext(ctx, "ip", "netns", "exec", t.client, "iperf3", "-c", target.String(), "-p", strconv.Itoa(int(pbIperf)),
		"-P", strconv.Itoa(streams), "-t", secs, "-J").Output()
	return lab.ParseIperf(out)
}

// udpSessions sends UDP from the client's address over many source
// ports through a raw socket: first 1,000 sessions (the proxy's resident
// memory read then), then o.Sessions (read again), then datagrams cycling
// over all of them for window, counted as they arrive at the backend.
func (t *proxyTopo) udpSessions(ctx context.Context, target netip.Addr, o Options, b *benchBackend, pid int) (rssLow, rssHigh, pps float64, err error) {
	var fd int
	if err := netns.Run(t.client, func() (err error) {
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
		return err
	}); err != nil {
		return 0, 0, 0, err
	}
	defer unix.Close(fd)
	dst := &unix.SockaddrInet4{Addr: target.As4()}
	pkt := make([]byte, 28+18) // an 18-byte payload: the minimum frame
	pkt[0], pkt[8], pkt[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(pkt[2:], uint16(len(pkt)))
	copy(pkt[12:], pbClient.AsSlice())
	copy(pkt[16:], target.AsSlice())
	binary.BigEndian.PutUint16(pkt[22:], pbUDPPort)
	binary.BigEndian.PutUint16(pkt[24:], uint16(len(pkt)-20))
	send := func(port int) {
		binary.BigEndian.PutUint16(pkt[20:], uint16(1024+port))
		for unix.Sendto(fd, pkt, 0, dst) == unix.ENOBUFS {
			time.Sleep(time.Millisecond)
		}
	}
	open := func(n int) {
		for p := range n {
			send(p)
			if p%500 == 499 {
				time.Sleep(5 * time.Millisecond) // let the proxy open them, not drop them
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	open(1000)
	if pid != 0 {
		rssLow = rssMB(pid)
	}
	open(o.Sessions)
	if pid != 0 {
		rssHigh = rssMB(pid)
	}
	before, err := t.backendRx()
	if err != nil {
		return 0, 0, 0, err
	}
	start := time.Now()
	for p := 0; time.Since(start) < o.Window && ctx.Err() == nil; p = (p + 1) % o.Sessions {
		binary.BigEndian.PutUint16(pkt[20:], uint16(1024+p))
		unix.Sendto(fd, pkt, 0, dst) // ENOBUFS: the client's queue is full, the datagram is not counted anywhere
	}
	dt := time.Since(start)
	time.Sleep(100 * time.Millisecond)
	after, err := t.backendRx()
	if err != nil {
		return 0, 0, 0, err
	}
	return rssLow, rssHigh, float64(after-before) / dt.Seconds(), nil
}

func (t *proxyTopo) backendRx() (uint64, error) {
	var n uint64
	err := netns.Run(t.backend, func() error {
		l, err := netlink.LinkByName("b0")
		if err != nil {
			return err
		}
		n = l.Attrs().Statistics.RxPackets
		return nil
	})
	return n, err
}

// rssMB is a process's resident memory in MB (VmRSS).
func rssMB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

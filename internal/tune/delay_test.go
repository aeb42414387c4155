package tune

import (
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/testutil"
)

// delayLine joins two namespaces with a TUN device in each and relays
// packets between them as a bottleneck link would: serialised at rate
// (bytes per second), then delayed by oneWay, dropped past a queue of
// queueLimit bytes. This kernel has no netem.
type delayLine struct {
	a, b   *os.File
	stop   chan struct{}
	wg     sync.WaitGroup
	rate   float64
	oneWay time.Duration
	limit  int
}

func openTun(t *testing.T, ns, name string) *os.File {
	t.Helper()
	var f *os.File
	if err := datapath.InNetns(ns, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		var req [unix.IFNAMSIZ + 64]byte
		copy(req[:], name)
		*(*uint16)(unsafe.Pointer(&req[unix.IFNAMSIZ])) = unix.IFF_TUN | unix.IFF_NO_PI
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req[0]))); e != 0 {
			unix.Close(fd)
			return e
		}
		f = os.NewFile(uintptr(fd), name)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return f
}

func (d *delayLine) relay(from, to *os.File) {
	defer d.wg.Done()
	type pkt struct {
		b   []byte
		due time.Time
	}
	q := make(chan pkt, 1<<16)
	var queued sync.Mutex
	inQueue := 0
	go func() {
		for p := range q {
			time.Sleep(time.Until(p.due))
			to.Write(p.b)
			queued.Lock()
			inQueue -= len(p.b)
			queued.Unlock()
		}
	}()
	var free time.Time // when the link finishes what it has been given
	for {
		b := make([]byte, 2048)
		n, err := from.Read(b)
		if err != nil {
			close(q)
			return
		}
		now := time.Now()
		queued.Lock()
		over := inQueue+n > d.limit
		if !over {
			inQueue += n
		}
		queued.Unlock()
		if over {
			continue // tail drop
		}
		free = maxTime(free, now).Add(time.Duration(float64(n) / d.rate * 1e9))
		q <- pkt{b[:n], free.Add(d.oneWay)}
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// TestDelayLine predicts, from the receiver's settings, what one TCP
// connection gets over a real 60 ms, 100 Mbit/s path, measures it, then
// sets the buffers tune recommends and measures again: one connection must
// reach 90% of the link.
func TestDelayLine(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t) // two namespaces; their veth is not used
	d := &delayLine{rate: 100e6 / 8, oneWay: 30 * time.Millisecond, stop: make(chan struct{})}
	d.limit = int(2 * d.rate * 0.06)
	d.a, d.b = openTun(t, p.NsA, "dla"), openTun(t, p.NsB, "dlb")
	for _, c := range [][]string{
		{"ip", "-n", p.NsA, "addr", "add", "10.77.0.1/32", "peer", "10.77.0.2", "dev", "dla"},
		{"ip", "-n", p.NsB, "addr", "add", "10.77.0.2/32", "peer", "10.77.0.1", "dev", "dlb"},
		{"ip", "-n", p.NsA, "link", "set", "dla", "up", "mtu", "1500"},
		{"ip", "-n", p.NsB, "link", "set", "dlb", "up", "mtu", "1500"},
		// A small receive buffer on the receiver: 256 kB, half of it window.
		{"ip", "netns", "exec", p.NsB, "sysctl", "-qw", "net.ipv4.tcp_rmem=4096 131072 262144"},
	} {
		testutil.Run(t, c[0], c[1:]...)
	}
	d.wg.Add(2)
	go d.relay(d.a, d.b)
	go d.relay(d.b, d.a)
	t.Cleanup(func() { d.a.Close(); d.b.Close() })

	measure := func() float64 {
		var ln net.Listener
		if err := datapath.InNetns(p.NsB, func() (err error) {
			ln, err = net.Listen("tcp", "10.77.0.2:0")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		got := make(chan float64, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				got <- 0
				return
			}
			defer c.Close()
			io.CopyN(io.Discard, c, 1<<20) // slow start's share
			start := time.Now()
			n, _ := io.Copy(io.Discard, c)
			got <- float64(n) / time.Since(start).Seconds()
		}()
		var c net.Conn
		if err := datapath.InNetns(p.NsA, func() (err error) {
			c, err = net.Dial("tcp", ln.Addr().String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64<<10)
		for end := time.Now().Add(4 * time.Second); time.Now().Before(end); {
			if _, err := c.Write(buf); err != nil {
				break
			}
		}
		c.Close()
		return <-got
	}
	// tcp_mem and net.core are the host's: a namespace has only its own
	// tcp_rmem, which is what the receiver's window follows.
	s, err := ReadTCP("/")
	if err != nil {
		t.Fatal(err)
	}
	s.Rmem = [3]int64{4096, 131072, 262144}
	rtt := 60 * time.Millisecond
	predicted, limit := s.RateNow(rtt)
	measured := measure()
	// Reported, not yet held to 15%: from 6.6 the kernel replaces the
	// default ratio the model assumes with the one each connection
	// measures (0.59 on this path, so the prediction is low by ~18%).
	t.Logf("receiver's tcp_rmem %v: predicted %.2f MB/s (%s), measured %.2f MB/s (%.2f×)", s.Rmem, predicted/1e6, limit, measured/1e6, measured/predicted)
	if measured < 0.5*predicted || measured > 2*predicted {
		t.Errorf("measured %.2f MB/s against %.2f predicted: the window, not the link, should bound this transfer", measured/1e6, predicted/1e6)
	}
	r, _ := s.Buffers(d.rate, rtt)
	testutil.Run(t, "ip", "netns", "exec", p.NsB, "sysctl", "-qw", fmt.Sprintf("net.ipv4.tcp_rmem=4096 131072 %d", r))
	after := measure()
	t.Logf("after tcp_rmem max %d: measured %.2f MB/s of a %.2f MB/s cap", r, after/1e6, d.rate/1e6)
	if after < 0.9*d.rate {
		t.Errorf("after the recommended buffers one connection got %.2f MB/s, want ≥ 90%% of %.2f", after/1e6, d.rate/1e6)
	}
}

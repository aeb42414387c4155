package flood

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/lab"
	"github.com/rampart-fw/rampart/internal/netns"
	"github.com/rampart-fw/rampart/internal/snmp"
)

// clients is the legitimate clients' namespace, behind the generator's.
type clients struct {
	ns     string
	v4, v6 []netip.Addr
	sink   link.Link
}

// addClients creates the clients' namespace and routes it through the
// generator's namespace to the receiving one, with clientCount addresses
// of each family. On the generator's side of the flood's veth it attaches
// lab_sink (what comes back for the flood's made-up sources is dropped
// there) with its NAPI thread on the generator's CPU, so that the replies
// cost the receiving CPU no more than sending them.
func addClients(t *lab.Topology, objs *lab.Objects, genCPU int) (c *clients, err error) {
	c = &clients{ns: strings.TrimSuffix(t.GenNs, "-gen") + "-cl"}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	var batch bytes.Buffer
	for i := range clientCount {
		a4 := lab.ClientNet4.Addr().As4()
		a4[3] = byte(2 + i)
		a6 := lab.ClientNet6.Addr().As16()
		binary.BigEndian.PutUint16(a6[14:], uint16(2+i))
		c.v4, c.v6 = append(c.v4, netip.AddrFrom4(a4)), append(c.v6, netip.AddrFrom16(a6))
		fmt.Fprintf(&batch, "addr add %s/24 dev lab-cl\naddr add %s/64 dev lab-cl nodad\n", c.v4[i], c.v6[i])
	}
	gw4, gw6 := lab.ClientNet4.Addr().Next(), lab.ClientNet6.Addr().Next()
	batchFile := filepath.Join(os.TempDir(), c.ns+".batch")
	if err := os.WriteFile(batchFile, batch.Bytes(), 0o600); err != nil {
		return c, err
	}
	defer os.Remove(batchFile)
	steps := [][]string{
		{"ip", "netns", "add", c.ns},
		{"ip", "-n", t.GenNs, "link", "add", "lab-gw", "type", "veth", "peer", "name", "lab-cl", "netns", c.ns},
		{"ip", "-n", t.GenNs, "addr", "add", gw4.String() + "/24", "dev", "lab-gw"},
		{"ip", "-n", t.GenNs, "addr", "add", gw6.String() + "/64", "dev", "lab-gw", "nodad"},
		{"ip", "-n", c.ns, "-batch", batchFile},
		{"ip", "-n", t.GenNs, "link", "set", "lab-gw", "up"},
		{"ip", "-n", c.ns, "link", "set", "lab-cl", "up"},
		{"ip", "-n", c.ns, "link", "set", "lo", "up"},
		{"ip", "-n", c.ns, "route", "add", "default", "via", gw4.String()},
		{"ip", "-n", c.ns, "-6", "route", "add", "default", "via", gw6.String()},
		{"ip", "netns", "exec", t.GenNs, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"},
		// One receive queue for flood and clients alike, as a NIC's ring:
		// a veth hands the packets of a sender with TSO to a receiver
		// without XDP by the backlog instead of its ring, which would
		// spare the clients' packets the ring's overflow in the rows
		// without XDP.
		{"ip", "netns", "exec", t.GenNs, "ethtool", "-K", t.GenIf, "tso", "off"},
		// The flood's link must not lose the neighbours under the flood.
		{"ip", "-n", t.RxNs, "neigh", "replace", lab.GenAddr4.String(), "lladdr", t.GenMAC.String(), "dev", t.RxIf, "nud", "permanent"},
		{"ip", "-n", t.RxNs, "neigh", "replace", lab.GenAddr6.String(), "lladdr", t.GenMAC.String(), "dev", t.RxIf, "nud", "permanent"},
		{"ip", "-n", t.GenNs, "neigh", "replace", lab.RxAddr4.String(), "lladdr", t.RxMAC.String(), "dev", t.GenIf, "nud", "permanent"},
		{"ip", "-n", t.GenNs, "neigh", "replace", lab.RxAddr6.String(), "lladdr", t.RxMAC.String(), "dev", t.GenIf, "nud", "permanent"},
	}
	for _, s := range steps {
		if err := lab.Run(s...); err != nil {
			return c, err
		}
	}
	if err := netns.Run(t.GenNs, func() (err error) {
		c.sink, err = link.AttachXDP(link.XDPOptions{Program: objs.LabSink, Interface: t.GenIndex, Flags: link.XDPDriverMode})
		return err
	}); err != nil {
		return c, fmt.Errorf("attach lab_sink to %s: %w", t.GenIf, err)
	}
	before := lab.NAPIThreads()
	if err := lab.Run("ip", "netns", "exec", t.GenNs, "sh", "-c", "echo 1 > /sys/class/net/"+t.GenIf+"/threaded"); err != nil {
		return c, err
	}
	for _, pid := range lab.NAPIThreads() {
		if slices.Contains(before, pid) {
			continue
		}
		if err := lab.PinThread(pid, genCPU); err != nil {
			return c, err
		}
		// Else the generator's time slices leave the veth's ring full,
		// and the replies meant for the legitimate clients are lost with
		// those for the flood's sources, which on a real network would
		// leave by the wire unhindered.
		if err := realTime(pid); err != nil {
			return c, err
		}
	}
	return c, nil
}

// realTime gives a NAPI thread the CPU as soon as it has work, as the
// softirq it replaces has: a threaded NAPI of normal priority waits its turn
// behind the CPU's other threads while its ring overflows.
func realTime(pid int) error {
	if err := unix.SchedSetAttr(pid, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: 50}, 0); err != nil {
		return fmt.Errorf("make napi thread %d real-time: %w", pid, err)
	}
	return nil
}

func (c *clients) close() {
	if c.sink != nil {
		c.sink.Close()
	}
	lab.Run("ip", "netns", "del", c.ns)
}

// servers are the services the flood aims at, in the receiving namespace:
// a TCP one that answers one request per connection and a UDP echo.
type servers struct {
	tcp net.Listener
	udp *net.UDPConn
	wg  sync.WaitGroup
}

func startServers(t *lab.Topology, family int) (*servers, error) {
	addr := lab.RxAddr4
	if family == 6 {
		addr = lab.RxAddr6
	}
	s := &servers{}
	err := netns.Run(t.RxNs, func() (err error) {
		// Plain TCP: Go's listeners are MPTCP by default, and the kernel
		// takes no request socket made from a SYN cookie for MPTCP.
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		if s.tcp, err = lc.Listen(context.Background(), "tcp", netip.AddrPortFrom(addr, tcpPort).String()); err != nil {
			return err
		}
		s.udp, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, udpPort)))
		return err
	})
	if err != nil {
		s.close()
		return nil, err
	}
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		for {
			c, err := s.tcp.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(2 * legitTimeout))
				buf := make([]byte, 64)
				if n, err := c.Read(buf); err == nil {
					c.Write(buf[:n])
				}
			}()
		}
	}()
	go func() {
		defer s.wg.Done()
		buf := make([]byte, 2048)
		for {
			n, from, err := s.udp.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			s.udp.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	return s, nil
}

func (s *servers) close() {
	if s.tcp != nil {
		s.tcp.Close()
	}
	if s.udp != nil {
		s.udp.Close()
	}
	s.wg.Wait()
}

// legitLoad is the legitimate clients at a fixed rate: every request
// starts on schedule whatever became of the ones before, as real users'
// do, and is answered within legitTimeout or counts as failed.
type legitLoad struct {
	stopc   chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	started int
	latency []float64 // ms, of those answered
	errors  map[string]int
}

func startLegit(c *clients, proto string, family, rate int) *legitLoad {
	l := &legitLoad{stopc: make(chan struct{}), errors: map[string]int{}}
	dst, srcs := lab.RxAddr4, c.v4
	if family == 6 {
		dst, srcs = lab.RxAddr6, c.v6
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-l.stopc:
				return
			case <-tick.C:
			}
			l.mu.Lock()
			l.started++
			l.mu.Unlock()
			src := srcs[i%len(srcs)]
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				start := time.Now()
				var err error
				if proto == "tcp" {
					err = tcpRequest(c.ns, src, dst, i)
				} else {
					err = udpRequest(c.ns, src, dst, i)
				}
				l.mu.Lock()
				defer l.mu.Unlock()
				if err != nil {
					l.errors[errorKind(err)]++
					return
				}
				l.latency = append(l.latency, float64(time.Since(start))/1e6)
			}()
		}
	}()
	return l
}

// prime has every client address exchange a datagram with the service
// until it is answered (or a few seconds pass), so that the neighbour
// entries on the way exist before anything is measured, as they do for
// clients already in touch with a service.
func prime(c *clients, family int) {
	dst, srcs := lab.RxAddr4, c.v4
	if family == 6 {
		dst, srcs = lab.RxAddr6, c.v6
	}
	var wg sync.WaitGroup
	for i, src := range srcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for try := 0; try < 5 && udpRequest(c.ns, src, dst, -1-i) != nil; try++ {
			}
		}()
	}
	wg.Wait()
}

// stop ends the schedule and waits for the requests under way.
func (l *legitLoad) stop() {
	close(l.stopc)
	l.wg.Wait()
}

func (l *legitLoad) summarise(r *Result) {
	r.LegitRequests = l.started
	if l.started > 0 {
		r.LegitSuccess = float64(len(l.latency)) / float64(l.started)
	}
	if len(l.errors) > 0 {
		r.LegitErrors = l.errors
	}
	sort.Float64s(l.latency)
	r.LegitP50Ms, r.LegitP99Ms = lab.Percentile(l.latency, 0.5), lab.Percentile(l.latency, 0.99)
}

// errorKind names what became of a failed request.
func errorKind(err error) string {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, unix.ECONNREFUSED):
		return "refused"
	case errors.Is(err, unix.ECONNRESET):
		return "reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "closed"
	}
	return "other"
}

// tcpRequest connects from src, sends a request, reads the reply and
// closes.
func tcpRequest(ns string, src, dst netip.Addr, id int) error {
	deadline := time.Now().Add(legitTimeout)
	var c net.Conn
	if err := netns.Run(ns, func() (err error) {
		d := net.Dialer{Deadline: deadline, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}
		d.SetMultipathTCP(false)
		c, err = d.Dial("tcp", netip.AddrPortFrom(dst, tcpPort).String())
		return err
	}); err != nil {
		return err
	}
	defer c.Close()
	return exchange(c, deadline, id)
}

// udpRequest sends one datagram from src and waits for its echo.
func udpRequest(ns string, src, dst netip.Addr, id int) error {
	deadline := time.Now().Add(legitTimeout)
	var c *net.UDPConn
	if err := netns.Run(ns, func() (err error) {
		c, err = net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, udpPort)))
		return err
	}); err != nil {
		return err
	}
	defer c.Close()
	return exchange(c, deadline, id)
}

// exchange writes a request naming id and reads back the same bytes.
func exchange(c net.Conn, deadline time.Time, id int) error {
	c.SetDeadline(deadline)
	req := fmt.Appendf(nil, "request %08d\n", id)
	if _, err := c.Write(req); err != nil {
		return err
	}
	got := make([]byte, len(req))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if !bytes.Equal(got, req) {
		return fmt.Errorf("reply %q to %q", got, req)
	}
	return nil
}

// readNetstat reads one protocol counter of the calling thread's network
// namespace (nstat's names: TcpExt + ListenDrops, Udp6 + InErrors).
func readNetstat(group, name string) (uint64, error) {
	c := snmp.Counters{}
	err := snmp.ReadThread(c)
	return c[group+name], err
}

package testutil

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"

	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/netns"
)

// Pair is two network namespaces joined by a veth pair:
// A (10.x.y.1, fd00:x:y::1 on IfA) and B (.2 / ::2 on IfB).
type Pair struct {
	NsA, NsB string
	IfA, IfB string
	A4, B4   net.IP
	A6, B6   net.IP
	// Lossy: frames between the two cross a wire that may lose some (NICs
	// through the host's taps and bridge), not a veth pair, which loses
	// none.
	Lossy bool
}

var pairSeq atomic.Int32

// NewPair creates the namespaces and removes them when the test ends.
func NewPair(t testing.TB) *Pair {
	t.Helper()
	p := newPair(t, "", "")
	Run(t, "ip", "-n", p.NsA, "link", "add", p.IfA, "type", "veth", "peer", "name", p.IfB, "netns", p.NsB)
	p.wire(t)
	return p
}

// PairOver is NewPair over two interfaces of this namespace that are wired
// to each other (NICs on one segment): they move into the pair's
// namespaces, and come back when the test ends, as physical devices do when
// their namespace goes.
func PairOver(t testing.TB, ifA, ifB string) *Pair {
	t.Helper()
	// Registered first, so it runs last: namespaces go asynchronously.
	t.Cleanup(func() { WaitLinks(t, "", ifA, ifB) })
	p := newPair(t, ifA, ifB)
	p.Lossy = true
	Run(t, "ip", "link", "set", ifA, "netns", p.NsA)
	Run(t, "ip", "link", "set", ifB, "netns", p.NsB)
	p.wire(t)
	return p
}

func newPair(t testing.TB, ifA, ifB string) *Pair {
	n := pairSeq.Add(1)
	tag := fmt.Sprintf("%d-%d", os.Getpid()%100000, n)
	p := &Pair{
		NsA: "rpt-" + tag + "-a", NsB: "rpt-" + tag + "-b",
		IfA: "rpta" + fmt.Sprint(n), IfB: "rptb" + fmt.Sprint(n),
		A4: net.IPv4(10, 201, byte(n), 1), B4: net.IPv4(10, 201, byte(n), 2),
		A6: net.ParseIP(fmt.Sprintf("fd00:201:%x::1", n)), B6: net.ParseIP(fmt.Sprintf("fd00:201:%x::2", n)),
	}
	if ifA != "" {
		p.IfA, p.IfB = ifA, ifB
	}
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", p.NsA).Run()
		exec.Command("ip", "netns", "del", p.NsB).Run()
	})
	Run(t, "ip", "netns", "add", p.NsA)
	Run(t, "ip", "netns", "add", p.NsB)
	return p
}

// wire addresses both ends and makes their neighbours permanent.
func (p *Pair) wire(t testing.TB) {
	t.Helper()
	for _, side := range []struct{ ns, ifc, v4, v6 string }{
		{p.NsA, p.IfA, p.A4.String() + "/24", p.A6.String() + "/64"},
		{p.NsB, p.IfB, p.B4.String() + "/24", p.B6.String() + "/64"},
	} {
		Run(t, "ip", "-n", side.ns, "addr", "add", side.v4, "dev", side.ifc)
		Run(t, "ip", "-n", side.ns, "addr", "add", side.v6, "dev", side.ifc, "nodad")
		Run(t, "ip", "-n", side.ns, "link", "set", side.ifc, "up")
		Run(t, "ip", "-n", side.ns, "link", "set", "lo", "up")
	}
	// What a test reads of a link must not change by itself under it: a
	// slow guest is still raising the carrier when the commands return.
	waitCarrier(t, p.NsA, p.IfA)
	waitCarrier(t, p.NsB, p.IfB)
	// Permanent neighbours, so that no ARP or ND races the first packets.
	macA, macB := mac(t, p.NsA, p.IfA), mac(t, p.NsB, p.IfB)
	for _, n := range []struct{ ns, ifc, ip, mac string }{
		{p.NsA, p.IfA, p.B4.String(), macB}, {p.NsA, p.IfA, p.B6.String(), macB},
		{p.NsB, p.IfB, p.A4.String(), macA}, {p.NsB, p.IfB, p.A6.String(), macA},
	} {
		Run(t, "ip", "-n", n.ns, "neigh", "replace", n.ip, "lladdr", n.mac, "dev", n.ifc, "nud", "permanent")
	}
}

func mac(t testing.TB, ns, ifc string) string {
	var m string
	if err := netns.Run(ns, func() error {
		i, err := net.InterfaceByName(ifc)
		if err == nil {
			m = i.HardwareAddr.String()
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return m
}

// Run runs a command and fails the test with its output when it fails.
func Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Socket opens a socket inside a namespace; it stays there when used from
// any thread.
func Socket(t testing.TB, ns string, open func() (net.Conn, error)) net.Conn {
	t.Helper()
	var c net.Conn
	if err := netns.Run(ns, func() (err error) { c, err = open(); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// UDPListener listens on port in ns with a large receive buffer.
func UDPListener(t testing.TB, ns string, ip net.IP, port int) *net.UDPConn {
	t.Helper()
	c := Socket(t, ns, func() (net.Conn, error) { return net.ListenUDP("udp", &net.UDPAddr{IP: ip, Port: port}) }).(*net.UDPConn)
	// SO_RCVBUFFORCE: past net.core.rmem_max (212,992 bytes on a stock
	// kernel), which would hold only ~100 of the page-sized buffers that
	// veth's native XDP path delivers while a slow reader catches up.
	if raw, err := c.SyscallConn(); err == nil {
		raw.Control(func(fd uintptr) {
			if syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, 8<<20) != nil {
				c.SetReadBuffer(8 << 20)
			}
		})
	}
	return c
}

// CountUDP reads datagrams until idle has passed without one.
func CountUDP(c *net.UDPConn, idle time.Duration) int {
	buf := make([]byte, 2048)
	n := 0
	for {
		c.SetReadDeadline(time.Now().Add(idle))
		if _, err := c.Read(buf); err != nil {
			return n
		}
		n++
	}
}

// SendUDP sends count datagrams from ns to ip:port.
func SendUDP(t testing.TB, ns string, ip net.IP, port, count int) {
	t.Helper()
	c := Socket(t, ns, func() (net.Conn, error) { return net.DialUDP("udp", nil, &net.UDPAddr{IP: ip, Port: port}) })
	for i := 0; i < count; i++ {
		if _, err := c.Write([]byte("rampart-test-payload")); err != nil {
			t.Fatalf("send to %s:%d: %v", ip, port, err)
		}
		// A veth peer with XDP takes frames through a 256-slot ring that
		// its NAPI drains; an emulated guest's sender can outrun it and
		// lose frames before any filter sees them. A pause every 32 keeps
		// the ring from filling.
		if i%32 == 31 {
			time.Sleep(time.Millisecond)
		}
	}
}

// DialTCP connects from ns to ip:port, failing after timeout.
func DialTCP(ns string, ip net.IP, port int, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := netns.Run(ns, func() (err error) {
		c, err = net.DialTimeout("tcp", net.JoinHostPort(ip.String(), fmt.Sprint(port)), timeout)
		return err
	})
	return c, err
}

// ListenTCP accepts connections in ns and echoes what they send. The
// listener is plain TCP: Go's are MPTCP by default from 1.24, and the kernel
// hands no request socket made from a SYN cookie to an MPTCP listener.
func ListenTCP(t testing.TB, ns string, ip net.IP, port int) {
	t.Helper()
	var l net.Listener
	if err := netns.Run(ns, func() (err error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		l, err = lc.Listen(context.Background(), "tcp", net.JoinHostPort(ip.String(), fmt.Sprint(port)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64)
				n, _ := c.Read(buf)
				c.Write(buf[:n])
			}()
		}
	}()
}

// PeerXDP attaches an XDP program that passes everything to ifc in ns, in
// driver mode. A veth delivers what its peer's XDP program transmits
// (XDP_TX) only to a side with XDP of its own: the frames are queued for
// that side's NAPI, which is kicked only when it runs a program.
func PeerXDP(t testing.TB, ns, ifc string) {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.LoadImm(asm.R0, 2, asm.DWord), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	if err := netns.Run(ns, func() error {
		i, err := net.InterfaceByName(ifc)
		if err != nil {
			return err
		}
		l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: i.Index, Flags: link.XDPDriverMode})
		if err == nil {
			t.Cleanup(func() { l.Close() })
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// Alive reports whether a process exists.
func Alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// GuestNICs are the NICs of the kernel tier's NIC guest (scripts/kernels.sh):
// four virtio_net NICs with two queues each, an MSI-X vector per queue,
// wired in pairs on the host (0 with 2, 1 with 3), in a kernel with
// bonding, fq, netem and gact. Elsewhere the test skips, saying where it
// runs: this machine's kernel lacks those modules and it has no NIC to
// spare. In that guest a skip counts as a failure.
func GuestNICs(t testing.TB) []string {
	t.Helper()
	Privileged(t)
	nics := strings.Split(os.Getenv("RAMPART_GUEST_NICS"), ",")
	if len(nics) != 4 {
		t.Skip("runs in the kernel tier's NIC guest: bash scripts/kernels.sh")
	}
	return nics
}

// SendRaw writes frames out of ifc in ns through a packet socket, as a
// peer's NIC would put them on the wire.
func SendRaw(t testing.TB, ns, ifc string, frames [][]byte) {
	t.Helper()
	err := netns.Run(ns, func() error {
		i, err := net.InterfaceByName(ifc)
		if err != nil {
			return err
		}
		fd, err := syscall.Socket(syscall.AF_PACKET, syscall.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer syscall.Close(fd)
		if err := syscall.Bind(fd, &syscall.SockaddrLinklayer{Ifindex: i.Index}); err != nil {
			return err
		}
		for _, f := range frames {
			if _, err := syscall.Write(fd, f); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("send on %s: %v", ifc, err)
	}
}

// MAC is the hardware address of ifc in ns.
func MAC(t testing.TB, ns, ifc string) net.HardwareAddr {
	t.Helper()
	m, err := net.ParseMAC(mac(t, ns, ifc))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// waitCarrier waits until an interface of ns has its carrier (a veth: once
// its peer is up too).
func waitCarrier(t testing.TB, ns, ifc string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		out := Run(t, "ip", "-n", ns, "link", "show", ifc)
		if strings.Contains(out, "LOWER_UP") && strings.Contains(out, "state UP") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s in %s has no carrier: %s", ifc, ns, out)
		}
	}
}

// WaitLinks waits up to 10 s for the interfaces to be in ns.
func WaitLinks(t testing.TB, ns string, ifcs ...string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		missing := ""
		for _, ifc := range ifcs {
			if idx, _ := datapath.Ifindex(ns, ifc); idx == 0 {
				missing = ifc
			}
		}
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("interface %s did not come back", missing)
		}
	}
}

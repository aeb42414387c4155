package cli_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/netns"
	"github.com/rampart-fw/rampart/internal/policy"
	"github.com/rampart-fw/rampart/internal/testutil"
)

// TestKernelOracle sends an attacker's frames (listed sources, dropped ports,
// IPv6 header chains up to the MTU, fragments in any order, overlaps, tiny
// first fragments, truncations, lying lengths, VLAN stacks) through rampart
// in each mode, and lets the kernel say what gets through: what reaches a
// socket is what the host accepted.
//
// Two assertions. No delivered packet may be one the policy drops, judged
// from what the socket received (source, protocol, port, flags): no model is
// involved. And per marked datagram, against a baseline run without rampart:
// a datagram the bare kernel delivers and whose every fragment the reference
// model passes is delivered (allowed frames of every shape still arrive); a
// datagram whose every fragment the reference drops is not; rampart never
// delivers what the bare kernel does not. (When the reference drops some
// fragments only, the rest may still make a datagram: the first assertion
// judges it.) RAMPART_ORACLE_DATAGRAMS sets the datagrams per run.
func TestKernelOracle(t *testing.T) {
	testutil.Privileged(t)
	n := 135000 // over 200,000 frames per mode
	if s := os.Getenv("RAMPART_ORACLE_DATAGRAMS"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	if testing.Short() {
		n = 5000
	}
	pol, err := policy.Parse("oracle.yaml", []byte(oraclePolicy))
	if err != nil {
		t.Fatal(err)
	}

	base := runOracle(t, "", n, pol)
	t.Logf("baseline (no rampart): %d frames, %d datagrams delivered, %d deliveries to sockets the policy forbids", base.frames, len(base.delivered), base.mustDropDelivered)
	if base.mustDropDelivered == 0 {
		t.Fatal("the bare kernel delivered none of the datagrams the policy drops: the test has no teeth")
	}
	for _, mode := range []string{"xdp-native", "xdp-generic", "tc"} {
		t.Run(mode, func(t *testing.T) {
			r := runOracle(t, mode, n, pol)
			t.Logf("%s: %d frames sent, %d datagrams delivered, %d violations", mode, r.frames, len(r.delivered), len(r.violations))
			for _, v := range r.violations[:min(len(r.violations), 20)] {
				t.Errorf("delivered although the policy drops it: %s", v)
			}
			var missing, extra []string
			for _, d := range r.datagrams {
				got, kernel := r.delivered[d.id], base.delivered[d.id]
				line := fmt.Sprintf("datagram %d (%s): delivered %v; bare kernel %v; reference passes all fragments %v, drops all %v", d.id, d.shape, got, kernel, r.refPassesAll[d.id], r.refDropsAll[d.id])
				switch {
				case !got && kernel && r.refPassesAll[d.id]:
					missing = append(missing, line)
				case got && (!kernel || r.refDropsAll[d.id]):
					extra = append(extra, line)
				}
			}
			for _, l := range append(extra, missing...)[:min(len(extra)+len(missing), 20)] {
				t.Error(l)
			}
			if len(missing)+len(extra) > 0 {
				t.Errorf("%d allowed datagrams lost, %d delivered that should not be", len(missing), len(extra))
			}
			r.logShapes(t, base)
		})
	}
}

type oracleRun struct {
	frames            int
	datagrams         []oracleDatagram
	refPassesAll      map[uint32]bool // the reference passes every fragment
	refDropsAll       map[uint32]bool // the reference drops every fragment
	delivered         map[uint32]bool
	violations        []string
	mustDropDelivered int
}

func (r *oracleRun) logShapes(t *testing.T, base *oracleRun) {
	type row struct{ datagrams, frames, baseDelivered, delivered, refDropped int }
	rows := map[string]*row{}
	for _, d := range r.datagrams {
		k := d.shape
		if i := strings.IndexAny(k, "+/"); i > 0 && !strings.HasPrefix(k, "plain") {
			k = k[:i]
		}
		if rows[k] == nil {
			rows[k] = &row{}
		}
		x := rows[k]
		x.datagrams++
		x.frames += len(d.frames)
		if base.delivered[d.id] {
			x.baseDelivered++
		}
		if r.delivered[d.id] {
			x.delivered++
		}
		if r.refDropsAll[d.id] {
			x.refDropped++
		}
	}
	keys := make([]string, 0, len(rows))
	for k := range rows {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "%-28s %9s %7s %15s %13s %9s\n", "shape", "datagrams", "frames", "ref. drops all", "kernel alone", "rampart")
	for _, k := range keys {
		x := rows[k]
		fmt.Fprintf(&b, "%-28s %9d %7d %15d %13d %9d\n", k, x.datagrams, x.frames, x.refDropped, x.baseDelivered, x.delivered)
	}
	t.Logf("delivered datagrams by shape:\n%s", b.String())
}

// runOracle builds a receiver, applies rampart in mode ("" for none), sends
// n datagrams and collects what the receiver's sockets got.
func runOracle(t *testing.T, mode string, n int, pol *policy.Policy) *oracleRun {
	t.Helper()
	p := testutil.NewPair(t)
	to := oracleReceiver(t, p)
	rx := startReceivers(t, p.NsB)
	if mode != "" {
		polFile := writeFile(t, "oracle.yaml", oraclePolicy)
		mustRampart(t, "apply", "-f", polFile, "--netns", p.NsB, "--iface", p.IfB, "--mode", mode)
		t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })
	}

	gen := &oracleGen{rng: rand.New(rand.NewPCG(11, 17)), to: to}
	r := &oracleRun{refPassesAll: map[uint32]bool{}, refDropsAll: map[uint32]bool{}}
	for id := uint32(1); id <= uint32(n); id++ {
		d := gen.datagram(id)
		r.datagrams = append(r.datagrams, d)
		passes, drops := 0, 0
		for _, f := range d.frames {
			if pol.Eval(f).Action == policy.Pass {
				passes++
			} else {
				drops++
			}
		}
		r.refPassesAll[id], r.refDropsAll[id] = drops == 0, passes == 0
	}
	before := linkDrops(t, p)
	send(t, p, r.datagrams, &r.frames)
	time.Sleep(300 * time.Millisecond)
	rx.stop()
	if d := linkDrops(t, p) - before; d != 0 {
		t.Fatalf("the veth pair dropped %d frames on its own: the run proves nothing (pace the sender)", d)
	}
	if d := socketDrops(t, p.NsB); d != 0 {
		t.Fatalf("receiving sockets dropped %d packets: deliveries went unseen", d)
	}
	r.delivered, r.mustDropDelivered = rx.delivered, rx.mustDrop
	shapes := map[uint32]string{}
	for _, d := range r.datagrams {
		shapes[d.id] = d.shape
	}
	for _, v := range rx.violations {
		r.violations = append(r.violations, fmt.Sprintf("%s [%s]", v.text, shapes[v.id]))
	}
	return r
}

// oracleReceiver sets up the receiving namespace: no reverse-path filter,
// blackhole default routes (replies to the forged sources go nowhere, no ARP
// storm) and room to reassemble. Every run gets the same MACs and
// addresses, so its frames are byte for byte the baseline's: a mutation's
// fate may hang on a checksum over them.
func oracleReceiver(t *testing.T, p *testutil.Pair) receiverAddrs {
	t.Helper()
	to := receiverAddrs{v4: netip.MustParseAddr("10.250.0.2"), v6: netip.MustParseAddr("fd00:250::2"),
		mac: net.HardwareAddr{0x02, 0x52, 0x50, 0, 0, 2}, srcMAC: net.HardwareAddr{0x02, 0x52, 0x50, 0, 0, 1}}
	testutil.Run(t, "ip", "-n", p.NsA, "link", "set", "dev", p.IfA, "address", to.srcMAC.String())
	testutil.Run(t, "ip", "-n", p.NsB, "link", "set", "dev", p.IfB, "address", to.mac.String())
	testutil.Run(t, "ip", "-n", p.NsB, "addr", "add", to.v4.String()+"/24", "dev", p.IfB)
	testutil.Run(t, "ip", "-n", p.NsB, "addr", "add", to.v6.String()+"/64", "dev", p.IfB, "nodad")
	testutil.Run(t, "ip", "netns", "exec", p.NsB, "sysctl", "-qw",
		"net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0", "net.ipv4.conf."+p.IfB+".rp_filter=0",
		"net.ipv4.ipfrag_high_thresh=536870912", "net.ipv6.ip6frag_high_thresh=536870912")
	testutil.Run(t, "ip", "-n", p.NsB, "route", "add", "blackhole", "default")
	testutil.Run(t, "ip", "-n", p.NsB, "-6", "route", "add", "blackhole", "default")
	return to
}

// receivers are the receiving namespace's sockets: raw sockets of every
// protocol the frames carry (they see every datagram the stack delivers,
// after reassembly), and UDP and TCP listeners on allowed and dropped ports.
type receivers struct {
	mu         sync.Mutex
	delivered  map[uint32]bool
	violations []violation
	mustDrop   int
	fds        []int
	wg         sync.WaitGroup
	done       chan struct{}
}

func startReceivers(t *testing.T, ns string) *receivers {
	t.Helper()
	rx := &receivers{delivered: map[uint32]bool{}, done: make(chan struct{})}
	open := func(family, typ, proto int, port int) {
		var fd int
		err := netns.Run(ns, func() (err error) {
			fd, err = unix.Socket(family, typ|unix.SOCK_CLOEXEC, proto)
			if err != nil {
				return err
			}
			unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 256<<20)
			unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100000})
			if port == 0 {
				return nil
			}
			if family == unix.AF_INET6 {
				unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1)
				err = unix.Bind(fd, &unix.SockaddrInet6{Port: port})
			} else {
				err = unix.Bind(fd, &unix.SockaddrInet4{Port: port})
			}
			if err == nil && typ == unix.SOCK_STREAM {
				err = unix.Listen(fd, 4096)
			}
			return err
		})
		if err != nil {
			t.Fatalf("socket %d/%d/%d port %d: %v", family, typ, proto, port, err)
		}
		rx.fds = append(rx.fds, fd)
		if typ == unix.SOCK_STREAM {
			return // the raw sockets see its SYNs; it only makes the port open
		}
		rx.wg.Add(1)
		go rx.read(fd, family, typ, proto, port)
	}
	for _, proto := range []int{unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_ICMP} {
		open(unix.AF_INET, unix.SOCK_RAW, proto, 0)
	}
	for _, proto := range []int{unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_ICMPV6} {
		open(unix.AF_INET6, unix.SOCK_RAW, proto, 0)
	}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		open(fam, unix.SOCK_DGRAM, 0, udpAllowed)
		open(fam, unix.SOCK_DGRAM, 0, udpDropped)
		for _, port := range []int{tcpAllowed, tcpDropped, tcpSYNRule} {
			open(fam, unix.SOCK_STREAM, 0, port)
		}
	}
	t.Cleanup(func() {
		for _, fd := range rx.fds {
			unix.Close(fd)
		}
	})
	return rx
}

// violation is a delivery the policy forbids: the datagram's id (0 when its
// marker did not survive) and what the socket got.
type violation struct {
	id   uint32
	text string
}

func (rx *receivers) stop() {
	close(rx.done)
	rx.wg.Wait()
}

// read records what one socket receives until stopped and idle.
func (rx *receivers) read(fd, family, typ, proto, port int) {
	defer rx.wg.Done()
	buf := make([]byte, 1<<16)
	for {
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			select {
			case <-rx.done:
				return
			default:
				continue
			}
		}
		b := buf[:n]
		var src netip.Addr
		switch a := from.(type) {
		case *unix.SockaddrInet4:
			src = netip.AddrFrom4(a.Addr)
		case *unix.SockaddrInet6:
			src = netip.AddrFrom16(a.Addr)
		}
		l4, p := b, proto
		if typ == unix.SOCK_RAW && family == unix.AF_INET && len(b) >= 20 { // IPv4 raw sockets get the header
			src, p = netip.AddrFrom4([4]byte(b[12:16])), int(b[9])
			l4 = b[min(len(b), int(b[0]&0xf)*4):]
		}
		var dport uint16
		var flags uint8
		haveFlags := false
		switch {
		case typ == unix.SOCK_DGRAM:
			p, dport = unix.IPPROTO_UDP, uint16(port)
		case (p == unix.IPPROTO_TCP || p == unix.IPPROTO_UDP) && len(l4) >= 4:
			dport = binary.BigEndian.Uint16(l4[2:])
			if p == unix.IPPROTO_TCP && len(l4) >= 14 {
				flags, haveFlags = l4[13], true
			}
		}
		bad := mustDrop(src, p, dport, flags, haveFlags)
		id, marked := markedID(b)
		rx.mu.Lock()
		if marked {
			rx.delivered[id] = true
		}
		if bad {
			rx.mustDrop++
			rx.violations = append(rx.violations, violation{id, fmt.Sprintf("socket %d/%d/%d: from %s proto %d dport %d flags %#x (datagram %d): % x", family, typ, proto, src, p, dport, flags, id, b[:min(len(b), 48)])})
		}
		rx.mu.Unlock()
	}
}

// send writes every frame onto the sender's end of the veth pair, pacing so
// that the pair's own queues never overflow.
func send(t *testing.T, p *testutil.Pair, ds []oracleDatagram, count *int) {
	t.Helper()
	var fd, ifindex int
	err := netns.Run(p.NsA, func() error {
		ifc, err := net.InterfaceByName(p.IfA)
		if err != nil {
			return err
		}
		ifindex = ifc.Index
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	to := &unix.SockaddrLinklayer{Ifindex: ifindex}
	for _, d := range ds {
		for _, f := range d.frames {
			if err := unix.Sendto(fd, f, 0, to); err != nil {
				t.Fatalf("send datagram %d (%s, %d bytes): %v", d.id, d.shape, len(f), err)
			}
			*count++
			if *count%64 == 0 {
				time.Sleep(50 * time.Microsecond)
			}
		}
	}
}

// linkDrops counts frames the pair lost on its own: the sender's tx_dropped
// (the receiver's ring was full) and the backlog drops of softnet_stat.
// (rx_dropped is no signal: it also counts frames no protocol takes.)
func linkDrops(t *testing.T, p *testutil.Pair) int {
	out, err := exec.Command("ip", "netns", "exec", p.NsA, "cat", "/sys/class/net/"+p.IfA+"/statistics/tx_dropped").Output()
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	softnet, err := os.ReadFile("/proc/net/softnet_stat")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(softnet)), "\n") {
		if f := strings.Fields(line); len(f) > 1 {
			v, _ := strconv.ParseUint(f[1], 16, 64)
			n += int(v)
		}
	}
	return n
}

// socketDrops sums the drops column of the namespace's raw sockets, which
// see every datagram the stack delivers. (The UDP sockets' column also
// counts checksum failures, which the raw sockets saw first; an ICMPv6 raw
// socket verifies checksums as RFC 3542 requires, as icmpv6_rcv does, so its
// column counts those, not overflows.)
func socketDrops(t *testing.T, ns string) int {
	n := 0
	for _, f := range []string{"raw", "raw6"} {
		out, err := exec.Command("ip", "netns", "exec", ns, "cat", "/proc/net/"+f).Output()
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(out))
		sc.Scan() // header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) > 1 && strings.HasSuffix(fields[1], ":003A") {
				continue // ICMPv6: checksum failures
			}
			if len(fields) > 0 {
				v, _ := strconv.Atoi(fields[len(fields)-1])
				n += v
			}
		}
	}
	return n
}

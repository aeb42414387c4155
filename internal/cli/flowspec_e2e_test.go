package cli_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rampart-fw/rampart/internal/netns"
	"github.com/rampart-fw/rampart/internal/packet"
	"github.com/rampart-fw/rampart/internal/serve"
	"github.com/rampart-fw/rampart/internal/stats"
	"github.com/rampart-fw/rampart/internal/testutil"
)

// speaker is a BGP daemon of Debian's (gobgpd or bird) in a namespace.
type speaker struct {
	t    *testing.T
	ns   string
	cmd  *exec.Cmd
	log  *logBuffer
	ctl  []string // the command line that drives it
	name string
}

func (s *speaker) run(args ...string) string {
	s.t.Helper()
	full := append(append([]string{"netns", "exec", s.ns}, s.ctl...), args...)
	out, err := exec.Command("ip", full...).CombinedOutput()
	if err != nil {
		s.t.Fatalf("%s %s: %v\n%s", s.name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (s *speaker) kill() {
	if s.cmd.Process != nil {
		s.cmd.Process.Signal(syscall.SIGKILL)
		s.cmd.Wait()
	}
}

// startGoBGP runs gobgpd in ns, from local to rampart's speaker at peer,
// with both FlowSpec families; gobgp (its CLI) drives it over gRPC.
func startGoBGP(t *testing.T, ns string, local, peer net.IP, as, peerAS int) *speaker {
	dir := t.TempDir()
	api := freePort(t)
	conf := filepath.Join(dir, "gobgpd.toml")
	os.WriteFile(conf, []byte(fmt.Sprintf(`[global.config]
  as = %d
  router-id = "192.0.2.250"
  port = -1
[[neighbors]]
  [neighbors.config]
    neighbor-address = %q
    peer-as = %d
  [neighbors.transport.config]
    local-address = %q
  [neighbors.timers.config]
    connect-retry = 1
    hold-time = 9
    keepalive-interval = 3
  [[neighbors.afi-safis]]
    [neighbors.afi-safis.config]
      afi-safi-name = "ipv4-flowspec"
  [[neighbors.afi-safis]]
    [neighbors.afi-safis.config]
      afi-safi-name = "ipv6-flowspec"
`, as, peer.String(), peerAS, local.String())), 0o644)
	s := &speaker{t: t, ns: ns, log: &logBuffer{}, name: "gobgp",
		ctl: []string{"gobgp", "-u", "127.0.0.1", "-p", fmt.Sprint(api)}}
	s.cmd = exec.Command("ip", "netns", "exec", ns, "gobgpd", "-f", conf, "-p", "--api-hosts", fmt.Sprintf("127.0.0.1:%d", api), "--pprof-disable")
	w := s.log
	s.cmd.Stdout, s.cmd.Stderr = w, w
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.kill)
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if err := exec.Command("ip", append(append([]string{"netns", "exec", ns}, s.ctl...), "global")...).Run(); err == nil {
			return s
		}
		if time.Now().After(end) {
			t.Fatalf("gobgpd did not start:\n%s", s.log)
		}
	}
}

func flowspecShow(t *testing.T, ns string) serve.FlowSpecShow {
	var show serve.FlowSpecShow
	jsonOf(t, &show, "flowspec", "show", "--netns", ns, "--json")
	return show
}

func routeByMatch(s serve.FlowSpecShow, substr string) *serve.FlowSpecRoute {
	for i, r := range s.Routes {
		if strings.Contains(r.Match, substr) {
			return &s.Routes[i]
		}
	}
	return nil
}

// flowspecServe writes a policy with a flowspec section (rampart's speaker
// as AS 65001) of the neighbor given, and the rules, and returns the
// arguments of a service on the pair's B side with its metrics port.
func flowspecServe(t *testing.T, p *testutil.Pair, neighbor, rules string) (args []string, port int) {
	pol := writeFile(t, "policy.yaml", fmt.Sprintf("flowspec:\n  local_as: 65001\n  router_id: 192.0.2.1\n  neighbors: [%s]\nrules: %s\ndefault: pass\n", neighbor, rules))
	port = freePort(t)
	return []string{"--netns", p.NsB, "-f", pol, "--iface", p.IfB, "--listen", fmt.Sprintf("127.0.0.1:%d", port)}, port
}

// startFlowSpecServe starts the service, printing its log if the test
// fails, and detaches the filter after it.
func startFlowSpecServe(t *testing.T, p *testutil.Pair, args []string) (*exec.Cmd, *logBuffer) {
	cmd, _, log := startServe(t, args...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("rampart serve:\n%s", log)
		}
		rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB)
	})
	return cmd, log
}

// TestFlowSpec: FlowSpec routes from gobgpd over a real BGP session become
// rules that real traffic meets: drop, rate limit and withdraw, IPv4 and
// IPv6; a route rampart's data plane cannot match is shown as such and
// changes nothing; a neighbor's max_routes holds with the session up; a
// lost session keeps the routes for the hold time, then they go; a
// restarted service takes the routes again from the neighbor.
func TestFlowSpec(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	args, port := flowspecServe(t, p, fmt.Sprintf("{address: %s, peer_as: 65000, hold_time: 6s, max_routes: 8}", p.A4),
		"[{name: ssh, proto: tcp, dport: 22, action: pass}, {name: blocked, src: 198.51.100.0/24, action: drop}]")
	serveCmd, _ := startFlowSpecServe(t, p, args)
	bgp := startGoBGP(t, p.NsA, p.A4, p.B4, 65000, 65001)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gobgpd:\n%s", bgp.log)
		}
	})
	within(t, "the BGP session up", 20*time.Second, func() bool {
		s := flowspecShow(t, p.NsB)
		return len(s.Neighbors) == 1 && s.Neighbors[0].Up
	})

	rx := map[int]*net.UDPConn{}
	for _, port := range []int{9500, 9501, 9502} {
		rx[port] = testutil.UDPListener(t, p.NsB, p.B4, port)
	}
	rx6 := testutil.UDPListener(t, p.NsB, p.B6, 9503)
	arrive := func(port, n int) int {
		testutil.SendUDP(t, p.NsA, p.B4, port, n)
		return testutil.CountUDP(rx[port], 150*time.Millisecond)
	}
	arrive6 := func(n int) int {
		testutil.SendUDP(t, p.NsA, p.B6, 9503, n)
		return testutil.CountUDP(rx6, 150*time.Millisecond)
	}
	if arrive(9500, 20) != 20 || arrive6(20) != 20 {
		t.Fatal("traffic is dropped before any route")
	}

	// A drop, a rate limit, an IPv6 drop, a DSCP drop (the datagrams are
	// DSCP 0: they pass), and an IPv6 flow label drop.
	bgp.run("global", "rib", "-a", "ipv4-flowspec", "add", "match", "destination", p.B4.String()+"/32", "protocol", "udp", "destination-port", "==9500", "then", "discard")
	bgp.run("global", "rib", "-a", "ipv4-flowspec", "add", "match", "destination", p.B4.String()+"/32", "protocol", "udp", "destination-port", "==9502", "then", "rate-limit", "2000")
	bgp.run("global", "rib", "-a", "ipv6-flowspec", "add", "match", "destination", p.B6.String()+"/128", "protocol", "udp", "destination-port", "==9503", "then", "discard")
	bgp.run("global", "rib", "-a", "ipv4-flowspec", "add", "match", "destination", p.B4.String()+"/32", "dscp", "==10", "then", "discard")
	bgp.run("global", "rib", "-a", "ipv6-flowspec", "add", "match", "destination", p.B6.String()+"/128", "label", "==5", "then", "discard")
	took := within(t, "the IPv4 drop route enforced", 10*time.Second, func() bool { return arrive(9500, 20) == 0 })
	t.Logf("a route announced with gobgp dropped traffic %s later", took.Round(time.Millisecond))
	within(t, "the IPv6 drop route enforced", 10*time.Second, func() bool { return arrive6(20) == 0 })
	if n := arrive(9501, 20); n != 20 {
		t.Errorf("%d of 20 datagrams to a port no route names arrived", n)
	}
	// 2000 bytes/s: of 200 datagrams of 48 bytes at line rate, the burst
	// (10 ms of bytes, at least 1514) and little more pass.
	if n := arrive(9502, 200); n == 0 || n > 60 {
		t.Errorf("%d of 200 datagrams passed the 2000 B/s route", n)
	}
	show := flowspecShow(t, p.NsB)
	drop := routeByMatch(show, "dport =9500")
	limit := routeByMatch(show, "dport =9502")
	dscp := routeByMatch(show, "dscp")
	label := routeByMatch(show, "flow-label")
	switch {
	case drop == nil || drop.State != "installed" || drop.Action != "drop" || drop.Packets < 20:
		t.Errorf("the drop route: %+v", drop)
	case limit == nil || limit.State != "installed" || !strings.HasPrefix(limit.Action, "rate-bytes 2000") || limit.Packets+limit.Over < 200 || limit.Over == 0:
		t.Errorf("the rate route: %+v", limit)
	case dscp == nil || dscp.State != "installed":
		t.Errorf("the DSCP route: %+v", dscp)
	case label == nil || label.State != "installed":
		t.Errorf("the flow label route: %+v", label)
	}
	// Datagrams of flow label 5 meet the label route, of label 6 none.
	rxLabel := testutil.UDPListener(t, p.NsB, p.B6, 9504)
	for fl, want := range map[uint32]int{5: 0, 6: 20} {
		f := packet.Frame{SrcMAC: testutil.MAC(t, p.NsA, p.IfA), DstMAC: testutil.MAC(t, p.NsB, p.IfB), Src: netip.AddrFrom16([16]byte(p.A6.To16())),
			Dst: netip.AddrFrom16([16]byte(p.B6.To16())), FlowLabel: fl, Proto: 17, Sport: 40000, Dport: 9504, Payload: 16}
		frames := make([][]byte, 20)
		for i := range frames {
			frames[i] = f.Bytes()
		}
		testutil.SendRaw(t, p.NsA, p.IfA, frames)
		if n := testutil.CountUDP(rxLabel, 150*time.Millisecond); n != want {
			t.Errorf("flow label %d: %d of 20 datagrams arrived, want %d", fl, n, want)
		}
	}
	text := scrape(t, port)
	if v := metric(t, text, "rampart_flowspec_packets_total", `action="drop",route="`+drop.Name+`"`); v < 20 {
		t.Errorf("rampart_flowspec_packets_total of the drop route: %v\n%s", v, text)
	}
	if v := metric(t, text, "rampart_flowspec_routes", `state="installed"`); v != 5 {
		t.Errorf("routes installed: %v, want 5", v)
	}
	if v := metric(t, text, "rampart_flowspec_session_up", `neighbor="`+p.A4.String()+`"`); v != 1 {
		t.Errorf("session metric: %v", v)
	}
	// The routes sit between the local pass rules and the local drops.
	stats := mustRampart(t, "stats", "--netns", p.NsB)
	if i, j, k := strings.Index(stats, "ssh"), strings.Index(stats, drop.Name), strings.Index(stats, "blocked"); !(i < j && j < k) {
		t.Errorf("the routes' rules are not between the pass and drop rules:\n%s", stats)
	}

	// Withdrawn: traffic passes again.
	bgp.run("global", "rib", "-a", "ipv4-flowspec", "del", "match", "destination", p.B4.String()+"/32", "protocol", "udp", "destination-port", "==9500")
	within(t, "the withdrawn route lifted", 10*time.Second, func() bool { return arrive(9500, 20) == 20 })

	// max_routes 8: of 10 more routes, the neighbor's count stops at 8,
	// the rest are refused and counted, and wait; the session stays up.
	for i := range 10 {
		bgp.run("global", "rib", "-a", "ipv4-flowspec", "add", "match", "destination", fmt.Sprintf("203.0.113.%d/32", i), "then", "discard")
	}
	var capped serve.FlowSpecShow
	held := map[string]bool{}
	within(t, "the route cap held", 10*time.Second, func() bool {
		capped = flowspecShow(t, p.NsB)
		clear(held)
		for _, r := range capped.Routes {
			if strings.Contains(r.Match, "203.0.113.") && r.State == "installed" {
				held[r.Match] = true
			}
		}
		n := capped.Neighbors[0]
		return n.Routes == 8 && len(held)+n.Waiting == 10 && n.Waiting >= 5 && capped.Refused["max-routes"] >= 5 && n.Up
	})
	// A held route withdrawn makes room: the first waiting one is taken
	// and installed.
	var gone string
	for i := range 10 {
		if gone == "" && routeByMatch(capped, fmt.Sprintf("203.0.113.%d/32", i)) != nil {
			gone = fmt.Sprintf("203.0.113.%d/32", i)
		}
	}
	if gone == "" {
		t.Fatalf("none of the 10 routes held at the cap: %+v", capped.Routes)
	}
	bgp.run("global", "rib", "-a", "ipv4-flowspec", "del", "match", "destination", gone)
	within(t, "a waiting route taken when a held one was withdrawn", 10*time.Second, func() bool {
		s := flowspecShow(t, p.NsB)
		taken := 0
		for _, r := range s.Routes {
			if strings.Contains(r.Match, "203.0.113.") && r.State == "installed" && !held[r.Match] {
				taken++
			}
		}
		return s.Neighbors[0].Routes == 8 && s.Neighbors[0].Waiting == capped.Neighbors[0].Waiting-1 && taken == 1
	})
	for i := range 10 {
		bgp.run("global", "rib", "-a", "ipv4-flowspec", "del", "match", "destination", fmt.Sprintf("203.0.113.%d/32", i))
	}
	bgp.run("global", "rib", "-a", "ipv4-flowspec", "add", "match", "destination", p.B4.String()+"/32", "protocol", "udp", "destination-port", "==9500", "then", "discard")
	within(t, "the drop route enforced again", 10*time.Second, func() bool { return arrive(9500, 20) == 0 })

	// The session lost: the routes stay for the hold time (6 s), then go.
	bgp.kill()
	lost := time.Now()
	within(t, "the session seen lost", 15*time.Second, func() bool { return !flowspecShow(t, p.NsB).Neighbors[0].Up })
	if arrive(9500, 20) != 0 && time.Since(lost) < 5*time.Second {
		t.Errorf("the route went %s after the session was lost, before its hold time", time.Since(lost).Round(time.Millisecond))
	}
	within(t, "the routes removed after the hold time", 20*time.Second, func() bool { return arrive(9500, 20) == 20 })
	t.Logf("routes of the lost session removed %s after it was lost (hold time 6 s; the session is seen lost after its own hold timer)", time.Since(lost).Round(time.Millisecond))

	// A restarted service starts clean and takes the routes again.
	bgp = startGoBGP(t, p.NsA, p.A4, p.B4, 65000, 65001)
	bgp.run("global", "rib", "-a", "ipv4-flowspec", "add", "match", "destination", p.B4.String()+"/32", "protocol", "udp", "destination-port", "==9500", "then", "discard")
	within(t, "the route of the new session enforced", 20*time.Second, func() bool { return arrive(9500, 20) == 0 })
	serveCmd.Process.Signal(syscall.SIGTERM)
	serveCmd.Wait()
	_, _, log2 := startServe(t, args...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("rampart serve, restarted:\n%s", log2)
		}
	})
	within(t, "the route taken again by the restarted service", 30*time.Second, func() bool {
		r := routeByMatch(flowspecShow(t, p.NsB), "dport =9500")
		return r != nil && r.State == "installed" && arrive(9500, 20) == 0
	})
}

// startBird runs BIRD 2 in ns with the flow routes given (its static
// protocol syntax), exported over one session from local to rampart at
// peer; birdc drives it.
func startBird(t *testing.T, ns string, local, peer net.IP, routes4, routes6 string) *speaker {
	dir := t.TempDir()
	sock := filepath.Join(dir, "bird.ctl")
	conf := filepath.Join(dir, "bird.conf")
	os.WriteFile(conf, []byte(fmt.Sprintf(`router id 192.0.2.251;
protocol device {}
flow4 table ft4;
flow6 table ft6;
protocol static fs4 {
  flow4 { table ft4; };
%s
}
protocol static fs6 {
  flow6 { table ft6; };
%s
}
protocol bgp rampart {
  local %s as 65002;
  neighbor %s port 179 as 65001;
  connect retry time 1;
  flow4 { table ft4; import none; export all; };
  flow6 { table ft6; import none; export all; };
}
`, routes4, routes6, local, peer)), 0o644)
	s := &speaker{t: t, ns: ns, log: &logBuffer{}, name: "birdc", ctl: []string{"birdc", "-s", sock}}
	s.cmd = exec.Command("ip", "netns", "exec", ns, "bird", "-f", "-c", conf, "-s", sock, "-P", filepath.Join(dir, "bird.pid"))
	w := s.log
	s.cmd.Stdout, s.cmd.Stderr = w, w
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.kill)
	return s
}

// TestFlowSpecBird: BIRD announces IPv4 and IPv6 flow routes over an IPv6
// session, with their actions as extended communities: a traffic-rate of
// 0 drops, a redirect is shown as not applicable on a host, a route
// without an action passes what it matches before the local drops.
func TestFlowSpecBird(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	args, _ := flowspecServe(t, p, fmt.Sprintf(`{address: "%s", peer_as: 65002}`, p.A6), "[{name: closed, proto: udp, dport: 9610, action: drop}]")
	startFlowSpecServe(t, p, args)
	// Extended communities given raw, as BIRD's (generic, high, low):
	// traffic-rate 0 is type 0x80 subtype 0x06, AS 0, rate 0.0; a
	// redirect to route target 65000:1 is 0x80 0x08, 0xfde8, 1.
	bird := startBird(t, p.NsA, p.A6, p.B6,
		fmt.Sprintf(`  route flow4 { dst %s/32; proto = 17; dport = 9600; } { bgp_ext_community.add((generic, 0x80060000, 0)); };
  route flow4 { dst %s/32; proto = 17; dport = 9602; } { bgp_ext_community.add((generic, 0x8008fde8, 1)); };
  route flow4 { dst %s/32; proto = 17; dport = 9610; };`, p.B4, p.B4, p.B4),
		fmt.Sprintf(`  route flow6 { dst %s/128; next header = 17; dport = 9601; } { bgp_ext_community.add((generic, 0x80060000, 0)); };`, p.B6))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bird:\n%s\n%s", bird.log, bird.run("show", "protocols", "all", "rampart"))
		}
	})
	rx := map[int]*net.UDPConn{}
	for _, port := range []int{9600, 9602, 9610} {
		rx[port] = testutil.UDPListener(t, p.NsB, p.B4, port)
	}
	rx6 := testutil.UDPListener(t, p.NsB, p.B6, 9601)
	arrive := func(port, n int) int {
		testutil.SendUDP(t, p.NsA, p.B4, port, n)
		return testutil.CountUDP(rx[port], 150*time.Millisecond)
	}
	within(t, "BIRD's IPv4 drop route enforced", 30*time.Second, func() bool { return arrive(9600, 20) == 0 })
	within(t, "BIRD's IPv6 drop route enforced", 10*time.Second, func() bool {
		testutil.SendUDP(t, p.NsA, p.B6, 9601, 20)
		return testutil.CountUDP(rx6, 150*time.Millisecond) == 0
	})
	if n := arrive(9602, 20); n != 20 {
		t.Errorf("%d of 20 datagrams matched by a redirect route arrived: a host cannot redirect, and passes them", n)
	}
	// The route without an action sits before the local drop of 9610.
	if n := arrive(9610, 20); n != 20 {
		t.Errorf("%d of 20 datagrams an accept route matches arrived past the local drop after it", n)
	}
	show := flowspecShow(t, p.NsB)
	if r := routeByMatch(show, "dport =9602"); r == nil || r.State != "installed" || r.Action != "accept" || len(r.NotHere) != 1 || r.NotHere[0] != "redirect" {
		t.Errorf("the redirect route: %+v", r)
	}
	if r := routeByMatch(show, "dport =9601"); r == nil || r.Family != "ipv6" || r.Action != "drop" || r.Packets < 20 {
		t.Errorf("the IPv6 route: %+v", r)
	}
	text := mustRampart(t, "flowspec", "show", "--netns", p.NsB)
	for _, want := range []string{p.A6.String(), "up", "not on a host: redirect", "dport =9600"} {
		if !strings.Contains(text, want) {
			t.Errorf("flowspec show lacks %q:\n%s", want, text)
		}
	}
	// The IPv4 routes' protocol disabled in BIRD: they are withdrawn, and
	// traffic passes.
	bird.run("disable", "fs4")
	within(t, "the withdrawn routes lifted", 10*time.Second, func() bool { return arrive(9600, 20) == 20 })
}

// rawPeer is a BGP speaker of the test's own, over a real TCP session:
// what it sends (malformed NLRI) no daemon would.
type rawPeer struct {
	t     *testing.T
	c     net.Conn
	notes chan []byte // NOTIFICATIONs received
}

func bgpMessage(typ byte, body []byte) []byte {
	m := append(bytes.Repeat([]byte{0xff}, 16), 0, 0, typ)
	binary.BigEndian.PutUint16(m[16:], uint16(19+len(body)))
	return append(m, body...)
}

// dialRawPeer opens a session as AS as from ns to addr:179 with both
// FlowSpec families, and keeps it alive.
func dialRawPeer(t *testing.T, ns string, addr net.IP, as uint32) *rawPeer {
	c, err := testutil.DialTCP(ns, addr, 179, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	caps := []byte{1, 4, 0, 1, 0, 133, 1, 4, 0, 2, 0, 133, 65, 4, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(caps[14:], as)
	open := []byte{4, 0, 0, 0, 30, 192, 0, 2, 9, byte(2 + len(caps)), 2, byte(len(caps))}
	binary.BigEndian.PutUint16(open[1:], uint16(as))
	open = append(open, caps...)
	p := &rawPeer{t: t, c: c, notes: make(chan []byte, 4)}
	p.send(bgpMessage(1, open))
	p.send(bgpMessage(4, nil))
	go func() {
		hdr := make([]byte, 19)
		for {
			if _, err := io.ReadFull(c, hdr); err != nil {
				return
			}
			body := make([]byte, int(binary.BigEndian.Uint16(hdr[16:]))-19)
			if _, err := io.ReadFull(c, body); err != nil {
				return
			}
			switch hdr[18] {
			case 3:
				p.notes <- body
			case 4:
				p.send(bgpMessage(4, nil))
			}
		}
	}()
	return p
}

func (p *rawPeer) send(m []byte) {
	if _, err := p.c.Write(m); err != nil {
		p.t.Errorf("BGP session: %v", err)
	}
}

// announce sends one UPDATE of an IPv4 FlowSpec NLRI (bytes as given,
// length included) with traffic-rate 0.
func (p *rawPeer) announce(as uint32, nlri []byte) {
	mp := append([]byte{0, 1, 133, 0, 0}, nlri...)
	attrs := []byte{0x40, 1, 1, 0, 0x40, 2, 6, 2, 1, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(attrs[9:], as)
	attrs = append(attrs, 0x80, 14, byte(len(mp)))
	attrs = append(attrs, mp...)
	attrs = append(attrs, 0xc0, 16, 8, 0x80, 0x06, 0, 0, 0, 0, 0, 0)
	body := append([]byte{0, 0, 0, 0}, attrs...)
	binary.BigEndian.PutUint16(body[2:], uint16(len(attrs)))
	p.send(bgpMessage(2, body))
}

// TestFlowSpecMalformed: a service whose speaker cannot listen does not
// start; NLRI that GoBGP passes on but that cannot be read (an unknown
// component type, a value cut short) are counted and ignored; the session
// stays up and the neighbor's next route is enforced.
func TestFlowSpecMalformed(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	args, port := flowspecServe(t, p, fmt.Sprintf("{address: %s, peer_as: 65000}", p.A4), "[]")
	// A speaker whose address is in use at the service's start: the
	// service refuses to start and nothing changes on the host.
	var busy net.Listener
	if err := netns.Run(p.NsB, func() (err error) { busy, err = net.Listen("tcp", "[::]:179"); return err }); err != nil {
		t.Fatal(err)
	}
	if log := serveRefused(t, args...); !strings.Contains(log, "flowspec: start the BGP speaker on [::]:179") {
		t.Errorf("the refusal does not say why:\n%s", log)
	}
	noHooks(t, p.NsB, "a speaker that cannot listen")
	busy.Close()
	startFlowSpecServe(t, p, args)
	peer := dialRawPeer(t, p.NsA, p.B4, 65000)
	within(t, "the raw session up", 10*time.Second, func() bool { return flowspecShow(t, p.NsB).Neighbors[0].Up })
	rx := testutil.UDPListener(t, p.NsB, p.B4, 9700)
	rx2 := testutil.UDPListener(t, p.NsB, p.B4, 9701)
	arrive := func(rx *net.UDPConn, port int) int {
		testutil.SendUDP(t, p.NsA, p.B4, port, 20)
		return testutil.CountUDP(rx, 150*time.Millisecond)
	}
	dst := append([]byte{1, 32}, p.B4.To4()...)
	route := func(port int) []byte {
		body := append(slices.Clone(dst), 3, 0x81, 17, 5, 0x91, byte(port>>8), byte(port))
		return append([]byte{byte(len(body))}, body...)
	}
	peer.announce(65000, route(9700))
	within(t, "the first route enforced", 10*time.Second, func() bool { return arrive(rx, 9700) == 0 })
	for _, body := range [][]byte{
		append(slices.Clone(dst), 0x20, 0x81, 1),    // component type 32
		append(slices.Clone(dst), 3, 0xa1, 17),      // a 4-byte value, 1 byte there
		append(slices.Clone(dst), 3, 0x01, 6, 0x01), // the operator list never ends
	} {
		peer.announce(65000, append([]byte{byte(len(body))}, body...))
	}
	peer.announce(65000, route(9701))
	within(t, "the route after the malformed ones enforced", 10*time.Second, func() bool { return arrive(rx2, 9701) == 0 })
	if text := scrape(t, port); !strings.Contains(text, "\nrampart_flowspec_malformed_total 3\n") {
		t.Errorf("the three malformed routes are not counted:\n%s", text)
	}
	select {
	case n := <-peer.notes:
		t.Fatalf("the session was reset: NOTIFICATION %x", n)
	default:
	}
	s := flowspecShow(t, p.NsB)
	if !s.Neighbors[0].Up || s.Malformed != 3 || len(s.Routes) != 2 {
		t.Errorf("after the malformed routes: %+v", s)
	}
	if arrive(rx, 9700) != 0 {
		t.Error("the first route no longer holds")
	}
}

// histogram reads a Prometheus histogram of a scrape: the count, and the
// count of observations at most each bound.
func histogram(t *testing.T, text, name string) (count float64, le map[string]float64) {
	le = map[string]float64{}
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, name+"_count "):
			count, _ = strconv.ParseFloat(strings.TrimPrefix(line, name+"_count "), 64)
		case strings.HasPrefix(line, name+`_bucket{le="`):
			rest := strings.TrimPrefix(line, name+`_bucket{le="`)
			bound, v, _ := strings.Cut(rest, `"} `)
			le[bound], _ = strconv.ParseFloat(v, 64)
		}
	}
	return count, le
}

// TestFlowSpecScale: BIRD announces 10,000 routes in one UPDATE stream,
// then withdraws them all. Half the routes name ports of the host, half a
// victim address each (5,000 distinct prefixes). Each route's time from its
// arrival to the kernel enforcing it is rampart_flowspec_apply_seconds; the
// test logs its buckets (the benchmark: go test -run TestFlowSpecScale -v
// ./internal/cli).
func TestFlowSpecScale(t *testing.T) {
	testutil.Privileged(t)
	const n = 10_000
	p := testutil.NewPair(t)
	args, port := flowspecServe(t, p, fmt.Sprintf("{address: %s, peer_as: 65002, max_routes: %d}", p.A4, n), "[]")
	_, log := startFlowSpecServe(t, p, args)
	var routes strings.Builder
	for i := range n {
		dst := p.B4.String() // the last route's: the one traffic checks
		if i%2 == 0 {
			dst = fmt.Sprintf("198.18.%d.%d", i>>8, i&0xff)
		}
		fmt.Fprintf(&routes, "  route flow4 { dst %s/32; proto = 17; dport = %d; } { bgp_ext_community.add((generic, 0x80060000, 0)); };\n", dst, 20000+i)
	}
	start := time.Now()
	bird := startBird(t, p.NsA, p.A4, p.B4, routes.String(), "")
	installed := func() int {
		c := 0
		for _, r := range flowspecShow(t, p.NsB).Routes {
			if r.State == "installed" {
				c++
			}
		}
		return c
	}
	within(t, "10,000 routes installed", 120*time.Second, func() bool { return installed() == n })
	t.Logf("10,000 routes installed %s after BIRD started", time.Since(start).Round(time.Millisecond))
	rx := testutil.UDPListener(t, p.NsB, p.B4, 20000+n-1)
	testutil.SendUDP(t, p.NsA, p.B4, 20000+n-1, 20)
	if got := testutil.CountUDP(rx, 150*time.Millisecond); got != 0 {
		t.Errorf("%d of 20 datagrams to the last route's port arrived", got)
	}
	report := func(what string, changes float64) {
		var count float64
		var le map[string]float64
		within(t, "every change observed", 10*time.Second, func() bool {
			count, le = histogram(t, scrape(t, port), "rampart_flowspec_apply_seconds")
			return count == changes
		})
		var b strings.Builder
		for _, bound := range []string{"0.1", "0.25", "0.5", "1", "2.5", "5", "10"} {
			fmt.Fprintf(&b, " ≤%ss %.1f%%", bound, 100*le[bound]/count)
		}
		t.Logf("%s: %.0f route changes, arrival to enforced:%s", what, count, b.String())
	}
	report("announced", n)
	start = time.Now()
	bird.run("disable", "fs4")
	within(t, "10,000 routes withdrawn", 120*time.Second, func() bool { return len(flowspecShow(t, p.NsB).Routes) == 0 })
	t.Logf("10,000 routes withdrawn %s after birdc disable", time.Since(start).Round(time.Millisecond))
	report("announced and withdrawn", 2*n)
	for _, line := range strings.Split(log.String(), "\n") {
		if strings.Contains(line, "why=flowspec") {
			t.Log(line[strings.Index(line, "msg="):])
		}
	}
}

// TestFlowSpecInterfaces: with flowspec.interfaces, the routes filter the
// interfaces named and no other; the local rules filter every interface.
func TestFlowSpecInterfaces(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	// A second link between the namespaces, which the service filters
	// without the routes.
	const ifA, ifB = "fsi-a", "fsi-b"
	a2, b2 := net.IPv4(10, 99, 0, 1), net.IPv4(10, 99, 0, 2)
	testutil.Run(t, "ip", "-n", p.NsA, "link", "add", ifA, "type", "veth", "peer", "name", ifB, "netns", p.NsB)
	testutil.Run(t, "ip", "-n", p.NsA, "addr", "add", a2.String()+"/30", "dev", ifA)
	testutil.Run(t, "ip", "-n", p.NsB, "addr", "add", b2.String()+"/30", "dev", ifB)
	testutil.Run(t, "ip", "-n", p.NsA, "link", "set", ifA, "up")
	testutil.Run(t, "ip", "-n", p.NsB, "link", "set", ifB, "up")
	testutil.WaitLinks(t, p.NsA, ifA)
	testutil.WaitLinks(t, p.NsB, ifB)

	pol := writeFile(t, "policy.yaml", fmt.Sprintf(`flowspec:
  local_as: 65001
  router_id: 192.0.2.1
  neighbors: [{address: %s, peer_as: 65000}]
  interfaces: [%s]
rules:
  - {name: local, proto: udp, dport: 9601, action: drop}
default: pass
`, p.A4, p.IfB))
	args := []string{"--netns", p.NsB, "-f", pol, "--iface", p.IfB, "--iface", ifB}
	_, _, log := startServe(t, args...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("rampart serve:\n%s", log)
		}
		rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB, "--iface", ifB)
	})
	bgp := startGoBGP(t, p.NsA, p.A4, p.B4, 65000, 65001)
	within(t, "the BGP session up", 20*time.Second, func() bool {
		s := flowspecShow(t, p.NsB)
		return len(s.Neighbors) == 1 && s.Neighbors[0].Up
	})
	arrive := func(to net.IP, port int) int {
		rx := testutil.UDPListener(t, p.NsB, to, port)
		defer rx.Close()
		testutil.SendUDP(t, p.NsA, to, port, 20)
		return testutil.CountUDP(rx, 150*time.Millisecond)
	}
	bgp.run("global", "rib", "-a", "ipv4-flowspec", "add", "match", "destination", "0.0.0.0/0", "protocol", "udp", "destination-port", "==9600", "then", "discard")
	within(t, "the route enforced on "+p.IfB, 10*time.Second, func() bool { return arrive(p.B4, 9600) == 0 })
	if n := arrive(b2, 9600); n != 20 {
		t.Errorf("%d of 20 datagrams over %s, which the routes do not filter, arrived", n, ifB)
	}
	for _, to := range []net.IP{p.B4, b2} {
		if n := arrive(to, 9601); n != 0 {
			t.Errorf("%d of 20 datagrams to %s met the local drop rule and arrived", n, to)
		}
	}
	// The route's rule is in the one interface's policy, the local one in both.
	r := routeByMatch(flowspecShow(t, p.NsB), "dport =9600")
	if r == nil {
		t.Fatal("the route is not shown")
	}
	var snap stats.Snapshot
	jsonOf(t, &snap, "stats", "--netns", p.NsB)
	has := map[string]map[string]bool{p.IfB: {}, ifB: {}}
	for _, row := range snap.Rows {
		if has[row.Iface] != nil {
			has[row.Iface][row.Name] = true
		}
	}
	if !has[p.IfB][r.Name] || has[ifB][r.Name] || !has[p.IfB]["local"] || !has[ifB]["local"] {
		t.Errorf("rules by interface: %v (the route's rule is %s)", has, r.Name)
	}
}

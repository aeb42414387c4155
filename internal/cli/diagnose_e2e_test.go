package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rampart-fw/rampart/internal/cli"
	"github.com/rampart-fw/rampart/internal/diagnose"
	"github.com/rampart-fw/rampart/internal/lab"
	"github.com/rampart-fw/rampart/internal/netns"
	"github.com/rampart-fw/rampart/internal/packet"
	"github.com/rampart-fw/rampart/internal/testutil"
)

// Each test makes the kernel really drop, in namespaces over veth, runs
// `rampart diagnose --json` during the drops, and checks the finding, its
// counters and their rates.

// diagnoseDuring runs load until diagnose, started once load has run a
// moment, has sampled its window.
func diagnoseDuring(t *testing.T, ns string, load func(ctx context.Context), args ...string) *diagnose.Report {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); load(ctx) }()
	time.Sleep(300 * time.Millisecond)
	var r diagnose.Report
	jsonOf(t, &r, append([]string{"--netns", ns, "diagnose", "--duration", "1s"}, args...)...)
	cancel()
	wg.Wait()
	if !r.Tracing.Enabled {
		t.Fatalf("drop reasons were not traced: %s", r.Tracing.Error)
	}
	return &r
}

// finding returns the finding with this id, failing the test without it.
func finding(t *testing.T, r *diagnose.Report, id string) diagnose.Finding {
	t.Helper()
	var ids []string
	for _, f := range r.Findings {
		if f.ID == id {
			if f.Summary == "" || f.Fix == "" || len(f.Evidence) == 0 {
				t.Errorf("finding %s is incomplete: %+v", id, f)
			}
			return f
		}
		ids = append(ids, f.ID)
	}
	t.Fatalf("no finding %s; findings %v; moving counters %v; drop reasons %+v", id, ids, r.Counters, r.DropReasons)
	return diagnose.Finding{}
}

// noFinding fails the test when a finding with this id is reported.
func noFinding(t *testing.T, r *diagnose.Report, id string) {
	t.Helper()
	for _, f := range r.Findings {
		if f.ID == id {
			t.Errorf("unexpected finding %s: %s", id, f.Summary)
		}
	}
}

// moving asserts that the finding's evidence has this counter (a prefix
// ending in "/" matches any name under it) with a non-zero rate.
func moving(t *testing.T, f diagnose.Finding, name string) diagnose.Evidence {
	t.Helper()
	for _, e := range f.Evidence {
		if (e.Name == name || strings.HasSuffix(name, "/") && strings.HasPrefix(e.Name, name)) && e.Rate > 0 && e.Value > 0 {
			return e
		}
	}
	t.Fatalf("finding %s: no moving %s in evidence %+v", f.ID, name, f.Evidence)
	return diagnose.Evidence{}
}

// flood sends UDP datagrams from ns to ip:port until ctx ends, from
// sockets bound to sources distinct source ports. Send errors are ignored
// (they are what some tests provoke).
func flood(t *testing.T, ns string, ip net.IP, port, sources int) func(ctx context.Context) {
	conns := make([]net.Conn, sources)
	for i := range conns {
		conns[i] = testutil.Socket(t, ns, func() (net.Conn, error) { return net.DialUDP("udp", nil, &net.UDPAddr{IP: ip, Port: port}) })
	}
	payload := make([]byte, 64)
	return func(ctx context.Context) {
		for ctx.Err() == nil {
			for _, c := range conns {
				c.Write(payload)
			}
		}
	}
}

func TestDiagnoseQuiet(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	r := diagnoseDuring(t, p.NsB, func(context.Context) {})
	if len(r.Findings) != 0 {
		t.Fatalf("a quiet namespace has findings: %+v", r.Findings)
	}
	if r.Window < 0.9 || r.Window > 5 { // plus the time to read the counters
		t.Errorf("window %.2f s for --duration 1s", r.Window)
	}
}

func TestDiagnoseUDPRcvbuf(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	// A listener with the smallest receive buffer that never reads.
	l := testutil.UDPListener(t, p.NsB, p.B4, 7001)
	if err := l.SetReadBuffer(1); err != nil {
		t.Fatal(err)
	}
	r := diagnoseDuring(t, p.NsB, flood(t, p.NsA, p.B4, 7001, 1))
	f := finding(t, r, "udp-rcvbuf")
	moving(t, f, "UdpRcvbufErrors")
	reason := moving(t, f, "drop_reason/SOCKET_RCVBUFF")
	if !strings.Contains(reason.Detail, p.IfB) || !strings.Contains(reason.Detail, "ipv4/udp") {
		t.Errorf("drop reason detail %q: want the interface and ipv4/udp", reason.Detail)
	}
	if !strings.Contains(strings.Join(f.Commands, "\n"), "net.core.rmem_max") {
		t.Errorf("fix commands %q do not raise rmem_max", f.Commands)
	}
	noFinding(t, r, "no-listener")
}

// TestDiagnoseUDPSndbufQdisc is the incident of the blog post "UDP SndbufErrors & ENOBUFS": UDP sends fail
// with ENOBUFS and UdpSndbufErrors climbs with IpOutDiscards, because the
// egress qdisc (here a tbf with a small limit) is full.
func TestDiagnoseUDPSndbufQdisc(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	testutil.Run(t, "tc", "-n", p.NsA, "qdisc", "add", "dev", p.IfA, "root", "handle", "10:", "tbf", "rate", "1mbit", "burst", "4k", "limit", "6000")
	c := testutil.Socket(t, p.NsA, func() (net.Conn, error) { return net.DialUDP("udp", nil, &net.UDPAddr{IP: p.B4, Port: 7002}) })
	raw, err := c.(*net.UDPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	// Without IP_RECVERR the kernel counts the error and hides it.
	raw.Control(func(fd uintptr) {
		if err := syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_RECVERR, 1); err != nil {
			t.Fatal(err)
		}
	})
	var enobufs atomic.Int64
	payload := make([]byte, 1000)
	r := diagnoseDuring(t, p.NsA, func(ctx context.Context) {
		for ctx.Err() == nil {
			if _, err := c.Write(payload); errors.Is(err, syscall.ENOBUFS) {
				enobufs.Add(1)
			}
		}
	})
	if enobufs.Load() == 0 {
		t.Fatal("no send returned ENOBUFS")
	}
	f := finding(t, r, "udp-sndbuf-qdisc")
	moving(t, f, "UdpSndbufErrors")
	moving(t, f, "IpOutDiscards")
	moving(t, f, "qdisc/"+p.IfA+"/10:/drops")
	moving(t, f, "drop_reason/QDISC_DROP")
	want := fmt.Sprintf("tc qdisc change dev %s root tbf limit", p.IfA)
	if len(f.Commands) == 0 || !strings.HasPrefix(f.Commands[0], want) {
		t.Errorf("fix %q, want %q…", f.Commands, want)
	}
	if !strings.Contains(f.Summary, "at its limit of 6000 bytes") {
		t.Errorf("summary %q does not quote the qdisc's limit", f.Summary)
	}
	noFinding(t, r, "qdisc-drops")
	noFinding(t, r, "udp-sndbuf")
}

// TestDiagnoseQdiscDrops: a qdisc dropping frames no UDP socket sent (a
// packet socket's), so no SndbufErrors: the plain qdisc-drops finding.
func TestDiagnoseQdiscDrops(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	// A fifo never fills on veth, which transmits at once; tbf holds
	// packets back to its rate.
	testutil.Run(t, "tc", "-n", p.NsA, "qdisc", "add", "dev", p.IfA, "root", "handle", "20:", "tbf", "rate", "1mbit", "burst", "2k", "limit", "3000")
	var fd int
	var ifindex int
	if err := netns.Run(p.NsA, func() (err error) {
		i, err := net.InterfaceByName(p.IfA)
		if err != nil {
			return err
		}
		ifindex = i.Index
		fd, err = syscall.Socket(syscall.AF_PACKET, syscall.SOCK_RAW|syscall.SOCK_NONBLOCK, 0)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	frame := packet.Frame{Src: netip.MustParseAddr(p.A4.String()), Dst: netip.MustParseAddr(p.B4.String()),
		Proto: syscall.IPPROTO_UDP, Sport: 1, Dport: 7003, Payload: 500}.Bytes()
	to := &syscall.SockaddrLinklayer{Ifindex: ifindex, Protocol: 0x0008}
	send := func(ctx context.Context) {
		for ctx.Err() == nil {
			syscall.Sendto(fd, frame, 0, to)
		}
	}
	r := diagnoseDuring(t, p.NsA, send)
	f := finding(t, r, "qdisc-drops")
	moving(t, f, "qdisc/"+p.IfA+"/20:/drops")
	moving(t, f, "drop_reason/QDISC_DROP")
	if !strings.Contains(f.Summary, "tbf 20: on "+p.IfA) {
		t.Errorf("summary %q does not name the qdisc", f.Summary)
	}
	noFinding(t, r, "udp-sndbuf-qdisc")

	// --iface keeps one interface's link, qdisc and driver counters.
	r = diagnoseDuring(t, p.NsA, send, "--iface", "lo")
	noFinding(t, r, "qdisc-drops")
	for _, c := range r.Counters {
		if strings.Contains(c.Name, p.IfA) {
			t.Errorf("--iface lo shows %s", c.Name)
		}
	}
}

// TestDiagnoseConntrackFull fills the conntrack table with a flood of new
// flows. nf_conntrack_max is host-wide (read-only in a namespace), so the
// test lowers it for its duration; each namespace counts its own entries
// against it.
func TestDiagnoseConntrackFull(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	iptables := iptablesBinary(t)
	// A conntrack match makes the namespace track its connections.
	testutil.Run(t, "ip", "netns", "exec", p.NsB, iptables, "-A", "INPUT", "-m", "conntrack", "--ctstate", "NEW", "-j", "ACCEPT")
	setSysctl(t, "net/netfilter/nf_conntrack_max", "64")
	l := testutil.UDPListener(t, p.NsB, p.B4, 7004)
	go testutil.CountUDP(l, 5*time.Second)
	r := diagnoseDuring(t, p.NsB, flood(t, p.NsA, p.B4, 7004, 300))
	f := finding(t, r, "conntrack-full")
	moving(t, f, "conntrack/drop")
	moving(t, f, "drop_reason/NETFILTER_DROP")
	if !strings.Contains(f.Summary, "of 64 entries") {
		t.Errorf("summary %q does not quote the table's size", f.Summary)
	}
	if !strings.Contains(strings.Join(f.Commands, "\n"), "--notrack") {
		t.Errorf("fix %q does not exempt the service from tracking", f.Commands)
	}
	noFinding(t, r, "netfilter-drop")
}

func TestDiagnoseNetfilterDrop(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	iptables := iptablesBinary(t)
	testutil.Run(t, "ip", "netns", "exec", p.NsB, iptables, "-A", "INPUT", "-p", "udp", "--dport", "7005", "-j", "DROP")
	r := diagnoseDuring(t, p.NsB, flood(t, p.NsA, p.B4, 7005, 1))
	f := finding(t, r, "netfilter-drop")
	rule := moving(t, f, iptables+"/filter/INPUT/1")
	if !strings.Contains(rule.Detail, "--dport 7005 -j DROP") {
		t.Errorf("rule evidence %q does not quote the rule", rule.Detail)
	}
	reason := moving(t, f, "drop_reason/NETFILTER_DROP")
	if !strings.HasPrefix(reason.Detail, "nf_hook_slow+") {
		t.Errorf("NETFILTER_DROP at %q, want nf_hook_slow", reason.Detail)
	}
	if !strings.Contains(f.Summary, "table filter chain INPUT") {
		t.Errorf("summary %q does not name the table and chain", f.Summary)
	}
	noFinding(t, r, "no-listener")
}

func TestDiagnoseNoListener(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	r := diagnoseDuring(t, p.NsB, flood(t, p.NsA, p.B4, 7006, 1))
	f := finding(t, r, "no-listener")
	moving(t, f, "UdpNoPorts")
	moving(t, f, "drop_reason/NO_SOCKET")
}

// TestDiagnoseListenOverflow: a listener with a backlog of 1 that never
// accepts, and a stream of connection attempts.
func TestDiagnoseListenOverflow(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	var fd int
	if err := netns.Run(p.NsB, func() (err error) {
		if fd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0); err != nil {
			return err
		}
		if err = syscall.Bind(fd, &syscall.SockaddrInet4{Port: 7007, Addr: [4]byte(p.B4.To4())}); err != nil {
			return err
		}
		return syscall.Listen(fd, 1)
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	r := diagnoseDuring(t, p.NsB, func(ctx context.Context) {
		var wg sync.WaitGroup
		for i := 0; i < 16; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					if c, err := testutil.DialTCP(p.NsA, p.B4, 7007, 200*time.Millisecond); err == nil {
						defer c.Close() // held open: the accept queue stays full
					}
				}
			}()
		}
		wg.Wait()
	})
	f := finding(t, r, "listen-overflow")
	moving(t, f, "TcpExtListenOverflows")
	moving(t, f, "TcpExtListenDrops")
}

func TestDiagnoseXDPDrop(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	pol := writeFile(t, "drop.yaml", "rules:\n  - {name: flood, proto: udp, dport: 7008, action: drop}\ndefault: pass\n")
	mustRampart(t, "apply", "-f", pol, "--netns", p.NsB, "--iface", p.IfB)
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })
	r := diagnoseDuring(t, p.NsB, flood(t, p.NsA, p.B4, 7008, 1))
	f := finding(t, r, "xdp-drop")
	e := moving(t, f, "rampart/"+p.IfB+"/ingress/flood")
	if !strings.Contains(e.Detail, "xdp") {
		t.Errorf("evidence %q does not say the rule runs at XDP", e.Detail)
	}
	moving(t, f, "ethtool/"+p.IfB+"/rx_queue_0_xdp_drops") // the driver's own count
	noFinding(t, r, "no-listener")
}

// TestDiagnoseBacklogDrops steers the receive side to the other CPU's
// backlog (RPS) and lowers netdev_max_backlog (host-wide) to one packet.
func TestDiagnoseBacklogDrops(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	rps(t, p.NsB, p.IfB)
	setSysctl(t, "net/core/netdev_max_backlog", "1")
	r := diagnoseDuring(t, p.NsB, flood(t, p.NsA, p.B4, 7009, 16))
	f := finding(t, r, "backlog-drops")
	moving(t, f, "softnet/")
	moving(t, f, "drop_reason/CPU_BACKLOG")
	noFinding(t, r, "rx-ring") // the device's rx_dropped is explained by the backlog
}

// TestDiagnoseSoftnetSqueeze gives the receive softirq a budget of one
// packet per run under the same steered flood.
func TestDiagnoseSoftnetSqueeze(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	rps(t, p.NsB, p.IfB)
	setSysctl(t, "net/core/netdev_budget", "1")
	r := diagnoseDuring(t, p.NsB, flood(t, p.NsA, p.B4, 7010, 16))
	f := finding(t, r, "softnet-squeeze")
	moving(t, f, "softnet/")
	if !strings.Contains(f.Summary, "net.core.netdev_budget = 1,") {
		t.Errorf("summary %q does not quote the budget", f.Summary)
	}
}

// TestDiagnoseWithoutRoot: the counters and findings, and a clear word
// that drop reasons need root.
func TestDiagnoseWithoutRoot(t *testing.T) {
	testutil.Privileged(t)
	// The test binary sits in a directory only root may enter: nobody
	// runs a copy.
	exe := copyExecutable(t)
	cmd := exec.Command(exe, "diagnose", "--duration", "200ms", "--json")
	cmd.Env = append(os.Environ(), "RAMPART_TEST_AS_CLI=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("diagnose as nobody: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "run rampart diagnose as root") {
		t.Errorf("stderr %q does not say tracing needs root", stderr.String())
	}
	var r diagnose.Report
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatal(err)
	}
	if r.Tracing.Enabled || !strings.Contains(r.Tracing.Error, "root") || r.Findings == nil || r.Window <= 0 {
		t.Errorf("report without root: %+v", r)
	}
}

func copyExecutable(t *testing.T) string {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "rampart-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	exe := dir + "/rampart"
	if err := os.WriteFile(exe, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return exe
}

func iptablesBinary(t *testing.T) string {
	for _, b := range []string{"iptables-legacy", "iptables-nft"} {
		if _, err := exec.LookPath(b); err == nil {
			return b
		}
	}
	t.Fatal("neither iptables-legacy nor iptables-nft is installed (Debian package iptables)")
	return ""
}

// setSysctl sets a host-wide sysctl for the test's duration.
func setSysctl(t *testing.T, path, value string) {
	path = "/proc/sys/" + path
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile(path, old, 0o644) })
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		t.Fatal(err)
	}
}

// rps spreads ifc's receive work over every CPU through the backlog.
func rps(t *testing.T, ns, ifc string) {
	testutil.Run(t, "ip", "netns", "exec", ns, "sh", "-c", fmt.Sprintf("echo %x > /sys/class/net/%s/queues/rx-0/rps_cpus", 1<<runtime.NumCPU()-1, ifc))
}

// TestDiagnoseRxRing needs a sender faster than the receiver, which only
// the lab's in-kernel generator is: it runs the iptables-raw row (the
// generator offers several times what iptables drops), and diagnose looks
// at the lab's receiving namespace while the row floods it. The frames
// veth's full ring refuses show in its rx_dropped, unexplained by the stack.
func TestDiagnoseRxRing(t *testing.T) {
	testutil.Privileged(t)
	done := make(chan error, 1)
	go func() {
		_, err := rampart(t, "lab", "drop", "--family", "4", "--layers", "iptables-raw", "--warmup", "500ms",
			"--window", "4s", "--repeats", "1", "--list-size", "1000", "--out", t.TempDir())
		done <- err
	}()
	prefix := fmt.Sprintf("%s%d-", lab.NetnsPrefix, os.Getpid())
	var ns string
	for deadline := time.Now().Add(20 * time.Second); ns == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		entries, _ := os.ReadDir("/run/netns")
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), prefix) && strings.HasSuffix(e.Name(), "-rx") {
				ns = e.Name()
			}
		}
	}
	if ns == "" {
		t.Fatalf("the lab's receiving namespace %s*-rx did not appear: %v", prefix, <-done)
	}
	time.Sleep(time.Second) // setup and warm-up: then the row floods for 4 s
	var r diagnose.Report
	jsonOf(t, &r, "--netns", ns, "diagnose", "--duration", "1s")
	if err := <-done; err != nil {
		t.Fatalf("lab drop: %v", err)
	}
	f := finding(t, &r, "rx-ring")
	moving(t, f, "link/lab-rx/rx_dropped")
	finding(t, &r, "netfilter-drop")
	noFinding(t, &r, "backlog-drops")
}

// TestDiagnoseWatch: one JSON report per interval until interrupted, each
// over its own window, and an interrupt is a clean end.
func TestDiagnoseWatch(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := &linesWriter{want: 3, done: cancel}
	var errb strings.Builder
	load, stop := context.WithCancel(context.Background())
	defer stop()
	go flood(t, p.NsA, p.B4, 7011, 1)(load)
	err := cli.Run(ctx, cli.Env{Stdout: out, Stderr: &errb}, []string{"--netns", p.NsB, "diagnose", "--watch", "--json", "--duration", "300ms"})
	if err != nil {
		t.Fatalf("diagnose --watch: %v\n%s", err, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) < 3 {
		t.Fatalf("%d reports before the 30 s timeout:\n%s", len(lines), out.String())
	}
	for i, l := range lines {
		var r diagnose.Report
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("line %d: %v", i+1, err)
		}
		if r.Window < 0.25 || r.Window > 3 {
			t.Errorf("report %d: window %.2f s, want about 0.3", i+1, r.Window)
		}
		f := finding(t, &r, "no-listener")
		moving(t, f, "UdpNoPorts")
	}
}

// linesWriter calls done once want lines have been written.
type linesWriter struct {
	strings.Builder
	want int
	done func()
}

func (w *linesWriter) Write(b []byte) (int, error) {
	n, err := w.Builder.Write(b)
	if strings.Count(w.String(), "\n") >= w.want {
		w.done()
	}
	return n, err
}

package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rampart-fw/rampart/internal/netns"
	"github.com/rampart-fw/rampart/internal/proxy"
	"github.com/rampart-fw/rampart/internal/testutil"
)

// logBuffer collects a child's stderr while the test reads it.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Count is how many times s occurs in the log, read without a copy.
func (l *logBuffer) Count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Count(l.b.Bytes(), []byte(s))
}

// rampartCmd is this test binary acting as rampart, in ns unless ns is "".
func rampartCmd(ns string, args ...string) *exec.Cmd {
	exe, _ := os.Executable()
	cmd := exec.Command(exe, args...)
	if ns != "" {
		cmd = exec.Command("ip", append([]string{"netns", "exec", ns, exe}, args...)...)
	}
	cmd.Env = append(os.Environ(), "RAMPART_TEST_AS_CLI=1")
	return cmd
}

// runProxyCmd starts a proxy and waits for its status socket; its log is
// returned as it grows.
func runProxyCmd(t *testing.T, cmd *exec.Cmd, sock string) *logBuffer {
	t.Helper()
	log := &logBuffer{}
	cmd.Stderr = io.MultiWriter(os.Stderr, log)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := proxy.ReadStatus(sock); err == nil {
			return log
		}
		select {
		case <-exited:
			t.Fatalf("the proxy exited:\n%s", log)
		default:
		}
		if time.Now().After(end) {
			t.Fatalf("the proxy did not start:\n%s", log)
		}
	}
}

// stopProxy ends a proxy with SIGTERM and waits for it.
func stopProxy(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	cmd.Process.Signal(syscall.SIGTERM)
	for end := time.Now().Add(10 * time.Second); testutil.Alive(cmd.Process.Pid); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the proxy did not stop on SIGTERM")
		}
	}
}

// whoAmIServer answers every TCP connection to addr in ns with the
// connecting address, as the backend sees it.
func whoAmIServer(t *testing.T, ns, addr string) {
	var ln net.Listener
	if err := netns.Run(ns, func() (err error) { ln, err = net.Listen("tcp", addr); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, c.RemoteAddr().(*net.TCPAddr).IP)
			c.Close()
		}
	}()
}

// whoAmI connects from ns to addr and returns what the backend saw.
func whoAmI(ns, addr string) (string, error) {
	var c net.Conn
	if err := netns.Run(ns, func() (err error) { c, err = net.DialTimeout("tcp", addr, 3*time.Second); return err }); err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	b, err := io.ReadAll(c)
	return strings.TrimSpace(string(b)), err
}

// echoServer returns every UDP datagram to addr in ns to its sender.
func echoServer(t *testing.T, ns, addr string) {
	var pc net.PacketConn
	if err := netns.Run(ns, func() (err error) { pc, err = net.ListenPacket("udp", addr); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
}

// rulesOf is the ip rules (both families) of ns, the host's for "".
func rulesOf(t *testing.T, ns string) string {
	ip := func(args ...string) string {
		if ns != "" {
			args = append([]string{"-n", ns}, args...)
		}
		return testutil.Run(t, "ip", args...)
	}
	return ip("rule") + ip("-6", "rule")
}

// backendLab is the proxy lab with a TCP who-am-I server on 10.81.2.2:80,
// a UDP echo on 10.81.2.2:5353 and their return routing through the proxy.
func backendLab(t *testing.T) proxyLab {
	l := newProxyLab(t)
	whoAmIServer(t, l.backend, "10.81.2.2:80")
	echoServer(t, l.backend, "10.81.2.2:5353")
	if out, err := rampartCmd(l.backend, "proxy", "backend-setup", "--proxy", "10.81.2.1", "--by", "source", "--port", "80,5353").CombinedOutput(); err != nil {
		t.Fatalf("backend-setup: %v\n%s", err, out)
	}
	return l
}

const (
	tcpProxyYAML = "services:\n  - {name: web, listen: \"10.81.1.1:8080\", backends: [\"10.81.2.2:80\"], health_interval: 200ms}\n"
	udpProxyYAML = "services:\n  - {name: dns, protocol: udp, listen: \"10.81.1.1:5300\", backends: [\"10.81.2.2:5353\"]}\n"
	tcpRule      = "from 10.81.2.2 ipproto tcp sport 80 lookup 7100 proto 167"
)

// throughTCP says whether a client gets through the TCP proxy and the
// backend sees its own address.
func throughTCP(t *testing.T, l proxyLab, how string) {
	t.Helper()
	if got, err := whoAmI(l.client, "10.81.1.1:8080"); err != nil || got != "10.81.1.2" {
		t.Fatalf("%s: the backend saw %q (%v), want the client's 10.81.1.2\n%s", how, got, err, rulesOf(t, l.proxy))
	}
}

// TestProxyTwoInOneNamespace: a second proxy in the namespace of a running
// one, with a table of its own, leaves the first one's rules alone; with
// the first one's table it is refused; and stopping it removes only its
// own.
func TestProxyTwoInOneNamespace(t *testing.T) {
	testutil.Privileged(t)
	l := backendLab(t)
	dir := t.TempDir()
	cfgA, cfgB, cfgSame := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml"), filepath.Join(dir, "same.yaml")
	os.WriteFile(cfgA, []byte(tcpProxyYAML), 0o644)
	os.WriteFile(cfgB, []byte("table: 7101\n"+udpProxyYAML), 0o644)
	os.WriteFile(cfgSame, []byte(strings.Replace(udpProxyYAML, ":5300", ":5301", 1)), 0o644)
	sockA, sockB := filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock")

	a := rampartCmd(l.proxy, "proxy", "-f", cfgA, "--status", sockA)
	runProxyCmd(t, a, sockA)
	throughTCP(t, l, "proxy A alone")

	b := rampartCmd(l.proxy, "proxy", "-f", cfgB, "--status", sockB)
	runProxyCmd(t, b, sockB)
	rules := rulesOf(t, l.proxy)
	if !strings.Contains(rules, tcpRule) || !strings.Contains(rules, "from 10.81.2.2 ipproto udp sport 5353 lookup 7101 proto 167") {
		t.Fatalf("with proxies A (table 7100) and B (7101) running, want both's rules:\n%s", rules)
	}
	throughTCP(t, l, "with B running")
	if reply, err := udpEcho(l.client, "10.81.1.1:5300", "B"); err != nil || reply != "B" {
		t.Errorf("UDP through B: %q %v", reply, err)
	}

	// A third one with A's table is refused before it changes anything.
	out, err := rampartCmd(l.proxy, "proxy", "-f", cfgSame, "--status", filepath.Join(dir, "same.sock")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "table 7100") || !strings.Contains(string(out), fmt.Sprintf("pid %d", a.Process.Pid)) {
		t.Errorf("a proxy with the table of a running one: %v\n%s", err, out)
	}
	if got := rulesOf(t, l.proxy); got != rules {
		t.Errorf("the refused proxy changed the rules:\n%s\nwant:\n%s", got, rules)
	}
	throughTCP(t, l, "after the refused start")

	stopProxy(t, b)
	rules = rulesOf(t, l.proxy)
	if !strings.Contains(rules, tcpRule) || strings.Contains(rules, "lookup 7101") {
		t.Errorf("after B stopped, want A's rules and none of B's:\n%s", rules)
	}
	throughTCP(t, l, "after B stopped")
	stopProxy(t, a)
	if got := proxyRouting(t, l.proxy); strings.TrimSpace(got) != "" {
		t.Errorf("left after both stopped:\n%s", got)
	}
}

// TestProxyPutsRoutingBack: rules and the local route removed from under a
// running proxy are noticed, logged, shown by proxy status and put back.
func TestProxyPutsRoutingBack(t *testing.T) {
	testutil.Privileged(t)
	l := backendLab(t)
	dir := t.TempDir()
	cfg, sock := filepath.Join(dir, "p.yaml"), filepath.Join(dir, "p.sock")
	os.WriteFile(cfg, []byte(tcpProxyYAML), 0o644)
	log := runProxyCmd(t, rampartCmd(l.proxy, "proxy", "-f", cfg, "--status", sock), sock)
	throughTCP(t, l, "at start")

	testutil.Run(t, "ip", "-n", l.proxy, "rule", "del", "pref", "7100", "from", "10.81.2.2", "ipproto", "tcp", "sport", "80", "lookup", "7100")
	testutil.Run(t, "ip", "-n", l.proxy, "route", "del", "local", "default", "dev", "lo", "table", "7100")
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		rules, routes := rulesOf(t, l.proxy), testutil.Run(t, "ip", "-n", l.proxy, "route", "show", "table", "7100")
		if strings.Contains(rules, tcpRule) && strings.Contains(routes, "local default dev lo") {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the removed routing is not back:\n%s\n%s", rules, routes)
		}
	}
	throughTCP(t, l, "after the routing was put back")

	var st struct {
		Routing struct {
			Table       int    `json:"table"`
			InPlace     bool   `json:"in_place"`
			Repairs     int    `json:"repairs"`
			LastProblem string `json:"last_problem"`
		} `json:"routing"`
	}
	jsonOf(t, &st, "proxy", "status", "--status", sock)
	if st.Routing.Table != 7100 || st.Routing.Repairs < 1 || !strings.Contains(st.Routing.LastProblem, "sport 80") || !st.Routing.InPlace {
		t.Errorf("proxy status --json routing: %+v", st.Routing)
	}
	if out := mustRampart(t, "proxy", "status", "--status", sock); !strings.Contains(out, "routing: table 7100") || !strings.Contains(out, "put back") {
		t.Errorf("proxy status:\n%s", out)
	}
	if !strings.Contains(log.String(), "put back") {
		t.Errorf("the proxy did not log the missing routing:\n%s", log)
	}
}

// TestProxyRefusesTable: a reserved table is refused in the file; a table
// holding routes or named by rules of others is refused at start, with
// nothing changed.
func TestProxyRefusesTable(t *testing.T) {
	testutil.Privileged(t)
	l := newProxyLab(t)
	run := func(table string) (string, error) {
		cfg := writeFile(t, "p.yaml", "table: "+table+"\n"+tcpProxyYAML)
		// A proxy that takes the table runs until killed.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		exe, _ := os.Executable()
		cmd := exec.CommandContext(ctx, "ip", "netns", "exec", l.proxy, exe, "proxy", "-f", cfg, "--status", filepath.Join(t.TempDir(), "s"))
		cmd.Env = append(os.Environ(), "RAMPART_TEST_AS_CLI=1")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, table := range []string{"255", "254", "253", "0"} {
		out, err := run(table)
		if err == nil || !strings.Contains(out, "p.yaml:1: table:") || !strings.Contains(out, "reserved") {
			t.Errorf("table %s: %v\n%s", table, err, out)
		}
	}
	if got := testutil.Run(t, "ip", "-n", l.proxy, "route", "show", "table", "local"); strings.Contains(got, "default") {
		t.Errorf("a refused table changed the local table:\n%s", got)
	}
	if got := proxyRouting(t, l.proxy); strings.TrimSpace(got) != "" {
		t.Errorf("a refused table installed:\n%s", got)
	}

	testutil.Run(t, "ip", "-n", l.proxy, "route", "add", "unreachable", "192.0.2.0/24", "table", "7300")
	testutil.Run(t, "ip", "-n", l.proxy, "rule", "add", "pref", "7000", "from", "192.0.2.9", "lookup", "7301")
	tables := func() string {
		out := rulesOf(t, l.proxy) + proxyRouting(t, l.proxy)
		for _, table := range []string{"7300", "7301"} {
			// An empty table is an error ("FIB table does not exist"): its text is compared too.
			for _, fam := range []string{"-4", "-6"} {
				b, _ := exec.Command("ip", "-n", l.proxy, fam, "route", "show", "table", table).CombinedOutput()
				out += string(b)
			}
		}
		return out
	}
	before := tables()
	for _, c := range []struct{ table, what string }{{"7300", "unreachable 192.0.2.0/24"}, {"7301", "from 192.0.2.9 lookup 7301"}} {
		out, err := run(c.table)
		if err == nil || !strings.Contains(out, "table "+c.table) || !strings.Contains(out, c.what) {
			t.Errorf("table %s in use: %v\n%s", c.table, err, out)
		}
	}
	if after := tables(); after != before {
		t.Errorf("a refused start changed the routing:\n%s\nwas:\n%s", after, before)
	}
}

// TestProxyNetns: with --netns, the proxy's listeners, its connections to
// backends and its routing are in that namespace, and the host's rules are
// untouched; backend-setup --netns sets up (and --undo clears) the
// backend's namespace.
func TestProxyNetns(t *testing.T) {
	testutil.Privileged(t)
	l := backendLab(t)
	onHost := func() {
		t.Helper()
		if got := rulesOf(t, ""); strings.Contains(got, "10.81.2.2") {
			t.Errorf("rules for the lab's backend on the host:\n%s", got)
		}
	}
	dir := t.TempDir()
	cfg, sock := filepath.Join(dir, "p.yaml"), filepath.Join(dir, "p.sock")
	os.WriteFile(cfg, []byte(tcpProxyYAML), 0o644)
	cmd := rampartCmd("", "--netns", l.proxy, "proxy", "-f", cfg, "--status", sock)
	runProxyCmd(t, cmd, sock)
	if got := rulesOf(t, l.proxy); !strings.Contains(got, tcpRule) {
		t.Errorf("proxy --netns %s: the namespace's rules:\n%s", l.proxy, got)
	}
	onHost()
	throughTCP(t, l, "proxy --netns")

	backendSetup := func(args ...string) {
		t.Helper()
		if out, err := rampartCmd("", append([]string{"--netns", l.backend, "proxy", "backend-setup"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("backend-setup --netns %v: %v\n%s", args, err, out)
		}
	}
	backendSetup("--undo")
	if got := proxyRouting(t, l.backend); strings.TrimSpace(got) != "" {
		t.Errorf("backend-setup --netns --undo left:\n%s", got)
	}
	backendSetup("--proxy", "10.81.2.1", "--by", "source", "--port", "80")
	if got := rulesOf(t, l.backend); !strings.Contains(got, "from 10.81.2.2 ipproto tcp sport 80 lookup 7100 proto 167") {
		t.Errorf("backend-setup --netns: the namespace's rules:\n%s", got)
	}
	onHost()
	throughTCP(t, l, "after backend-setup --netns")

	stopProxy(t, cmd)
	if got := proxyRouting(t, l.proxy); strings.TrimSpace(got) != "" {
		t.Errorf("left after the proxy stopped:\n%s", got)
	}
}

// TestProxyStatusPath: proxy --status at a regular file is refused and the
// file kept; at the live socket of a running proxy it is refused and that
// proxy keeps answering; neither refused start changes the routing.
func TestProxyStatusPath(t *testing.T) {
	testutil.Privileged(t)
	l := backendLab(t)
	dir := t.TempDir()
	cfgA, cfgB := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	os.WriteFile(cfgA, []byte(tcpProxyYAML), 0o644)
	os.WriteFile(cfgB, []byte("table: 7101\n"+udpProxyYAML), 0o644)

	file := filepath.Join(dir, "notes")
	os.WriteFile(file, []byte("keep me\n"), 0o644)
	out, err := rampartCmd(l.proxy, "proxy", "-f", cfgA, "--status", file).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not a socket") {
		t.Errorf("--status at a regular file: %v\n%s", err, out)
	}
	if b, _ := os.ReadFile(file); string(b) != "keep me\n" {
		t.Errorf("the file at --status became %q", b)
	}
	if got := proxyRouting(t, l.proxy); strings.TrimSpace(got) != "" {
		t.Errorf("the refused start left routing:\n%s", got)
	}

	sock := filepath.Join(dir, "a.sock")
	runProxyCmd(t, rampartCmd(l.proxy, "proxy", "-f", cfgA, "--status", sock), sock)
	rules := rulesOf(t, l.proxy)
	out, err = rampartCmd(l.proxy, "proxy", "-f", cfgB, "--status", sock).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "answers") {
		t.Errorf("--status at a running proxy's socket: %v\n%s", err, out)
	}
	if _, err := proxy.ReadStatus(sock); err != nil {
		t.Errorf("the running proxy no longer answers on its socket: %v", err)
	}
	if got := rulesOf(t, l.proxy); got != rules {
		t.Errorf("the refused start changed the rules:\n%s\nwant:\n%s", got, rules)
	}
	throughTCP(t, l, "after the refused starts")
}

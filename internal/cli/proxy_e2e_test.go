package cli_test

import (
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/netns"
	"github.com/rampart-fw/rampart/internal/proxy"
	"github.com/rampart-fw/rampart/internal/testutil"
)

// proxyLab is three namespaces: a client, the proxy, and a backend on
// another link that has no route to the client's network of its own.
type proxyLab struct {
	client, proxy, backend string
}

func newProxyLab(t *testing.T) proxyLab {
	tag := fmt.Sprintf("%d", os.Getpid()%100000)
	l := proxyLab{"rpx-" + tag + "-c", "rpx-" + tag + "-p", "rpx-" + tag + "-b"}
	t.Cleanup(func() {
		for _, ns := range []string{l.client, l.proxy, l.backend} {
			exec.Command("ip", "netns", "del", ns).Run()
		}
	})
	for _, ns := range []string{l.client, l.proxy, l.backend} {
		testutil.Run(t, "ip", "netns", "add", ns)
		testutil.Run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	testutil.Run(t, "ip", "-n", l.client, "link", "add", "c0", "type", "veth", "peer", "name", "p0", "netns", l.proxy)
	testutil.Run(t, "ip", "-n", l.proxy, "link", "add", "p1", "type", "veth", "peer", "name", "b0", "netns", l.backend)
	for _, a := range []struct{ ns, dev, v4, v6 string }{
		{l.client, "c0", "10.81.1.2/24", "fd81:1::2/64"},
		{l.proxy, "p0", "10.81.1.1/24", "fd81:1::1/64"},
		{l.proxy, "p1", "10.81.2.1/24", "fd81:2::1/64"},
		{l.backend, "b0", "10.81.2.2/24", "fd81:2::2/64"},
	} {
		testutil.Run(t, "ip", "-n", a.ns, "addr", "add", a.v4, "dev", a.dev)
		testutil.Run(t, "ip", "-n", a.ns, "addr", "add", a.v6, "dev", a.dev, "nodad")
		testutil.Run(t, "ip", "-n", a.ns, "link", "set", a.dev, "up")
	}
	return l
}

const proxyYAML = `services:
  - {name: web4, protocol: tcp, listen: "10.81.1.1:8080", backends: ["10.81.2.2:80", "10.81.2.2:81"], health_interval: 200ms}
  - {name: web6, protocol: tcp, listen: "[fd81:1::1]:8080", backends: ["[fd81:2::2]:80"], health_interval: 500ms}
  - {name: echo4, protocol: udp, listen: "10.81.1.1:5300", backends: ["10.81.2.2:5353"], max_sessions: 200}
  - {name: echo6, protocol: udp, listen: "[fd81:1::1]:5300", backends: ["[fd81:2::2]:5353"]}
`

// startProxy runs rampart proxy in the proxy namespace and waits for its
// status socket.
func startProxy(t *testing.T, l proxyLab, cfg, sock string) *exec.Cmd {
	exe, _ := os.Executable()
	cmd := exec.Command("ip", "netns", "exec", l.proxy, exe, "proxy", "-f", cfg, "--status", sock)
	cmd.Env = append(os.Environ(), "RAMPART_TEST_AS_CLI=1")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for end := time.Now().Add(10 * time.Second); ; {
		if _, err := proxy.ReadStatus(sock); err == nil {
			return cmd
		}
		if time.Now().After(end) {
			t.Fatal("the proxy did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// proxyRouting is the proxy namespace's rules and routes of rampart's.
func proxyRouting(t *testing.T, ns string) string {
	var out []string
	for _, l := range strings.Split(testutil.Run(t, "ip", "-n", ns, "rule")+testutil.Run(t, "ip", "-n", ns, "-6", "rule"), "\n") {
		if strings.Contains(l, "proto 167") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n") +
		testutil.Run(t, "ip", "-n", ns, "route", "show", "table", "all", "proto", "167") +
		testutil.Run(t, "ip", "-n", ns, "-6", "route", "show", "table", "all", "proto", "167")
}

// TestProxyTransparent: through rampart proxy, nginx on the backend logs
// the client's real address for IPv4 and IPv6, and a UDP echo sees it as
// its peer and its replies reach the client, with the backend's return
// routing by source and then by mark; stopping the proxy leaves no rule or
// route, a SIGKILLed proxy's leftovers are cleaned by the next start, and
// a random-source UDP flood does not take its descriptors past the cap.
func TestProxyTransparent(t *testing.T) {
	testutil.Privileged(t)
	if _, err := exec.LookPath("nginx"); err != nil {
		t.Fatal("nginx is needed (scripts/setup.sh installs it)")
	}
	l := newProxyLab(t)
	dir := t.TempDir()
	nginxConf := filepath.Join(dir, "nginx.conf")
	os.WriteFile(nginxConf, []byte(fmt.Sprintf(`pid %[1]s/nginx.pid;
error_log %[1]s/error.log;
events {}
http {
  log_format addr '$remote_addr';
  access_log %[1]s/access.log addr;
  client_body_temp_path %[1]s; proxy_temp_path %[1]s; fastcgi_temp_path %[1]s; uwsgi_temp_path %[1]s; scgi_temp_path %[1]s;
  server { listen 10.81.2.2:80; listen [fd81:2::2]:80; location / { return 200 "ok\n"; } }
}
`, dir)), 0o644)
	ngx := exec.Command("ip", "netns", "exec", l.backend, "nginx", "-c", nginxConf, "-g", "daemon off;")
	ngx.Stderr = os.Stderr
	// A group of its own, killed whole: a worker outlives a killed master.
	ngx.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := ngx.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-ngx.Process.Pid, syscall.SIGKILL); ngx.Wait() })

	// The UDP echo records its peers.
	var mu sync.Mutex
	peers := map[string]bool{}
	for _, a := range []string{"10.81.2.2:5353", "[fd81:2::2]:5353"} {
		var pc net.PacketConn
		if err := netns.Run(l.backend, func() (err error) { pc, err = net.ListenPacket("udp", a); return err }); err != nil {
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
				mu.Lock()
				peers[from.(*net.UDPAddr).IP.String()] = true
				mu.Unlock()
				pc.WriteTo(buf[:n], from)
			}
		}()
	}
	exe, _ := os.Executable()
	backendSetup := func(args ...string) {
		cmd := exec.Command("ip", append([]string{"netns", "exec", l.backend, exe, "proxy", "backend-setup"}, args...)...)
		cmd.Env = append(os.Environ(), "RAMPART_TEST_AS_CLI=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("backend-setup %v: %v\n%s", args, err, out)
		}
	}
	backendSetup("--proxy", "10.81.2.1,fd81:2::1", "--by", "source", "--port", "80,5353")

	cfg := filepath.Join(dir, "proxy.yaml")
	os.WriteFile(cfg, []byte(proxyYAML), 0o644)
	sock := filepath.Join(dir, "proxy.sock")
	cmd := startProxy(t, l, cfg, sock)
	// Nothing listens on the second web4 backend: the health check takes it
	// out, and every request goes to the first.
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st, err := proxy.ReadStatus(sock)
		if err == nil && !st.Services[0].Backends[1].Healthy && st.Services[0].Backends[0].Healthy {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the dead backend is still taken as healthy: %+v", st)
		}
	}

	check := func(how string) {
		t.Helper()
		os.Truncate(filepath.Join(dir, "access.log"), 0)
		for _, c := range []struct{ url, client string }{{"http://10.81.1.1:8080/", "10.81.1.2"}, {"http://10.81.1.1:8080/", "10.81.1.2"}, {"http://[fd81:1::1]:8080/", "fd81:1::2"}} {
			body, err := httpGet(l.client, c.url)
			if err != nil || body != "ok\n" {
				t.Fatalf("%s: GET %s through the proxy: %q %v\n%s\n%s", how, c.url, body, err, testutil.Run(t, "ip", "-n", l.backend, "rule"), testutil.Run(t, "ip", "netns", "exec", l.backend, "nft", "list", "ruleset"))
			}
			time.Sleep(100 * time.Millisecond)
			if log := readFile(t, filepath.Join(dir, "access.log")); !strings.Contains(log, c.client+"\n") {
				t.Errorf("%s: nginx logged %q, want the client's %s", how, log, c.client)
			}
		}
		for _, c := range []struct{ addr, client string }{{"10.81.1.1:5300", "10.81.1.2"}, {"[fd81:1::1]:5300", "fd81:1::2"}} {
			mu.Lock()
			clear(peers)
			mu.Unlock()
			if reply, err := udpEcho(l.client, c.addr, how); err != nil || reply != how {
				t.Fatalf("%s: UDP echo through %s: %q %v", how, c.addr, reply, err)
			}
			mu.Lock()
			if !peers[c.client] || len(peers) != 1 {
				t.Errorf("%s: the echo's peers %v, want only the client's %s", how, peers, c.client)
			}
			mu.Unlock()
		}
	}
	check("by source")
	// By mark, replies are rerouted after the kernel found them a route:
	// a backend has a default route, not through the proxy.
	testutil.Run(t, "ip", "-n", l.backend, "route", "add", "default", "via", "10.81.2.254")
	testutil.Run(t, "ip", "-n", l.backend, "-6", "route", "add", "default", "via", "fd81:2::fe")
	backendSetup("--proxy", "10.81.2.1,fd81:2::1", "--by", "mark")
	check("by mark")

	// A random-source flood at the 200-session UDP service.
	fdsBefore := openFDs(t, cmd.Process.Pid)
	floodUDP(t, l.client, 20000)
	time.Sleep(500 * time.Millisecond)
	st, err := proxy.ReadStatus(sock)
	if err != nil {
		t.Fatal(err)
	}
	fdsAfter := openFDs(t, cmd.Process.Pid)
	echo4 := st.Services[2]
	t.Logf("flood: descriptors %d → %d, sessions %d, refused %d", fdsBefore, fdsAfter, echo4.Sessions, echo4.SessionsRefused)
	if fdsAfter > fdsBefore+200 || echo4.Sessions > 200 || echo4.SessionsRefused == 0 {
		t.Errorf("under a flood of new sources: descriptors %d → %d, %d sessions, %d refused; want at most 200 more, the cap held", fdsBefore, fdsAfter, echo4.Sessions, echo4.SessionsRefused)
	}

	// Stopping leaves nothing; a SIGKILL leaves what the next start removes.
	if got := proxyRouting(t, l.proxy); strings.Count(got, "lookup 7100") != 5 {
		t.Fatalf("the proxy's routing while it runs:\n%s", got)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	if got := proxyRouting(t, l.proxy); strings.TrimSpace(got) != "" {
		t.Errorf("left after the proxy stopped:\n%s", got)
	}
	cmd = startProxy(t, l, cfg, sock)
	cmd.Process.Kill()
	cmd.Wait()
	if got := proxyRouting(t, l.proxy); strings.Count(got, "lookup 7100") != 5 {
		t.Fatalf("after SIGKILL, expected leftovers:\n%s", got)
	}
	cmd = startProxy(t, l, cfg, sock)
	if got := proxyRouting(t, l.proxy); strings.Count(got, "lookup 7100") != 5 {
		t.Errorf("a start after SIGKILL, want one set of rules:\n%s", got)
	}
	check("after a restart")
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	if got := proxyRouting(t, l.proxy); strings.TrimSpace(got) != "" {
		t.Errorf("left after the proxy stopped:\n%s", got)
	}
	backendSetup("--undo")
	if got := proxyRouting(t, l.backend); strings.TrimSpace(got) != "" {
		t.Errorf("left on the backend after --undo:\n%s", got)
	}
}

func httpGet(ns, url string) (string, error) {
	c := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, Dial: func(network, addr string) (conn net.Conn, err error) {
		err = netns.Run(ns, func() (err error) { conn, err = net.Dial(network, addr); return err })
		return conn, err
	}}}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func udpEcho(ns, addr, msg string) (string, error) {
	var c net.Conn
	if err := netns.Run(ns, func() (err error) { c, err = net.Dial("udp", addr); return err }); err != nil {
		return "", err
	}
	defer c.Close()
	buf := make([]byte, 2048)
	for try := 0; try < 5; try++ {
		c.Write([]byte(msg))
		c.SetReadDeadline(time.Now().Add(time.Second))
		if n, err := c.Read(buf); err == nil {
			return string(buf[:n]), nil
		}
	}
	return "", fmt.Errorf("no reply")
}

func openFDs(t *testing.T, pid int) int {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(fds)
}

// floodUDP sends n datagrams to 10.81.1.1:5300 from random addresses of
// the client's /24 and random ports, through a raw socket.
func floodUDP(t *testing.T, ns string, n int) {
	err := netns.Run(ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		dst := netip.MustParseAddr("10.81.1.1").As4()
		pkt := make([]byte, 28+8)
		for range n {
			src := [4]byte{10, 81, 1, byte(3 + rand.IntN(250))}
			pkt[0], pkt[8], pkt[9] = 0x45, 64, unix.IPPROTO_UDP
			binary.BigEndian.PutUint16(pkt[2:], uint16(len(pkt)))
			copy(pkt[12:], src[:])
			copy(pkt[16:], dst[:])
			binary.BigEndian.PutUint16(pkt[20:], uint16(1024+rand.IntN(60000)))
			binary.BigEndian.PutUint16(pkt[22:], 5300)
			binary.BigEndian.PutUint16(pkt[24:], 16)
			if err := unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: dst}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestProxyNeedsCapability: without CAP_NET_ADMIN and CAP_NET_RAW the
// proxy says which capability it lacks and installs nothing.
func TestProxyNeedsCapability(t *testing.T) {
	testutil.Privileged(t)
	exe, _ := os.Executable()
	ns := testutil.NewPair(t).NsA
	cfg := writeFile(t, "proxy.yaml", "services:\n  - {name: a, listen: \"127.0.0.1:18080\", backends: [\"127.0.0.2:80\"]}\n")
	cmd := exec.Command("ip", "netns", "exec", ns, "setpriv", "--bounding-set", "-net_admin,-net_raw", "--inh-caps", "-net_admin,-net_raw", "--", exe, "proxy", "-f", cfg, "--status", filepath.Join(t.TempDir(), "s"))
	cmd.Env = append(os.Environ(), "RAMPART_TEST_AS_CLI=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "needs CAP_NET_ADMIN") {
		t.Errorf("without the capability: %v\n%s", err, out)
	}
	if got := proxyRouting(t, ns); strings.TrimSpace(got) != "" {
		t.Errorf("installed without the capability:\n%s", got)
	}
}

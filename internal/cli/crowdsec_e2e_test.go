package cli_test

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/rampart-fw/rampart/internal/testutil"
)

// lapi is a real CrowdSec Local API (Debian's crowdsec, run with -no-cs:
// the API alone, no Central API) with a database of its own, on a
// loopback port.
type lapi struct {
	t         *testing.T
	dir, conf string
	url, key  string
	cmd       *exec.Cmd
	log       *strings.Builder
}

func startLAPI(t *testing.T) *lapi {
	t.Helper()
	if _, err := exec.LookPath("crowdsec"); err != nil {
		if os.Getenv("RAMPART_REQUIRE_PRIVILEGED") != "" {
			t.Fatal("crowdsec is not installed (scripts/setup.sh installs it)")
		}
		t.Skip("crowdsec is not installed")
	}
	l := &lapi{t: t, dir: t.TempDir(), key: "rampart-test-key-0123456789"}
	raw, err := os.ReadFile("/etc/crowdsec/config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := yaml.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	sub := func(m map[string]any, k string) map[string]any { return m[k].(map[string]any) }
	port := freePort(t)
	l.url = fmt.Sprintf("http://127.0.0.1:%d/", port)
	common := sub(c, "common")
	common["daemonize"], common["log_media"], common["log_dir"] = false, "stdout", l.dir
	sub(c, "config_paths")["data_dir"] = l.dir
	db := sub(c, "db_config")
	db["db_path"], db["use_wal"] = filepath.Join(l.dir, "crowdsec.db"), true
	api := sub(c, "api")
	sub(api, "client")["credentials_path"] = filepath.Join(l.dir, "local_api_credentials.yaml")
	server := sub(api, "server")
	server["listen_uri"] = fmt.Sprintf("127.0.0.1:%d", port)
	delete(server, "online_client") // offline: no Central API
	sub(c, "prometheus")["enabled"] = false
	out, _ := yaml.Marshal(c)
	l.conf = filepath.Join(l.dir, "config.yaml")
	os.WriteFile(l.conf, out, 0o600)
	l.cscli("machines", "add", "rampart-test", "--auto", "-f", filepath.Join(l.dir, "local_api_credentials.yaml"))
	l.cscli("bouncers", "add", "rampart", "-k", l.key)
	l.start()
	return l
}

func (l *lapi) start() {
	l.t.Helper()
	l.log = &strings.Builder{}
	l.cmd = exec.Command("crowdsec", "-c", l.conf, "-no-cs")
	l.cmd.Stdout, l.cmd.Stderr = &syncWriter{w: l.log}, &syncWriter{w: l.log}
	if err := l.cmd.Start(); err != nil {
		l.t.Fatal(err)
	}
	cmd := l.cmd
	l.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if c, err := net.Dial("tcp", strings.TrimSuffix(strings.TrimPrefix(l.url, "http://"), "/")); err == nil {
			c.Close()
			return
		}
		if time.Now().After(end) {
			l.t.Fatalf("the LAPI did not start:\n%s", l.log)
		}
	}
}

func (l *lapi) stop() {
	l.cmd.Process.Signal(syscall.SIGTERM)
	l.cmd.Wait()
}

func (l *lapi) cscli(args ...string) string {
	l.t.Helper()
	out, err := exec.Command("cscli", append([]string{"-c", l.conf}, args...)...).CombinedOutput()
	if err != nil {
		l.t.Fatalf("cscli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// plainMetric reads a sample without labels ("" when absent: -1).
func plainMetric(text, name string) float64 {
	m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindStringSubmatch(text)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// within polls cond every 50 ms for up to limit; it returns how long
// cond took to hold, or fails.
func within(t *testing.T, what string, limit time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			t.Fatalf("%s: not within %s", what, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start)
}

// TestCrowdSecBouncer: rampart serve follows a real CrowdSec LAPI. Bans of
// an address (IPv4) and of a range (IPv6) reach the kernel and drop real
// traffic; a decision deleted lifts its ban; one that expires goes on its
// own time, unless the LAPI sends it again first; a type not enforced is
// counted, never listed; 100,000 imported decisions are enforced; the LAPI
// stopped and started, and the service killed and started while the LAPI
// is down, never lift a ban; a bad key is a counted error and the bans stay.
func TestCrowdSecBouncer(t *testing.T) {
	testutil.Privileged(t)
	l := startLAPI(t)
	p := testutil.NewPair(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "key"), []byte(l.key+"\n"), 0o600)
	pol := filepath.Join(dir, "policy.yaml")
	polText := func(keyFile string) string {
		return fmt.Sprintf("crowdsec: {url: %q, api_key_file: %s, interval: 1s, resync: 3s}\nrules:\n  - {name: crowdsec, src: crowdsec, action: drop}\ndefault: pass\n", l.url, keyFile)
	}
	os.WriteFile(pol, []byte(polText("key")), 0o644)
	port := freePort(t)
	args := []string{"--netns", p.NsB, "-f", pol, "--iface", p.IfB, "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--persist", filepath.Join(dir, "var")}
	serveCmd, _, log := startServe(t, args...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("rampart serve:\n%s\nLAPI:\n%s", log, l.log)
		}
		rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB)
	})

	rx4 := testutil.UDPListener(t, p.NsB, p.B4, 9400)
	rx6 := testutil.UDPListener(t, p.NsB, p.B6, 9400)
	arrive := func(rx *net.UDPConn, to net.IP) int {
		testutil.SendUDP(t, p.NsA, to, 9400, 20)
		return testutil.CountUDP(rx, 150*time.Millisecond)
	}
	banned4 := func() bool { return arrive(rx4, p.B4) == 0 }
	banned6 := func() bool { return arrive(rx6, p.B6) == 0 }
	if banned4() || banned6() {
		t.Fatal("traffic is dropped before any decision")
	}

	l.cscli("decisions", "add", "--ip", p.A4.String(), "--duration", "1h")
	range6 := net.IPNet{IP: p.A6.Mask(net.CIDRMask(64, 128)), Mask: net.CIDRMask(64, 128)}
	l.cscli("decisions", "add", "--range", range6.String(), "--duration", "1h")
	l.cscli("decisions", "add", "--ip", "198.51.100.9", "--duration", "1h", "--type", "captcha")
	took := within(t, "the IPv4 ban enforced", 5*time.Second, banned4)
	within(t, "the IPv6 range ban enforced", 5*time.Second, banned6)
	t.Logf("a ban added with cscli dropped traffic %s later (poll interval 1 s)", took.Round(time.Millisecond))
	text := scrape(t, port)
	if n := metric(t, text, "rampart_crowdsec_packets_total", `action="drop",origin="cscli"`); n < 20 {
		t.Errorf("packets dropped by cscli's decisions: %v, want the 20 or more sent since the ban\n%s", n, text)
	}
	if n := metric(t, text, "rampart_crowdsec_decisions", `type="captcha"`); n != 1 {
		t.Errorf("captcha decisions counted: %v, want 1", n)
	}
	if n := metric(t, text, "rampart_crowdsec_decisions", `origin="cscli",type="ban"`); n != 2 {
		t.Errorf("ban decisions counted: %v, want 2\n%s", n, text)
	}

	// Deleted: the IPv4 ban goes, the IPv6 one stays.
	l.cscli("decisions", "delete", "--ip", p.A4.String())
	within(t, "the deleted IPv4 ban lifted", 5*time.Second, func() bool { return !banned4() })
	if !banned6() {
		t.Error("deleting the IPv4 decision lifted the IPv6 range's")
	}

	// Expiry on the decision's own time, and a decision sent again before
	// it expires keeps the ban (cs-firewall-bouncer #509).
	l.cscli("decisions", "add", "--ip", p.A4.String(), "--duration", "3s")
	within(t, "the 3 s ban enforced", 5*time.Second, banned4)
	within(t, "the 3 s ban expired", 8*time.Second, func() bool { return !banned4() })
	l.cscli("decisions", "add", "--ip", p.A4.String(), "--duration", "3s")
	within(t, "the second 3 s ban enforced", 5*time.Second, banned4)
	l.cscli("decisions", "add", "--ip", p.A4.String(), "--duration", "1h")
	time.Sleep(4 * time.Second)
	if !banned4() {
		t.Fatal("a ban sent again for an hour lapsed when its first decision expired")
	}

	// 100,000 decisions imported; the sender's address is the last.
	var csv strings.Builder
	csv.WriteString("value,duration,type,scope\n")
	for _, i := range rand.Perm(99_999) { // distinct, in no order
		fmt.Fprintf(&csv, "100.%d.%d.%d,2h,ban,ip\n", 64+i>>16, i>>8&255, i&255)
	}
	l.cscli("decisions", "delete", "--ip", p.A4.String())
	within(t, "the IPv4 ban lifted before the import", 5*time.Second, func() bool { return !banned4() })
	fmt.Fprintf(&csv, "%s,2h,ban,ip\n", p.A4)
	file := filepath.Join(dir, "import.csv")
	os.WriteFile(file, []byte(csv.String()), 0o644)
	start := time.Now()
	l.cscli("decisions", "import", "-i", file)
	imported := time.Since(start)
	active := func() float64 {
		return metric(t, scrape(t, port), "rampart_crowdsec_decisions", `origin="cscli-import",type="ban"`)
	}
	within(t, "the 100,000 imported decisions held", 20*time.Second, func() bool { return active() == 100_000 })
	t.Logf("100,000 decisions: cscli import took %s; all held %s after it started", imported.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	if !banned4() {
		t.Error("the imported ban of the sender is not enforced")
	}

	// From here to the end a sender from the banned address runs without
	// pause: not one datagram may arrive while the LAPI stops and starts,
	// the service dies and starts again, and the key is refused.
	gap := testutil.UDPListener(t, p.NsB, p.B4, 9402)
	stopSend := make(chan struct{})
	sent := make(chan int)
	go func() {
		c := testutil.Socket(t, p.NsA, func() (net.Conn, error) { return net.DialUDP("udp", nil, &net.UDPAddr{IP: p.B4, Port: 9402}) })
		n := 0
		for {
			select {
			case <-stopSend:
				sent <- n
				return
			case <-time.After(2 * time.Millisecond):
				c.Write([]byte("banned"))
				n++
			}
		}
	}()
	defer func() {
		close(stopSend)
		n := <-sent
		if got := testutil.CountUDP(gap, 300*time.Millisecond); got != 0 || n < 1000 {
			t.Errorf("%d of %d datagrams from the banned address arrived during the restarts", got, n)
		} else {
			t.Logf("0 of %d datagrams from the banned address arrived during the restarts", n)
		}
	}()

	// The LAPI stops: the bans stay, the failures are counted; it starts
	// again, and the bans still stay.
	l.stop()
	within(t, "a failed poll counted", 10*time.Second, func() bool {
		return metric(t, scrape(t, port), "rampart_crowdsec_lapi_errors_total", `reason="connect"`) >= 1
	})
	if !banned4() || !banned6() {
		t.Fatal("a ban lapsed while the LAPI was down")
	}
	// The service killed and started again while the LAPI is down: it
	// applies the set it saved.
	serveCmd.Process.Kill()
	serveCmd.Wait()
	if !banned4() {
		t.Fatal("the filter stopped enforcing when the service died")
	}
	_, _, log = startServe(t, args...)
	if !strings.Contains(log.String(), "saved decisions restored") {
		t.Errorf("the restarted service did not restore the saved set:\n%s", log)
	}
	if !banned4() || !banned6() {
		t.Fatal("a ban lapsed across the service's restart")
	}
	if n := active(); n != 100_000 {
		t.Errorf("%v ban decisions active after the restart, want 100,000", n)
	}
	l.start()
	within(t, "a poll answered after the LAPI came back", 70*time.Second, func() bool {
		return metric(t, scrape(t, port), "rampart_crowdsec_polls_total", `result="ok"`) >= 1
	})
	if !banned4() || !banned6() {
		t.Fatal("a ban lapsed after the LAPI came back")
	}

	// A bad key: refused, counted, and the bans stay.
	os.WriteFile(filepath.Join(dir, "bad"), []byte("not-the-key\n"), 0o600)
	os.WriteFile(pol+".new", []byte(polText("bad")), 0o644)
	os.Rename(pol+".new", pol)
	within(t, "the bad key counted", 10*time.Second, func() bool {
		return metric(t, scrape(t, port), "rampart_crowdsec_lapi_errors_total", `reason="auth"`) >= 1
	})
	if !banned4() || !banned6() {
		t.Fatal("a ban lapsed when the LAPI refused the key")
	}
	if n := active(); n != 100_000 {
		t.Errorf("%v ban decisions active after the key was refused, want 100,000", n)
	}
	_ = log
}

// TestCrowdSecBadAnswers: a LAPI that answers garbage, or a body over the
// cap, is a counted error; the decisions enforced stay, and the next good
// answer is applied. (A real LAPI cannot be made to answer so; this one is
// an HTTP server of the test's.)
func TestCrowdSecBadAnswers(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	var mode atomic.Value
	mode.Store("ok")
	ban := fmt.Sprintf(`{"new":[{"id":1,"origin":"cscli","scope":"Ip","type":"ban","value":%q,"duration":"1h"}],"deleted":null}`, p.A4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch mode.Load() {
		case "garbage":
			io.WriteString(w, "<html><body>502 Bad Gateway</body></html>")
		case "huge": // past the 512 MiB cap, in whitespace the decoder must read
			io.WriteString(w, `{"new":[`)
			pad := bytes.Repeat([]byte(" "), 1<<20)
			for i := 0; i < 600; i++ {
				if _, err := w.Write(pad); err != nil {
					return
				}
			}
			io.WriteString(w, `]}`)
		default:
			io.WriteString(w, ban)
		}
	}))
	t.Cleanup(srv.Close)
	pol := writeFile(t, "p.yaml", fmt.Sprintf("crowdsec: {url: %q, api_key: k, interval: 200ms}\nrules:\n  - {name: crowdsec, src: crowdsec, action: drop}\n", srv.URL))
	port := freePort(t)
	_, _, log := startServe(t, "--netns", p.NsB, "-f", pol, "--iface", p.IfB, "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--persist", t.TempDir())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("rampart serve:\n%s", log)
		}
		rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB)
	})
	rx := testutil.UDPListener(t, p.NsB, p.B4, 9401)
	banned := func() bool {
		testutil.SendUDP(t, p.NsA, p.B4, 9401, 20)
		return testutil.CountUDP(rx, 150*time.Millisecond) == 0
	}
	within(t, "the ban enforced", 5*time.Second, banned)
	for _, m := range []struct{ mode, reason string }{{"garbage", "decode"}, {"huge", "too-large"}} {
		mode.Store(m.mode)
		within(t, m.mode+" counted", 60*time.Second, func() bool {
			return metric(t, scrape(t, port), "rampart_crowdsec_lapi_errors_total", `reason="`+m.reason+`"`) >= 1
		})
		if !banned() {
			t.Fatalf("the ban lapsed after a %s answer", m.mode)
		}
		if n := metric(t, scrape(t, port), "rampart_crowdsec_decisions", `type="ban"`); n != 1 {
			t.Errorf("%v decisions after a %s answer, want the 1 enforced", n, m.mode)
		}
	}
}

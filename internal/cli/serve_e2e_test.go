package cli_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rampart-fw/rampart/internal/serve"
	"github.com/rampart-fw/rampart/internal/testutil"
)

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startServe runs rampart serve as a child process and waits for its API
// on the namespace's default socket.
func startServe(t *testing.T, args ...string) (*exec.Cmd, *serve.Client, *logBuffer) {
	t.Helper()
	cmd, log := serveChild(t, args...)
	ns := netnsArg(args)
	return cmd, waitAPI(t, serve.DefaultSocket(os.Getenv("RAMPART_STATE_ROOT"), ns), ns, log), log
}

// waitAPI waits up to 15 s for the service of ns to answer on sock.
func waitAPI(t *testing.T, sock, ns string, log *logBuffer) *serve.Client {
	t.Helper()
	for end := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, _ := serve.Dial(sock, ns); c != nil {
			return c
		}
		if time.Now().After(end) {
			t.Fatalf("rampart serve did not start:\n%s", log.String())
		}
	}
}

// netnsArg is the value of --netns in a command line ("" without).
func netnsArg(args []string) string {
	for i, a := range args {
		if a == "--netns" && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

func scrape(t *testing.T, port int) string {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// metric reads one sample of a scrape: name and a label substring.
func metric(t *testing.T, text, name, labels string) float64 {
	re := regexp.MustCompile(`(?m)^` + name + `\{([^}]*)\} (\S+)$`)
	for _, m := range re.FindAllStringSubmatch(text, -1) {
		if strings.Contains(m[1], labels) {
			v, _ := strconv.ParseFloat(m[2], 64)
			return v
		}
	}
	return -1
}

// TestServe: the service applies the policy, reloads it when a list file
// is replaced and on SIGHUP, keeps the running policy when the file is bad
// (counted), bans through its API with a TTL that it expires itself,
// attaches again to an interface deleted and created anew, exports the
// counters to Prometheus (checked by promtool), leaves the filter running
// when stopped, and after a "reboot" (the pins and state gone) restores
// the policy and the ban that has not expired.
func TestServe(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	dir := t.TempDir()
	list := filepath.Join(dir, "block.txt")
	os.WriteFile(list, []byte("192.0.2.0/24\n"), 0o644)
	pol := filepath.Join(dir, "policy.yaml")
	polText := "lists:\n  block: {files: [block.txt]}\nrules:\n  - {name: block, src: block, proto: udp, action: drop}\ndefault: pass\n"
	os.WriteFile(pol, []byte(polText), 0o644)
	port := freePort(t)
	persist := filepath.Join(dir, "var")
	args := []string{"--netns", p.NsB, "-f", pol, "--iface", p.IfB, "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--persist", persist}
	cmd, api, log := startServe(t, args...)
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })

	rx := testutil.UDPListener(t, p.NsB, p.B4, 9300)
	arrive := func() int {
		testutil.SendUDP(t, p.NsA, p.B4, 9300, 20)
		return testutil.CountUDP(rx, 200*time.Millisecond)
	}
	eventually := func(what string, ok func() bool) {
		t.Helper()
		for end := time.Now().Add(3 * time.Second); !ok(); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%s: not within 3 s\n%s", what, log.String())
			}
		}
	}
	if n := arrive(); n != 20 {
		t.Fatalf("before any ban %d of 20 arrived", n)
	}
	// The list file replaced, as a deploy tool does: by a rename.
	os.WriteFile(list+".new", []byte("192.0.2.0/24\n"+p.A4.String()+"\n"), 0o644)
	os.Rename(list+".new", list)
	eventually("the list file's new entry drops", func() bool { return arrive() == 0 })

	// A bad policy: logged, counted, the running policy stays.
	os.WriteFile(pol, []byte("rules:\n  - {name: block, src: block, action: dorp}\n"), 0o644)
	eventually("the bad file counted", func() bool { return metric(t, scrape(t, port), "rampart_reloads_total", `result="failure"`) == 1 })
	if n := arrive(); n != 0 {
		t.Errorf("after a bad policy file %d of 20 arrived: the running policy must stay", n)
	}
	if !strings.Contains(log.String(), "policy.yaml:2") {
		t.Errorf("the log does not locate the error:\n%s", log.String())
	}
	// Fixed, without the address in the list; SIGHUP reloads too.
	os.WriteFile(list, []byte("192.0.2.0/24\n"), 0o644)
	os.WriteFile(pol, []byte(polText), 0o644)
	eventually("the fixed policy applied", func() bool { return arrive() == 20 })
	before := metric(t, scrape(t, port), "rampart_reloads_total", `result="success"`)
	cmd.Process.Signal(syscall.SIGHUP)
	eventually("SIGHUP reloads", func() bool {
		return metric(t, scrape(t, port), "rampart_reloads_total", `result="success"`) == before+1
	})

	// A ban with a TTL through the API, expired by the service itself.
	var banned struct{ Expires time.Time }
	if err := api.Do("POST", "/v1/ban", serve.BanRequest{List: "block", Prefixes: []string{p.A4.String()}, TTL: "2s"}, &banned); err != nil {
		t.Fatal(err)
	}
	if n := arrive(); n != 0 {
		t.Errorf("after the ban %d of 20 arrived", n)
	}
	eventually("the ban expires", func() bool { return arrive() == 20 })
	if out, _ := exec.Command("pgrep", "-f", "list-expire").Output(); len(out) > 0 {
		t.Errorf("a separate expiry process runs while the service does: %s", out)
	}

	// Prometheus: the rule's counters, checked by promtool.
	text := scrape(t, port)
	if v := metric(t, text, "rampart_rule_packets_total", `rule="block"`); v < 40 {
		t.Errorf("rampart_rule_packets_total{rule=block} = %v, want the ≥ 40 dropped", v)
	}
	if promtool, err := exec.LookPath("promtool"); err == nil {
		c := exec.Command(promtool, "check", "metrics")
		c.Stdin = strings.NewReader(text)
		if out, err := c.CombinedOutput(); err != nil {
			t.Errorf("promtool check metrics: %v\n%s", err, out)
		}
	} else {
		t.Error("promtool is needed (Debian package prometheus; scripts/setup.sh installs it)")
	}

	// A real Prometheus server scrapes the service and answers a query.
	queryPrometheus(t, port, `rampart_rule_packets_total{rule="block"}`, 40)

	// The interface deleted and created again: attached within a second.
	testutil.Run(t, "ip", "-n", p.NsB, "link", "del", p.IfB)
	testutil.Run(t, "ip", "-n", p.NsA, "link", "add", p.IfA, "type", "veth", "peer", "name", p.IfB, "netns", p.NsB)
	testutil.Run(t, "ip", "-n", p.NsA, "addr", "add", p.A4.String()+"/24", "dev", p.IfA)
	testutil.Run(t, "ip", "-n", p.NsB, "addr", "add", p.B4.String()+"/24", "dev", p.IfB)
	testutil.Run(t, "ip", "-n", p.NsA, "link", "set", p.IfA, "up")
	testutil.Run(t, "ip", "-n", p.NsB, "link", "set", p.IfB, "up")
	start := time.Now()
	eventually("attached to the new interface", func() bool {
		var st struct{ Hooks []struct{ Attached bool } }
		api.Do("GET", "/v1/status", nil, &st)
		return len(st.Hooks) == 1 && st.Hooks[0].Attached
	})
	t.Logf("attached again %v after the interface came back", time.Since(start).Round(time.Millisecond))
	if time.Since(start) > time.Second {
		t.Errorf("attached again after %v, want within a second", time.Since(start))
	}

	// Stopped: the filter stays. Then a "reboot": pins and state gone; the
	// next start restores the policy and the unexpired ban.
	if err := api.Do("POST", "/v1/ban", serve.BanRequest{List: "block", Prefixes: []string{"198.51.100.7"}, TTL: "1h"}, &banned); err != nil {
		t.Fatal(err)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	var st statusJSON
	jsonOf(t, &st, "status", "--netns", p.NsB)
	if len(st.Hooks) != 1 || !st.Hooks[0].Attached {
		t.Fatalf("after the service stopped: %+v, want the filter running", st.Hooks)
	}
	mustRampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB)
	_, api, _ = startServe(t, args...)
	var changes struct {
		Changes []struct {
			List   string
			Prefix string
		}
	}
	if err := api.Do("GET", "/v1/changes", nil, &changes); err != nil {
		t.Fatal(err)
	}
	if len(changes.Changes) != 1 || changes.Changes[0].Prefix != "198.51.100.7/32" {
		t.Errorf("after the restart the live changes are %+v, want the 1 h ban back", changes.Changes)
	}
}

// queryPrometheus runs prometheus scraping 127.0.0.1:port every second and
// waits until its query API gives query a value of at least want.
func queryPrometheus(t *testing.T, port int, query string, want float64) {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus is needed (Debian package prometheus; scripts/setup.sh installs it)")
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "prometheus.yml")
	os.WriteFile(conf, []byte(fmt.Sprintf("global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: rampart\n    static_configs: [{targets: ['127.0.0.1:%d']}]\n", port)), 0o644)
	web := freePort(t)
	cmd := exec.Command(bin, "--config.file", conf, "--storage.tsdb.path", filepath.Join(dir, "data"), "--web.listen-address", fmt.Sprintf("127.0.0.1:%d", web))
	log := &logBuffer{}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	u := fmt.Sprintf("http://127.0.0.1:%d/api/v1/query?query=%s", web, url.QueryEscape(query))
	var last string
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		resp, err := http.Get(u)
		if err != nil {
			continue
		}
		var r struct {
			Data struct {
				Result []struct {
					Value [2]any `json:"value"`
				} `json:"result"`
			} `json:"data"`
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		last = string(b)
		if json.Unmarshal(b, &r) == nil && len(r.Data.Result) == 1 {
			if s, ok := r.Data.Result[0].Value[1].(string); ok {
				if v, _ := strconv.ParseFloat(s, 64); v >= want {
					t.Logf("prometheus: %s = %v", query, v)
					return
				}
			}
		}
	}
	t.Fatalf("prometheus never answered %s ≥ %v; last answer %s\n%s", query, want, last, log.String())
}

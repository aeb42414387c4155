package cli_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rampart-fw/rampart/internal/serve"
	"github.com/rampart-fw/rampart/internal/testutil"
)

// unitLine reads Key= from a systemd unit file.
func unitLine(t *testing.T, unit, key string) string {
	f, err := os.Open(unit)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+"="); ok && v != "" {
			return v
		}
	}
	t.Fatalf("%s has no %s", unit, key)
	return ""
}

// TestDebPackage builds the package with make deb, installs it with dpkg,
// runs the unit's command line (its ExecStart, with only the unit's
// capabilities, no systemctl) against a namespace's interface, then
// removes the package: nothing is left but the configuration.
func TestDebPackage(t *testing.T) {
	testutil.Privileged(t)
	if out, err := exec.Command("dpkg-query", "-W", "rampart").CombinedOutput(); err == nil {
		t.Fatalf("a rampart package is installed already (%s): this test installs and removes its own", strings.TrimSpace(string(out)))
	}
	build := exec.Command("make", "--no-print-directory", "deb")
	build.Dir = "../.."
	out, err := build.CombinedOutput()
	if err != nil {
		t.Fatalf("make deb: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	deb := filepath.Join("../..", lines[len(lines)-1])
	t.Cleanup(func() { exec.Command("dpkg", "--purge", "rampart").Run() })
	testutil.Run(t, "dpkg", "-i", deb)
	for _, f := range []string{"/usr/sbin/rampart", "/lib/systemd/system/rampart.service", "/etc/rampart/policy.yaml", "/etc/default/rampart",
		"/usr/share/bash-completion/completions/rampart", "/usr/share/zsh/vendor-completions/_rampart", "/usr/share/man/man8/rampart-serve.8.gz",
		"/usr/share/doc/rampart/fail2ban/rampart.conf"} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("installed: %v", err)
		}
	}

	// The unit's command line, as systemd would run it.
	unit := "/lib/systemd/system/rampart.service"
	p := testutil.NewPair(t)
	port := freePort(t)
	args := fmt.Sprintf("--netns %s --iface %s --listen 127.0.0.1:%d --persist %s", p.NsB, p.IfB, port, t.TempDir())
	execStart := strings.ReplaceAll(unitLine(t, unit, "ExecStart"), "$RAMPART_ARGS", args)
	var caps []string
	for _, c := range strings.Fields(unitLine(t, unit, "CapabilityBoundingSet")) {
		caps = append(caps, "+"+strings.ToLower(strings.TrimPrefix(c, "CAP_")))
	}
	cmd := exec.Command("setpriv", append([]string{"--bounding-set", "-all," + strings.Join(caps, ","), "--"}, strings.Fields(execStart)...)...)
	log := &logBuffer{}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })
	sock := serve.DefaultSocket(os.Getenv("RAMPART_STATE_ROOT"), p.NsB)
	var api *serve.Client
	for end := time.Now().Add(15 * time.Second); api == nil; time.Sleep(100 * time.Millisecond) {
		if api, _ = serve.Dial(sock, p.NsB); api == nil && time.Now().After(end) {
			t.Fatalf("%s did not start:\n%s", execStart, log.String())
		}
	}
	var st struct{ Hooks []struct{ Attached bool } }
	if err := api.Do("GET", "/v1/status", nil, &st); err != nil || len(st.Hooks) != 1 || !st.Hooks[0].Attached {
		t.Fatalf("the service's hooks: %+v %v\n%s", st.Hooks, err, log.String())
	}
	if text := scrape(t, port); metric(t, text, "rampart_rule_packets_total", `rule="drop-blocklist"`) < 0 {
		t.Errorf("the packaged service exports no counter for the example policy's rules:\n%s", text)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("the service's exit: %v\n%s", err, log.String())
	}

	testutil.Run(t, "dpkg", "-r", "rampart")
	for _, f := range []string{"/usr/sbin/rampart", "/lib/systemd/system/rampart.service", "/usr/share/man/man8/rampart-serve.8.gz"} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("left after dpkg -r: %s (%v)", f, err)
		}
	}
	for _, f := range []string{"/etc/rampart/policy.yaml", "/etc/default/rampart"} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("configuration removed by dpkg -r: %v", err)
		}
	}
	if out, _ := exec.Command("dpkg-query", "-W", "-f", "${Status}", "rampart").Output(); string(out) != "deinstall ok config-files" {
		t.Errorf("after dpkg -r the package is %q, want only its configuration left", out)
	}
}

package cli_test

import (
	"errors"
	"fmt"
	"net"
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

// serveChild starts rampart serve as a child process, its log in the builder.
func serveChild(t *testing.T, args ...string) (*exec.Cmd, *logBuffer) {
	t.Helper()
	exe, _ := os.Executable()
	cmd := exec.Command(exe, append([]string{"serve"}, args...)...)
	cmd.Env = append(os.Environ(), "RAMPART_TEST_AS_CLI=1")
	log := &logBuffer{}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, log
}

// serveAt runs rampart serve with its API on sock and waits until it
// answers there.
func serveAt(t *testing.T, sock string, args ...string) (*exec.Cmd, *serve.Client, *logBuffer) {
	t.Helper()
	cmd, log := serveChild(t, append([]string{"--api", sock}, args...)...)
	return cmd, waitAPI(t, sock, netnsArg(args), log), log
}

// serveRefused runs rampart serve and wants it to fail at start: it
// returns the log. A service that still runs after 15 s is a failure.
func serveRefused(t *testing.T, args ...string) string {
	t.Helper()
	cmd, log := serveChild(t, args...)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("rampart serve %v exited 0, want a failure:\n%s", args, log.String())
		}
	case <-time.After(15 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("rampart serve %v started, want it refused:\n%s", args, log.String())
	}
	return log.String()
}

// noHooks fails when rampart runs on any hook of the namespace.
func noHooks(t *testing.T, ns, when string) {
	t.Helper()
	for _, h := range hookStatus(t, ns).Hooks {
		if h.Attached {
			t.Errorf("%s: the filter is attached on %s: nothing may change on the host", when, h.Iface)
		}
	}
}

// reloadCounts reads the service's reloads (the first apply included).
func reloadCounts(t *testing.T, api *serve.Client) (ok, failed int) {
	t.Helper()
	var st struct{ Reloads map[string]int }
	if err := api.Do("GET", "/v1/status", nil, &st); err != nil {
		t.Fatal(err)
	}
	return st.Reloads["success"], st.Reloads["failure"]
}

// listEntries reads rampart_list_entries of a list's IPv4 ranges.
func listEntries(t *testing.T, port int, list string) float64 {
	return metric(t, scrape(t, port), "rampart_list_entries", fmt.Sprintf(`family="4",list="%s"`, list))
}

func waitUntil(t *testing.T, log *logBuffer, what string, ok func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !ok(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: not within 5 s\n%s", what, log.String())
		}
	}
}

func writeText(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

const blockPolicy = "lists:\n  bl: {files: [bl.txt]}\nrules:\n  - {name: bl, src: bl, proto: udp, action: drop}\ndefault: pass\n"

// writeBlockPolicy writes blockPolicy and its list (192.0.2.0/24) into dir
// and returns the policy's path.
func writeBlockPolicy(t *testing.T, dir string) string {
	writeText(t, filepath.Join(dir, "bl.txt"), "192.0.2.0/24\n")
	pol := filepath.Join(dir, "policy.yaml")
	writeText(t, pol, blockPolicy)
	return pol
}

// TestServeListWrittenInPlace: a list file written in place, with a pause
// in the middle of a line, is not read until its writer closes it, even
// when another watched file changes meanwhile; then it is applied whole.
func TestServeListWrittenInPlace(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	dir := t.TempDir()
	bl := filepath.Join(dir, "bl.txt")
	writeText(t, bl, "192.0.2.0/24\n")
	pol := filepath.Join(dir, "policy.yaml")
	writeText(t, pol, blockPolicy)
	port := freePort(t)
	_, api, log := serveAt(t, filepath.Join(dir, "api.sock"), "--netns", p.NsB, "-f", pol, "--iface", p.IfB,
		"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--persist", filepath.Join(dir, "var"))
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })

	f, err := os.OpenFile(bl, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.WriteString("192.0.2.0/24\n10.99.7.0/2")
	time.Sleep(1500 * time.Millisecond)
	if ok, failed := reloadCounts(t, api); ok != 1 || failed != 0 {
		t.Errorf("while bl.txt is open for writing: %d reloads applied and %d failed since the start, want none\n%s", ok-1, failed, log.String())
	}
	// Another watched file changes meanwhile: still nothing reads bl.txt.
	writeText(t, pol, blockPolicy)
	time.Sleep(1500 * time.Millisecond)
	if ok, failed := reloadCounts(t, api); ok != 1 || failed != 0 {
		t.Errorf("after the policy changed while bl.txt is open for writing: %d reloads applied and %d failed, want none\n%s", ok-1, failed, log.String())
	}
	f.WriteString("4\n")
	f.Close()
	waitUntil(t, log, "bl.txt applied once closed", func() bool { return listEntries(t, port, "bl") == 2 })
	if _, failed := reloadCounts(t, api); failed != 0 {
		t.Errorf("%d reloads failed, want none\n%s", failed, log.String())
	}
}

// TestServeSymlinkedLists: list files reached through symbolic links are
// reloaded when what the links resolve to changes: a Kubernetes
// ConfigMap's ..data swap (twice), a link's target replaced by a rename or
// written in place in another directory, and the target of a link pointed
// elsewhere.
func TestServeSymlinkedLists(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "cfg")
	other := filepath.Join(dir, "other")
	other2 := filepath.Join(dir, "other2")
	for _, d := range []string{filepath.Join(cfg, "..2024_a"), other, other2} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A ConfigMap volume: cfg/bl.txt → ..data/bl.txt, ..data → ..2024_a.
	writeText(t, filepath.Join(cfg, "..2024_a", "bl.txt"), "192.0.2.0/24\n")
	mustSymlink(t, "..2024_a", filepath.Join(cfg, "..data"))
	mustSymlink(t, "..data/bl.txt", filepath.Join(cfg, "bl.txt"))
	// ext.txt → other/ext.txt, in another directory.
	writeText(t, filepath.Join(other, "ext.txt"), "100.64.1.0/24\n")
	mustSymlink(t, filepath.Join(other, "ext.txt"), filepath.Join(dir, "ext.txt"))
	pol := filepath.Join(dir, "policy.yaml")
	writeText(t, pol, "lists:\n  bl: {files: [cfg/bl.txt]}\n  ext: {files: [ext.txt]}\nrules:\n"+
		"  - {name: bl, src: bl, proto: udp, action: drop}\n  - {name: ext, src: ext, proto: udp, action: drop}\ndefault: pass\n")
	port := freePort(t)
	_, _, log := serveAt(t, filepath.Join(dir, "api.sock"), "--netns", p.NsB, "-f", pol, "--iface", p.IfB,
		"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--persist", filepath.Join(dir, "var"))
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })
	if n := listEntries(t, port, "bl"); n != 1 {
		t.Fatalf("bl has %v entries at start, want 1", n)
	}

	// The ConfigMap updated as the kubelet does: a new directory, a new
	// ..data link renamed over the old one, the old directory removed.
	swap := func(from, to, text string) {
		writeText(t, filepath.Join(cfg, to, "bl.txt"), text)
		mustSymlink(t, to, filepath.Join(cfg, "..data_tmp"))
		if err := os.Rename(filepath.Join(cfg, "..data_tmp"), filepath.Join(cfg, "..data")); err != nil {
			t.Fatal(err)
		}
		os.RemoveAll(filepath.Join(cfg, from))
	}
	os.Mkdir(filepath.Join(cfg, "..2024_b"), 0o755)
	swap("..2024_a", "..2024_b", "192.0.2.0/24\n198.51.100.0/24\n")
	waitUntil(t, log, "the ConfigMap's ..data swap reloaded", func() bool { return listEntries(t, port, "bl") == 2 })
	os.Mkdir(filepath.Join(cfg, "..2024_c"), 0o755)
	swap("..2024_b", "..2024_c", "192.0.2.0/24\n198.51.100.0/24\n203.0.113.0/24\n")
	waitUntil(t, log, "a second ..data swap reloaded", func() bool { return listEntries(t, port, "bl") == 3 })

	// The link's target replaced by a rename in its own directory.
	writeText(t, filepath.Join(other, "ext.txt.new"), "100.64.1.0/24\n100.64.3.0/24\n")
	if err := os.Rename(filepath.Join(other, "ext.txt.new"), filepath.Join(other, "ext.txt")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, log, "the link's target renamed over reloaded", func() bool { return listEntries(t, port, "ext") == 2 })
	// The target written in place.
	writeText(t, filepath.Join(other, "ext.txt"), "100.64.1.0/24\n100.64.3.0/24\n100.64.5.0/24\n")
	waitUntil(t, log, "the link's target written in place reloaded", func() bool { return listEntries(t, port, "ext") == 3 })
	// The link pointed to another directory; then that target written.
	writeText(t, filepath.Join(other2, "ext.txt"), "100.64.1.0/24\n")
	mustSymlink(t, filepath.Join(other2, "ext.txt"), filepath.Join(dir, "ext.tmp"))
	if err := os.Rename(filepath.Join(dir, "ext.tmp"), filepath.Join(dir, "ext.txt")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, log, "the link pointed elsewhere reloaded", func() bool { return listEntries(t, port, "ext") == 1 })
	writeText(t, filepath.Join(other2, "ext.txt"), "100.64.1.0/24\n100.64.7.0/24\n")
	waitUntil(t, log, "the new target written reloaded", func() bool { return listEntries(t, port, "ext") == 2 })
}

func mustSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// TestServeBindsBeforeApply: a --listen address in use stops serve before
// it changes anything on the host.
func TestServeBindsBeforeApply(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	dir := t.TempDir()
	pol := writeBlockPolicy(t, dir)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })
	log := serveRefused(t, "--netns", p.NsB, "-f", pol, "--iface", p.IfB, "--listen", busy.Addr().String(),
		"--api", filepath.Join(dir, "api.sock"), "--persist", filepath.Join(dir, "var"))
	if !strings.Contains(log, "--listen") {
		t.Errorf("the error does not name --listen:\n%s", log)
	}
	noHooks(t, p.NsB, "after --listen failed")
	if _, err := os.Lstat(filepath.Join(dir, "api.sock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after --listen failed the API socket is left behind: %v", err)
	}
}

// TestServeAPISocketPath: --api refuses a regular file and a socket that
// answers (another service's), replaces a stale one, and on exit removes
// only the socket the service created.
func TestServeAPISocketPath(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	dir := t.TempDir()
	pol := writeBlockPolicy(t, dir)
	sock := filepath.Join(dir, "api.sock")
	args := []string{"--netns", p.NsB, "-f", pol, "--iface", p.IfB, "--listen", "", "--persist", filepath.Join(dir, "var")}
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })

	// A regular file: refused, kept.
	writeText(t, sock, "precious\n")
	log := serveRefused(t, append([]string{"--api", sock}, args...)...)
	if !strings.Contains(log, "--api") || !strings.Contains(log, "not a socket") {
		t.Errorf("the error does not name --api and say it is not a socket:\n%s", log)
	}
	if b, _ := os.ReadFile(sock); string(b) != "precious\n" {
		t.Errorf("the regular file at --api now holds %q", b)
	}
	noHooks(t, p.NsB, "after --api was refused")
	os.Remove(sock)

	// A stale socket (its process gone): replaced.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	first, api, slog := serveAt(t, sock, args...)

	// A second service on the same socket: refused; the first still answers.
	log2 := serveRefused(t, append([]string{"--api", sock}, args...)...)
	if !strings.Contains(log2, "--api") || !strings.Contains(log2, "answers") {
		t.Errorf("the second service's error does not name --api and say a process answers there:\n%s", log2)
	}
	if err := api.Do("GET", "/v1/status", nil, &struct{}{}); err != nil {
		t.Errorf("after a second serve tried its socket the first no longer answers: %v\n%s", err, slog.String())
	}

	// The path taken over by another socket while the service runs: the
	// service leaves it when it stops.
	os.Remove(sock)
	other, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	first.Process.Signal(syscall.SIGTERM)
	first.Wait()
	if fi, err := os.Lstat(sock); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Errorf("the service removed a socket it did not create when it stopped: %v\n%s", err, slog.String())
	}
}

// TestServeAPIPeerCredentials: the API answers root and the members of
// --api-group, by the credentials of the process at the other end, not by
// the socket's mode: an unprivileged user gets 403 (counted) even through
// a socket made world-writable.
func TestServeAPIPeerCredentials(t *testing.T) {
	testutil.Privileged(t)
	for _, tool := range []string{"setpriv", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed (util-linux, curl)", tool)
		}
	}
	p := testutil.NewPair(t)
	dir := t.TempDir()
	pol := writeBlockPolicy(t, dir)
	// A directory every user can search: only the socket guards the API.
	apiDir, err := os.MkdirTemp("", "rampart-api-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(apiDir)
	os.Chmod(apiDir, 0o755)
	sock := filepath.Join(apiDir, "api.sock")
	port := freePort(t)
	args := []string{"--netns", p.NsB, "-f", pol, "--iface", p.IfB, "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--persist", filepath.Join(dir, "var")}
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })

	// curlAs posts a ban as uid 65534 with the given group options and
	// returns the HTTP status ("000" when it cannot connect).
	curlAs := func(prefix string, groups ...string) string {
		t.Helper()
		args := append([]string{"--reuid", "65534"}, groups...)
		args = append(args, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--unix-socket", sock,
			"-d", `{"list":"bl","prefixes":["`+prefix+`"]}`, "http://rampart/v1/ban")
		out, _ := exec.Command("setpriv", args...).Output()
		return string(out)
	}
	changes := func(api *serve.Client) int {
		t.Helper()
		var c struct{ Changes []any }
		if err := api.Do("GET", "/v1/changes", nil, &c); err != nil {
			t.Fatal(err)
		}
		return len(c.Changes)
	}
	mode := func() (os.FileMode, uint32) {
		fi, err := os.Lstat(sock)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode().Perm(), fi.Sys().(*syscall.Stat_t).Gid
	}

	// Root only: 0600 from the start; made 0666, still 403 for others.
	cmd, api, log := serveAt(t, sock, args...)
	if m, _ := mode(); m != 0o600 {
		t.Errorf("the API socket is %v, want 0600", m)
	}
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	if code := curlAs("0.0.0.0/0", "--regid", "65534", "--clear-groups"); code != "403" {
		t.Errorf("uid 65534 through a 0666 socket got HTTP %s, want 403", code)
	}
	if n := changes(api); n != 0 {
		t.Errorf("after uid 65534's request %d live list changes, want none", n)
	}
	if v := unlabeled(scrape(t, port), "rampart_api_refused_total"); v != 1 {
		t.Errorf("rampart_api_refused_total = %v, want 1\n%s", v, log.String())
	}
	if !strings.Contains(log.String(), "uid=65534") {
		t.Errorf("the refusal is not logged with the uid:\n%s", log.String())
	}
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()

	// --api-group adm: the socket is 0660 root:adm; a member (by a
	// supplementary or the primary group) is answered, others are not.
	_, api, log = serveAt(t, sock, append(args, "--api-group", "adm")...)
	if m, gid := mode(); m != 0o660 || gid != 4 {
		t.Errorf("with --api-group adm the socket is %v group %d, want 0660 group 4 (adm)", m, gid)
	}
	if code := curlAs("198.51.100.7", "--regid", "65534", "--groups", "4"); code != "200" {
		t.Errorf("uid 65534 in group adm (supplementary) got HTTP %s, want 200\n%s", code, log.String())
	}
	if code := curlAs("198.51.100.8", "--regid", "4", "--clear-groups"); code != "200" {
		t.Errorf("uid 65534 with primary group adm got HTTP %s, want 200\n%s", code, log.String())
	}
	if code := curlAs("0.0.0.0/0", "--regid", "65534", "--clear-groups"); code != "000" {
		t.Errorf("uid 65534 outside adm reached the 0660 socket: HTTP %s", code)
	}
	os.Chmod(sock, 0o666)
	if code := curlAs("0.0.0.0/0", "--regid", "65534", "--clear-groups"); code != "403" {
		t.Errorf("uid 65534 outside adm through a 0666 socket got HTTP %s, want 403", code)
	}
	if n := changes(api); n != 2 {
		t.Errorf("%d live list changes, want the members' 2", n)
	}
}

// unlabeled reads a sample without labels from a scrape, -1 if absent.
func unlabeled(text, name string) float64 {
	m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindStringSubmatch(text)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// TestServeSIGHUPBurst: a burst of 100 SIGHUPs is taken as a few reloads,
// not 100 queued ones (signals that arrive while one runs are one more),
// and the service still answers and filters afterwards.
func TestServeSIGHUPBurst(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	pol := writeFile(t, "p.yaml", "rules:\n  - {name: d, proto: udp, dport: 9000, action: drop}\n")
	port := freePort(t)
	cmd, api, log := startServe(t, "--netns", p.NsB, "-f", pol, "--iface", p.IfB, "--listen", fmt.Sprintf("127.0.0.1:%d", port))
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })
	ok := func() float64 { return metric(t, scrape(t, port), "rampart_reloads_total", `result="success"`) }
	before := ok()
	for range 100 {
		cmd.Process.Signal(syscall.SIGHUP)
	}
	// Quiet for a second: the burst has been taken.
	last := ok()
	for quiet := time.Now(); time.Since(quiet) < time.Second; time.Sleep(100 * time.Millisecond) {
		if n := ok(); n != last {
			last, quiet = n, time.Now()
		}
	}
	t.Logf("100 SIGHUPs: %v reloads", last-before)
	if n := last - before; n < 1 || n > 5 {
		t.Errorf("100 SIGHUPs made %v reloads, want 1 to 5\n%s", n, log.String())
	}
	var st struct{ Hooks []any }
	if err := api.Do("GET", "/v1/status", nil, &st); err != nil || len(st.Hooks) != 1 {
		t.Fatalf("status after the burst: %+v, %v", st, err)
	}
	dropped := testutil.UDPListener(t, p.NsB, p.B4, 9000)
	testutil.SendUDP(t, p.NsA, p.B4, 9000, 50)
	if got := testutil.CountUDP(dropped, 300*time.Millisecond); got != 0 {
		t.Errorf("%d datagrams to the dropped port arrived after the burst", got)
	}
}

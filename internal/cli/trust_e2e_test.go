package cli_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/rampart-fw/rampart/internal/testutil"
)

// TestMoreUsageErrors: every one of these exited 0, or panicked.
func TestMoreUsageErrors(t *testing.T) {
	testutil.Privileged(t)
	pol := writeFile(t, "p.yaml", "rules: []\n")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"stats", "--watch", "--interval", "0s"}, "--interval 0s"},
		{[]string{"--netns", "nosuchns", "status"}, `network namespace "nosuchns"`},
		{[]string{"detach", "--iface", "nosuch0"}, "--iface nosuch0: no such interface"},
		{[]string{"apply", "-f", pol, "--iface", "lo", "--confirm", "0s"}, "--confirm 0s"},
		{[]string{"list", "add", "x", "192.0.2.1", "--ttl", "0s"}, "--ttl 0s"},
	} {
		_, err := rampart(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("rampart %v: error %v, want %q", c.args, err, c.want)
		}
	}
}

// TestCheckRefusesWhatApplyRefuses: over the table cap, or with a cap that
// is not a number, check fails as apply would.
func TestCheckRefusesWhatApplyRefuses(t *testing.T) {
	list := writeFile(t, "l.txt", "0.0.0.0/0\n10.0.0.1\n")
	pol := writeFile(t, "p.yaml", fmt.Sprintf("lists:\n  l: {files: [%s]}\nrules:\n  - {name: a, src: l, action: drop}\n", list))
	t.Setenv("RAMPART_MAX_TABLE_BYTES", "100000")
	if _, err := rampart(t, "check", "-f", pol); err == nil || !strings.Contains(err.Error(), "over RAMPART_MAX_TABLE_BYTES") {
		t.Errorf("check over the cap: %v", err)
	}
	t.Setenv("RAMPART_MAX_TABLE_BYTES", "lots")
	if _, err := rampart(t, "check", "-f", pol); err == nil || !strings.Contains(err.Error(), `RAMPART_MAX_TABLE_BYTES="lots"`) {
		t.Errorf("check with a bad cap: %v", err)
	}
}

// TestJSONErrors: with --json a failure is a JSON object too.
func TestJSONErrors(t *testing.T) {
	bad := writeFile(t, "bad.yaml", "rules:\n  - {name: a, proto: udp, dport: 70000, action: drop}\n")
	out, err := rampart(t, "check", "-f", bad, "--json")
	if err == nil {
		t.Fatal("a bad policy passed")
	}
	var doc struct {
		Error struct {
			Message, File, Field string
			Line                 int
		}
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("--json error output is not JSON: %v\n%s", err, out)
	}
	if doc.Error.Line != 2 || doc.Error.Field != "dport" || !strings.HasSuffix(doc.Error.File, "bad.yaml") || !strings.Contains(doc.Error.Message, "65535") {
		t.Errorf("JSON error: %+v", doc.Error)
	}
	if out, _ := rampart(t, "--json", "--netns", "nosuchns", "status"); !strings.Contains(out, `"error"`) {
		t.Errorf("--json before the command: %s", out)
	}
}

// TestConfirmScoped: confirm confirms its own namespace's applies only.
func TestConfirmScoped(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	pol := writeFile(t, "p.yaml", "rules: []\n")
	mustRampart(t, "apply", "-f", pol, "--netns", p.NsB, "--iface", p.IfB, "--confirm", "60s")
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })
	if _, err := rampart(t, "confirm"); err == nil || !strings.Contains(err.Error(), "no apply is waiting") {
		t.Errorf("confirm in the host's namespace: %v, want nothing to confirm", err)
	}
	if st := hookStatus(t, p.NsB); len(st.Hooks) != 1 || !strings.HasPrefix(hookState(t, p.NsB), "unconfirmed") {
		t.Errorf("the namespace's apply is no longer pending: %+v", st)
	}
	mustRampart(t, "confirm", "--netns", p.NsB)
	if s := hookState(t, p.NsB); s != "active" {
		t.Errorf("after confirm --netns: %s", s)
	}
}

func hookState(t *testing.T, ns string) string {
	var s struct{ Hooks []struct{ State string } }
	jsonOf(t, &s, "status", "--netns", ns)
	if len(s.Hooks) == 0 {
		return ""
	}
	return s.Hooks[0].State
}

// TestListChangesEnd: a change without a TTL is listed, reverted, flushed,
// and ended by detach; apply says when changes override the file.
func TestListChangesEnd(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	list := writeFile(t, "block.txt", p.A4.String()+"\n")
	pol := writeFile(t, "p.yaml", fmt.Sprintf("lists:\n  block: {files: [%s]}\nrules:\n  - {name: block, src: block, proto: udp, action: drop}\ndefault: pass\n", list))
	ns := []string{"--netns", p.NsB}
	apply := func() string { return mustRampart(t, append([]string{"apply", "-f", pol, "--iface", p.IfB}, ns...)...) }
	apply()
	t.Cleanup(func() { rampart(t, append([]string{"detach", "--iface", p.IfB}, ns...)...) })
	rx := testutil.UDPListener(t, p.NsB, p.B4, 9300)
	arrive := func() int {
		testutil.SendUDP(t, p.NsA, p.B4, 9300, 20)
		return testutil.CountUDP(rx, 300*time.Millisecond)
	}
	if got := arrive(); got != 0 {
		t.Fatalf("the listed source got %d datagrams through", got)
	}
	mustRampart(t, append([]string{"list", "del", "block", p.A4.String()}, ns...)...)
	if got := arrive(); got != 20 {
		t.Fatalf("after list del %d of 20 arrived", got)
	}
	if out := apply(); !strings.Contains(out, "1 live list changes override the list files") {
		t.Errorf("apply does not say a change overrides the file:\n%s", out)
	}
	if got := arrive(); got != 20 {
		t.Fatalf("after a re-apply the del was lost: %d of 20 arrived", got)
	}
	var rev struct {
		Reverted []struct{ List, Prefix string }
	}
	jsonOf(t, &rev, append([]string{"list", "revert", "block", p.A4.String()}, ns...)...)
	if len(rev.Reverted) != 1 || rev.Reverted[0].List != "block" {
		t.Errorf("list revert: %+v", rev)
	}
	if got := arrive(); got != 0 {
		t.Fatalf("after list revert %d arrived: the file holds again", got)
	}
	if _, err := rampart(t, append([]string{"list", "revert", "block"}, ns...)...); err == nil {
		t.Error("reverting when nothing matches should say so")
	}

	mustRampart(t, append([]string{"list", "del", "block", p.A4.String()}, ns...)...)
	mustRampart(t, append([]string{"list", "flush"}, ns...)...)
	if got := arrive(); got != 0 {
		t.Fatalf("after list flush %d arrived", got)
	}

	mustRampart(t, append([]string{"list", "del", "block", p.A4.String()}, ns...)...)
	mustRampart(t, append([]string{"detach", "--iface", p.IfB}, ns...)...)
	var show struct{ Changes []any }
	jsonOf(t, &show, append([]string{"list", "show"}, ns...)...)
	if len(show.Changes) != 0 {
		t.Errorf("detach kept the changes: %+v", show)
	}
	apply()
	if got := arrive(); got != 0 {
		t.Fatalf("a change outlived detach: %d arrived after a fresh apply", got)
	}
}

// TestDetachWithoutBPFFS: in a mount namespace without the host's bpffs,
// the pins are out of sight; detach refuses, naming bpffs, and changes
// nothing.
func TestDetachWithoutBPFFS(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	pol := writeFile(t, "p.yaml", "rules: []\n")
	mustRampart(t, "apply", "-f", pol, "--netns", p.NsB, "--iface", p.IfB)
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })
	exe, _ := os.Executable()
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c",
		fmt.Sprintf("umount -l %s && exec %s detach --netns %s --iface %s", testutil.BPFFS, exe, p.NsB, p.IfB))
	cmd.Env = append(os.Environ(), "RAMPART_TEST_AS_CLI=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "bpffs") || !strings.Contains(string(out), "nothing was") {
		t.Fatalf("detach without bpffs: %v\n%s", err, out)
	}
	if s := hookState(t, p.NsB); s != "active" {
		t.Errorf("after the refused detach the hook is %q", s)
	}
	if link := testutil.Run(t, "ip", "-n", p.NsB, "link", "show", p.IfB); !strings.Contains(link, "xdp") {
		t.Errorf("the program is gone: %s", link)
	}
}

// TestReadmeTour runs the README's tour as written, on an interface named
// eth0 in a namespace of the test's own (--netns added to every line). The
// streaming and long lines (stats --watch, bench, lab) have tests of their
// own.
func TestReadmeTour(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	testutil.Run(t, "ip", "-n", p.NsB, "link", "set", p.IfB, "down")
	testutil.Run(t, "ip", "-n", p.NsB, "link", "set", p.IfB, "name", "eth0")
	testutil.Run(t, "ip", "-n", p.NsB, "link", "set", "eth0", "up")
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", "eth0") })
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	tour := string(readme)[strings.Index(string(readme), "## A short tour"):]
	tour = tour[:strings.Index(tour, "```\n\n")]
	t.Chdir("../..") // the tour's paths are the repository's
	ran := 0
	for _, line := range strings.Split(tour, "\n") {
		args := strings.Fields(line)
		if len(args) < 2 || args[0] != "./rampart" || line == "./rampart stats --watch" || args[1] == "bench" || args[1] == "lab" {
			continue
		}
		if out, err := rampart(t, append(args[1:], "--netns", p.NsB)...); err != nil {
			t.Fatalf("%s: %v\n%s", line, err, out)
		}
		ran++
	}
	if ran < 10 {
		t.Fatalf("ran %d lines of the tour", ran)
	}
}

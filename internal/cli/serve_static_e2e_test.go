package cli_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rampart-fw/rampart/internal/policy"
	"github.com/rampart-fw/rampart/internal/serve"
	"github.com/rampart-fw/rampart/internal/testutil"
)

// TestServeStaticLists: past 63 ways of naming lists, a list named last
// takes no bit; a ban into it through the API is taken all the same (the
// service reloads, and the list takes a bit from then on), and after a
// "reboot" (pins and state gone) the saved ban comes back into it, real
// datagrams from the banned A dropped each time.
func TestServeStaticLists(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	dir := t.TempDir()
	var lists, rules strings.Builder
	for i := range policy.MaxLists + 7 {
		fmt.Fprintf(&lists, "  c%d: {prefixes: [198.51.100.%d/32]}\n", i, i)
		fmt.Fprintf(&rules, "  - {name: r%d, src: c%d, proto: udp, action: drop}\n", i, i)
	}
	pol := filepath.Join(dir, "policy.yaml")
	os.WriteFile(pol, []byte("lists:\n"+lists.String()+"rules:\n"+rules.String()+"default: pass\n"), 0o644)
	last := fmt.Sprintf("c%d", policy.MaxLists+6)
	args := []string{"--netns", p.NsB, "-f", pol, "--iface", p.IfB, "--persist", filepath.Join(dir, "var")}
	cmd, api, log := startServe(t, args...)
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })

	var check struct {
		StaticLists int `json:"static_lists"`
	}
	jsonOf(t, &check, "check", "-f", pol)
	if check.StaticLists != 7 {
		t.Fatalf("check: %d static lists, want 7", check.StaticLists)
	}
	rx := testutil.UDPListener(t, p.NsB, p.B4, 9320)
	arrive := func() int {
		testutil.SendUDP(t, p.NsA, p.B4, 9320, 20)
		return testutil.CountUDP(rx, 200*time.Millisecond)
	}
	if n := arrive(); n != 20 {
		t.Fatalf("before the ban: %d of 20 datagrams from A arrived\n%s", n, log.String())
	}
	ban := serve.BanRequest{List: last, Prefixes: []string{p.A4.String()}, TTL: "1h"}
	var banned map[string]any
	if err := api.Do("POST", "/v1/ban", ban, &banned); err != nil {
		t.Fatalf("a ban into the static list %s: %v\n%s", last, err, log.String())
	}
	if n := arrive(); n != 0 {
		t.Errorf("after the ban into %s: %d of 20 datagrams from A arrived, want 0", last, n)
	}

	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	mustRampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB)
	_, api, log = startServe(t, args...)
	var changes struct {
		Changes []struct{ List, Prefix string }
	}
	if err := api.Do("GET", "/v1/changes", nil, &changes); err != nil {
		t.Fatal(err)
	}
	if len(changes.Changes) != 1 || changes.Changes[0].List != last {
		t.Errorf("after the restart the live changes are %+v, want the ban into %s back\n%s", changes.Changes, last, log.String())
	}
	if n := arrive(); n != 0 {
		t.Errorf("after the restart: %d of 20 datagrams from A arrived, want 0", n)
	}
}

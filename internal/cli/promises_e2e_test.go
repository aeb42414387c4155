package cli_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rampart-fw/rampart/internal/testutil"
)

// TestApplyRefusesOneInterfaceTwice: the same interface named twice, or
// under its name and an altname, is refused before anything changes (it
// used to apply two generations over one link and lose the state and pins
// of both, while the program kept running).
func TestApplyRefusesOneInterfaceTwice(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	pol := writeFile(t, "p.yaml", "rules:\n  - {name: d, proto: udp, dport: 9000, action: drop}\n")
	testutil.Run(t, "ip", "-n", p.NsB, "link", "property", "add", "dev", p.IfB, "altname", "rpt-alt")
	for _, c := range []struct {
		ifaces []string
		want   string
	}{
		{[]string{p.IfB, p.IfB}, "--iface " + p.IfB + " is given twice"},
		{[]string{p.IfB, "rpt-alt"}, "--iface " + p.IfB + " and --iface rpt-alt are one interface"},
	} {
		args := []string{"apply", "-f", pol, "--netns", p.NsB}
		for _, i := range c.ifaces {
			args = append(args, "--iface", i)
		}
		if _, err := rampart(t, args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("apply %v: %v, want %q", c.ifaces, err, c.want)
		}
		if st := hookStatus(t, p.NsB); len(st.Hooks) != 0 {
			t.Errorf("a refused apply left hooks: %+v", st.Hooks)
		}
	}
}

// TestStatusUnreadableState: an empty or cut generation record makes
// status say so (state-unreadable, the file, the fix) and fail, instead of
// "active" with no mode and a zero date.
func TestStatusUnreadableState(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	pol := writeFile(t, "p.yaml", "rules:\n  - {name: d, proto: udp, dport: 9000, action: drop}\n")
	mustRampart(t, "apply", "-f", pol, "--netns", p.NsB, "--iface", p.IfB)
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })
	gen := filepath.Join(os.Getenv("RAMPART_STATE_ROOT"), "netns-"+p.NsB, p.IfB, "ingress", "gen-1.json")
	for _, content := range []string{"", "{}", `{"generation": 1, "mo`} {
		if err := os.WriteFile(gen, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := rampart(t, "status", "--netns", p.NsB, "--json")
		if err == nil || !strings.Contains(err.Error(), "unreadable") {
			t.Errorf("record %q: status exited without an error (%v)", content, err)
		}
		var st struct {
			Hooks []struct{ State, Problem, Fix string }
			Error struct{ Message string }
		}
		if jerr := json.Unmarshal([]byte(out), &st); jerr != nil {
			t.Fatalf("record %q: status --json printed no one JSON document: %v\n%s", content, jerr, out)
		}
		if len(st.Hooks) != 1 || st.Hooks[0].State != "state-unreadable" || !strings.Contains(st.Hooks[0].Problem, gen) ||
			!strings.Contains(st.Hooks[0].Fix, "apply") || st.Error.Message == "" {
			t.Errorf("record %q: %+v", content, st)
		}
		human, _ := rampart(t, "status", "--netns", p.NsB)
		if strings.Contains(human, "0001-01-01") || !strings.Contains(human, "state-unreadable") {
			t.Errorf("record %q: status printed\n%s", content, human)
		}
	}
	// Applying again writes the record anew.
	mustRampart(t, "apply", "-f", pol, "--netns", p.NsB, "--iface", p.IfB)
	if st := hookStatus(t, p.NsB); len(st.Hooks) != 1 || st.Hooks[0].Mode == "" || !st.Hooks[0].Attached {
		t.Errorf("after a new apply: %+v", st)
	}
}

// TestClearErrors: native XDP refused for the MTU names the MTU, the
// driver's reason and the largest MTU it takes (it said "create link:
// numerical result out of range"); reattach of an interface rampart holds
// nothing on fails naming it (it said "every hook is attached", exit 0).
func TestClearErrors(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	pol := writeFile(t, "p.yaml", "rules:\n  - {name: d, proto: udp, dport: 9000, action: drop}\n")
	testutil.Run(t, "ip", "-n", p.NsA, "link", "set", p.IfA, "mtu", "9000")
	testutil.Run(t, "ip", "-n", p.NsB, "link", "set", p.IfB, "mtu", "9000")
	_, err := rampart(t, "apply", "-f", pol, "--netns", p.NsB, "--iface", p.IfB, "--mode", "xdp-native")
	if err == nil {
		t.Fatal("xdp-native at MTU 9000 on veth was applied")
	}
	for _, want := range []string{"the MTU of " + p.IfB + " (9000) is above what native XDP takes on this driver", "Peer MTU is too large", "the largest it takes is ", "--mode xdp-generic"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	// The largest it names is taken.
	var largest string
	if _, after, ok := strings.Cut(err.Error(), "the largest it takes is "); ok {
		largest, _, _ = strings.Cut(after, ":")
	}
	testutil.Run(t, "ip", "-n", p.NsA, "link", "set", p.IfA, "mtu", largest)
	testutil.Run(t, "ip", "-n", p.NsB, "link", "set", p.IfB, "mtu", largest)
	mustRampart(t, "apply", "-f", pol, "--netns", p.NsB, "--iface", p.IfB, "--mode", "xdp-native")
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })

	if _, err := rampart(t, "reattach", "--netns", p.NsB, "--iface", "nope"); err == nil || !strings.Contains(err.Error(), "--iface nope: rampart holds no hook on it") {
		t.Errorf("reattach --iface nope: %v", err)
	}
}

// TestTunnelWarnings: a tunnel device no rampart hook filters is named by
// apply and status with the command that covers it (the packets it
// decapsulates enter the stack on it, past the underlay's filter); once a
// hook filters it, the warning goes.
func TestTunnelWarnings(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	testutil.Run(t, "ip", "-n", p.NsB, "link", "add", "rpt-vx0", "type", "vxlan", "id", "42", "dstport", "4789", "local", p.B4.String(), "dev", p.IfB)
	testutil.Run(t, "ip", "-n", p.NsB, "link", "set", "rpt-vx0", "up")
	pol := writeFile(t, "p.yaml", "rules:\n  - {name: d, proto: udp, dport: 9000, action: drop}\n")
	want := "tunnel device rpt-vx0 (vxlan) in network namespace " + p.NsB + ": what it decapsulates is not filtered; filter it too: rampart --netns " + p.NsB + " apply -f POLICY --iface rpt-vx0"
	var applied struct{ Warnings []string }
	jsonOf(t, &applied, "apply", "-f", pol, "--netns", p.NsB, "--iface", p.IfB)
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })
	if len(applied.Warnings) != 1 || applied.Warnings[0] != want {
		t.Errorf("apply warnings %q, want [%q]", applied.Warnings, want)
	}
	var st struct{ Warnings []string }
	jsonOf(t, &st, "status", "--netns", p.NsB)
	if len(st.Warnings) != 1 || st.Warnings[0] != want {
		t.Errorf("status warnings %q, want [%q]", st.Warnings, want)
	}
	jsonOf(t, &applied, "apply", "-f", pol, "--netns", p.NsB, "--iface", "rpt-vx0")
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", "rpt-vx0") })
	jsonOf(t, &st, "status", "--netns", p.NsB)
	if len(applied.Warnings) != 0 || len(st.Warnings) != 0 {
		t.Errorf("with the tunnel filtered: apply warned %q, status %q", applied.Warnings, st.Warnings)
	}
}

// TestNetnsGone: a namespace deleted under rampart is reported as such, the
// same way on every call, and the command status suggests removes its pins
// (and the tables they hold); it used to fail with "no such file".
func TestNetnsGone(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	pol := writeFile(t, "p.yaml", "lists:\n  l: {prefixes: [192.0.2.0/24]}\nrules:\n  - {name: d, src: l, action: drop}\n")
	mustRampart(t, "apply", "-f", pol, "--netns", p.NsB, "--iface", p.IfB)
	testutil.Run(t, "ip", "netns", "del", p.NsB)
	var fix string
	for i := 0; i < 3; i++ {
		for _, args := range [][]string{{"status"}, {"status", "--netns", p.NsB}} {
			var st struct {
				Hooks []struct{ Iface, Netns, State, Fix string }
			}
			jsonOf(t, &st, args...)
			var ours []string
			for _, h := range st.Hooks {
				if h.Netns == p.NsB {
					ours = append(ours, h.State)
					fix = h.Fix
				}
			}
			if len(ours) != 1 || ours[0] != "netns-gone" {
				t.Fatalf("%v, call %d: states %v, want [netns-gone]", args, i, ours)
			}
		}
	}
	if want := "rampart --netns " + p.NsB + " detach --iface " + p.IfB; fix != want {
		t.Fatalf("fix %q, want %q", fix, want)
	}
	mustRampart(t, strings.Fields(fix)[1:]...)
	if _, err := os.Stat(filepath.Join(os.Getenv("RAMPART_PIN_ROOT"), "netns-"+p.NsB)); !os.IsNotExist(err) {
		t.Errorf("pins remain for the deleted namespace: %v", err)
	}
	var st statusJSON
	jsonOf(t, &st, "status")
	for _, h := range st.Hooks {
		if h.Netns == p.NsB {
			t.Errorf("status still lists %+v", h)
		}
	}
	if _, err := rampart(t, "--netns", p.NsB, "status"); err == nil {
		t.Error("--netns of a namespace that is gone and holds nothing was accepted")
	}

	// A namespace mid-deletion: `ip netns delete` unmounts it before it
	// unlinks the name, leaving an empty file that opens but cannot be
	// entered. Reports that cover every namespace pass it by (status once
	// failed with "enter network namespace …: invalid argument" when
	// another namespace was deleted while it ran).
	dying := "/run/netns/" + p.NsB + "-dying"
	if err := os.WriteFile(dying, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(dying) })
	jsonOf(t, &st, "status")
	for _, h := range st.Hooks {
		if h.Netns == filepath.Base(dying) {
			t.Errorf("status lists the dying namespace: %+v", h)
		}
	}
	if _, err := rampart(t, "--netns", filepath.Base(dying), "status"); err == nil || !strings.Contains(err.Error(), "no such network namespace") {
		t.Errorf("--netns of a namespace being deleted: %v, want \"no such network namespace\"", err)
	}
}

// TestUnpinnedPrograms: with bpffs mounted again over the pin root, the
// pins are out of sight while the XDP program keeps dropping. Status starts
// from what the kernel runs: it reports the rampart program it finds no pin
// for, apply warns of it, and detach --unpinned removes it (status used to
// print nothing, and detach left it running).
func TestUnpinnedPrograms(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	pins, state := testutil.Roots(t)
	r := func(args ...string) []string {
		return append([]string{"--pin-root", pins, "--state-root", state, "--netns", p.NsB}, args...)
	}
	pol := writeFile(t, "p.yaml", "rules:\n  - {name: d, proto: udp, dport: 9000, action: drop}\n")
	mustRampart(t, r("apply", "-f", pol, "--iface", p.IfB, "--mode", "xdp-native")...)
	testutil.Run(t, "mount", "-t", "bpf", "bpf", pins)
	t.Cleanup(func() { testutil.Run(t, "umount", pins) })

	var st struct {
		Unpinned []struct{ Iface, Hook, Netns, Fix string }
	}
	jsonOf(t, &st, r("status")...)
	want := "rampart --netns " + p.NsB + " detach --unpinned"
	if len(st.Unpinned) != 1 || st.Unpinned[0].Iface != p.IfB || st.Unpinned[0].Hook != "xdp" || st.Unpinned[0].Fix != want {
		t.Fatalf("unpinned: %+v, want the XDP program on %s fixed by %q", st.Unpinned, p.IfB, want)
	}
	var applied struct{ Warnings []string }
	jsonOf(t, &applied, r("apply", "-f", pol, "--iface", p.IfB, "--mode", "tc")...)
	if len(applied.Warnings) != 1 || !strings.Contains(applied.Warnings[0], "no pin accounts for") {
		t.Errorf("apply beside it warned %q", applied.Warnings)
	}
	mustRampart(t, r("detach", "--iface", p.IfB)...)
	if out := testutil.Run(t, "ip", "-n", p.NsB, "link", "show", p.IfB); !strings.Contains(out, "xdp") {
		t.Fatalf("the unpinned XDP program is gone before detach --unpinned: %s", out)
	}
	mustRampart(t, r("detach", "--unpinned")...)
	if out := testutil.Run(t, "ip", "-n", p.NsB, "link", "show", p.IfB); strings.Contains(out, "xdp") {
		t.Errorf("XDP still attached after detach --unpinned: %s", out)
	}
	jsonOf(t, &st, r("status")...)
	if len(st.Unpinned) != 0 {
		t.Errorf("still unpinned: %+v", st.Unpinned)
	}
	rx := testutil.UDPListener(t, p.NsB, p.B4, 9000)
	testutil.SendUDP(t, p.NsA, p.B4, 9000, 50)
	if got := testutil.CountUDP(rx, 300*time.Millisecond); got != 50 {
		t.Errorf("%d of 50 datagrams arrived after everything was removed", got)
	}
}

// TestListReachesItsNamespacesService: `list add --netns NS` goes through
// the service of NS (so it keeps the change in --persist), and a command
// for another namespace never changes that service's (the API socket is
// per namespace, and a service of another namespace is refused).
func TestListReachesItsNamespacesService(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	dir := t.TempDir()
	pol := writeFile(t, "p.yaml", "lists:\n  bl: {prefixes: [192.0.2.0/24]}\nrules:\n  - {name: bl, src: bl, action: drop}\n")
	persist := filepath.Join(dir, "var")
	listen := func() string { return fmt.Sprintf("127.0.0.1:%d", freePort(t)) }
	_, api, _ := startServe(t, "--netns", p.NsB, "-f", pol, "--iface", p.IfB, "--persist", persist, "--listen", listen())
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })

	mustRampart(t, "--netns", p.NsB, "list", "add", "bl", "198.51.100.7")
	var changes struct {
		Changes []struct{ List, Prefix string }
	}
	if err := api.Do("GET", "/v1/changes", nil, &changes); err != nil || len(changes.Changes) != 1 || changes.Changes[0].Prefix != "198.51.100.7/32" {
		t.Errorf("the service holds %+v (%v), want the change made with --netns", changes, err)
	}
	if b, err := os.ReadFile(filepath.Join(persist, "list-changes.json")); err != nil || !strings.Contains(string(b), "198.51.100.7") {
		t.Errorf("the change is not kept in --persist: %q, %v", b, err)
	}

	// The host's command has no service of its own: it must not reach the
	// namespace's.
	if _, err := rampart(t, "list", "add", "bl", "203.0.113.9"); err == nil {
		t.Error("list add for the host was taken")
	}
	if err := api.Do("GET", "/v1/changes", nil, &changes); err != nil || len(changes.Changes) != 1 {
		t.Errorf("a host command changed the namespace's service: %+v (%v)", changes, err)
	}

	// A service of the namespace answering where the host's is looked for
	// is refused, naming both.
	hostSock := filepath.Join(os.Getenv("RAMPART_STATE_ROOT"), "api.sock")
	serveAt(t, hostSock, "--netns", p.NsB, "-f", pol, "--iface", p.IfB, "--listen", listen())
	_, err := rampart(t, "list", "add", "bl", "203.0.113.9")
	if err == nil || !strings.Contains(err.Error(), "filters network namespace "+p.NsB+", not the host's namespace") {
		t.Errorf("list add through another namespace's service: %v", err)
	}
}

// TestConcurrentApplies: applies racing from separate processes on one
// interface and one pin and state root are taken one at a time. Each either
// lands whole or fails whole; afterwards one generation runs, status names
// one of the policies, and the traffic is judged by exactly that policy.
func TestConcurrentApplies(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	const n = 4
	exe, _ := os.Executable()
	hashes := map[string]int{} // policy hash → the port it drops
	cmds := make([]*exec.Cmd, n)
	for i := range cmds {
		port := 9100 + i
		pol := writeFile(t, fmt.Sprintf("p%d.yaml", i), fmt.Sprintf("rules:\n  - {name: d%d, proto: udp, dport: %d, action: drop}\n", i, port))
		var checked struct {
			PolicyHash string `json:"policy_hash"`
		}
		jsonOf(t, &checked, "check", "-f", pol)
		hashes[checked.PolicyHash] = port
		cmds[i] = exec.Command(exe, "apply", "-f", pol, "--netns", p.NsB, "--iface", p.IfB)
		cmds[i].Env = append(os.Environ(), "RAMPART_TEST_AS_CLI=1")
	}
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })
	outs := make([][]byte, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, c := range cmds {
		wg.Add(1)
		go func() { defer wg.Done(); outs[i], errs[i] = c.CombinedOutput() }()
	}
	wg.Wait()
	landed := 0
	for i, err := range errs {
		if err == nil {
			landed++
		} else {
			t.Logf("apply %d: %v\n%s", i, err, outs[i])
		}
	}
	if landed == 0 {
		t.Fatal("no apply landed")
	}
	st := hookStatus(t, p.NsB)
	if len(st.Hooks) != 1 || !st.Hooks[0].Attached {
		t.Fatalf("status %+v, want one attached hook", st)
	}
	dropped, ok := hashes[st.Hooks[0].PolicyHash]
	if !ok {
		t.Fatalf("status names policy %s, none of those applied (%v)", st.Hooks[0].PolicyHash, hashes)
	}
	for port := 9100; port < 9100+n; port++ {
		l := testutil.UDPListener(t, p.NsB, p.B4, port)
		testutil.SendUDP(t, p.NsA, p.B4, port, 50)
		got, want := testutil.CountUDP(l, 300*time.Millisecond), 50
		if port == dropped {
			want = 0
		}
		if got != want {
			t.Errorf("port %d: %d of 50 datagrams arrived, want %d (status runs the policy dropping %d)", port, got, want, dropped)
		}
	}
}

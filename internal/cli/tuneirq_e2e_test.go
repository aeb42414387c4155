package cli_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rampart-fw/rampart/internal/testutil"
	"github.com/rampart-fw/rampart/internal/tune"
)

// TestTuneIRQVeth applies a plan to real veth queues in a namespace: RPS
// and XPS masks read back from the kernel as planned, the sides' CPUs are
// disjoint, check finds drift after a change, rollback and an unconfirmed
// --confirm restore the kernel's values. The root holds symlinks to the
// namespace's /sys and /proc and a var/ of its own for the state.
func TestTuneIRQVeth(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	ns := p.NsA
	testutil.Run(t, "ip", "-n", ns, "link", "add", "ext0", "numtxqueues", "4", "numrxqueues", "4", "type", "veth", "peer", "name", "ext0p", "numtxqueues", "4", "numrxqueues", "4")
	testutil.Run(t, "ip", "-n", ns, "link", "add", "lan0", "numtxqueues", "2", "numrxqueues", "2", "type", "veth", "peer", "name", "lan0p")
	root := t.TempDir()
	for _, d := range []string{"sys", "proc"} {
		if err := os.Symlink("/"+d, filepath.Join(root, d)); err != nil {
			t.Fatal(err)
		}
	}
	exe, _ := os.Executable()
	run := func(args ...string) (string, error) {
		cmd := exec.Command("ip", append([]string{"netns", "exec", ns, exe}, append(args, "--root", root)...)...)
		cmd.Env = append(os.Environ(), "RAMPART_TEST_AS_CLI=1")
		out, err := cmd.Output()
		return string(out), err
	}
	// read is a queue file as the namespace's kernel shows it.
	read := func(path string) tune.CPUSet {
		out, err := exec.Command("ip", "netns", "exec", ns, "cat", "/sys/class/net/"+path).Output()
		if err != nil {
			t.Fatalf("read %s: %v", path, err)
		}
		set, err := tune.ParseCPUMask(string(out))
		if err != nil {
			t.Fatal(err)
		}
		return set
	}
	out, err := run("tune", "irq", "plan", "--external", "ext0", "--internal", "lan0", "--json")
	if err != nil {
		t.Fatalf("plan: %v\n%s", err, out)
	}
	var plan tune.IRQPlan
	if err := json.Unmarshal([]byte(out), &plan); err != nil {
		t.Fatal(err)
	}
	ext, _ := tune.ParseCPUList(plan.External.CPUs)
	lan, _ := tune.ParseCPUList(plan.Internal.CPUs)
	if len(ext) == 0 || len(lan) == 0 || len(ext.Intersect(lan)) > 0 {
		t.Fatalf("sides %q and %q", plan.External.CPUs, plan.Internal.CPUs)
	}
	if len(plan.RPS) != 6 || len(plan.XPS) != 6 {
		t.Fatalf("want RPS for 6 rx queues and XPS for 6 tx queues: %+v %+v", plan.RPS, plan.XPS)
	}
	checkAll := func(want func(kind string, q tune.QueueCPUs) tune.CPUSet) {
		t.Helper()
		for kind, qs := range map[string][]tune.QueueCPUs{"rx": plan.RPS, "tx": plan.XPS} {
			file := map[string]string{"rx": "rps_cpus", "tx": "xps_cpus"}[kind]
			for _, q := range qs {
				path := fmt.Sprintf("%s/queues/%s-%d/%s", q.Iface, kind, q.Queue, file)
				if got, w := read(path), want(kind, q); !slices.Equal(got, w) {
					t.Errorf("%s: %v, want %v", path, got, w)
				}
			}
		}
	}
	planned := func(_ string, q tune.QueueCPUs) tune.CPUSet { s, _ := tune.ParseCPUList(q.CPUs); return s }
	none := func(string, tune.QueueCPUs) tune.CPUSet { return nil }
	checkAll(none)

	if out, err := run("tune", "irq", "apply", "--external", "ext0", "--internal", "lan0"); err != nil {
		t.Fatalf("apply: %v\n%s", err, out)
	}
	checkAll(planned)
	for _, q := range plan.RPS {
		s, _ := tune.ParseCPUList(q.CPUs)
		side := map[string]tune.CPUSet{"ext0": ext, "lan0": lan}[q.Iface]
		if len(s) == 0 || len(s.Without(side)) > 0 {
			t.Errorf("RPS of %s rx-%d on %v, not within its side %v", q.Iface, q.Queue, s, side)
		}
	}
	if out, err := run("tune", "irq", "check"); err != nil {
		t.Fatalf("check after apply: %v\n%s", err, out)
	}
	testutil.Run(t, "ip", "netns", "exec", ns, "sh", "-c", "echo 0 > /sys/class/net/ext0/queues/rx-2/rps_cpus")
	out, err = run("tune", "irq", "check", "--json")
	var check struct{ Drift []tune.Drift }
	json.NewDecoder(strings.NewReader(out)).Decode(&check) // then the error, as JSON
	if err == nil || len(check.Drift) != 1 || !strings.HasSuffix(check.Drift[0].Path, "ext0/queues/rx-2/rps_cpus") {
		t.Fatalf("check after a change: %v %+v\n%s", err, check.Drift, out)
	}
	if out, err := run("tune", "irq", "rollback"); err != nil {
		t.Fatalf("rollback: %v\n%s", err, out)
	}
	checkAll(none)

	if out, err := run("tune", "irq", "apply", "--external", "ext0", "--internal", "lan0", "--confirm", "1s"); err != nil {
		t.Fatalf("apply --confirm: %v\n%s", err, out)
	}
	checkAll(planned)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(root, "var/lib/rampart/tune-irq.json")); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the unconfirmed apply was not rolled back")
		}
		time.Sleep(100 * time.Millisecond)
	}
	checkAll(none)
}

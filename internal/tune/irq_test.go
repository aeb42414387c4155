package tune

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

var noDeadline time.Time

var update = flag.Bool("update", false, "rewrite the golden plans in testdata/irq")

// fixtureRoot is a fixture's tree: built from its description, or the
// captured one copied as it is.
func fixtureRoot(t *testing.T, name string) (string, fixture) {
	t.Helper()
	f := loadFixture(t, filepath.Join("testdata/irq", name+".yaml"))
	root := t.TempDir()
	if f.Sockets == 0 {
		if err := os.CopyFS(root, os.DirFS(filepath.Join("testdata/irq", name))); err != nil {
			t.Fatal(err)
		}
		return root, f
	}
	f.build(t, root)
	return root, f
}

func fixtureNames(t *testing.T) []string {
	specs, err := filepath.Glob("testdata/irq/*.yaml")
	if err != nil || len(specs) < 20 {
		t.Fatalf("want at least 20 fixtures, have %d (%v)", len(specs), err)
	}
	var names []string
	for _, s := range specs {
		names = append(names, strings.TrimSuffix(filepath.Base(s), ".yaml"))
	}
	return names
}

func planFixture(t *testing.T, root string, f fixture) (*Machine, *IRQPlan) {
	t.Helper()
	m, err := ReadMachine(root, slices.Concat(f.External, f.Internal))
	if err != nil {
		t.Fatal(err)
	}
	nExt := 0
	for _, n := range m.NICs {
		if slices.Contains(f.External, n.Name) || slices.Contains(f.External, n.Bond) {
			nExt++
		}
	}
	p, err := PlanIRQ(m, nExt)
	if err != nil {
		t.Fatal(err)
	}
	return m, p
}

// TestIRQPlans: every fixture's plan is its golden plan, and holds the
// targets: the sides share no CPU, each side's interrupts sit on its
// NIC's node where the side has CPUs there, no CPU carries more than
// ⌈queues/CPUs⌉ + 1 queues of a side, every queue interrupt of every
// NIC (bond slaves up or down) is placed, and RPS/XPS stay consistent.
func TestIRQPlans(t *testing.T) {
	for _, name := range fixtureNames(t) {
		t.Run(name, func(t *testing.T) {
			root, f := fixtureRoot(t, name)
			m, p := planFixture(t, root, f)
			got, err := json.MarshalIndent(p, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata/irq", name+".plan.json")
			if *update {
				if err := os.WriteFile(golden, append(got, '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./internal/tune -run TestIRQPlans -update to write it)", err)
			}
			if strings.TrimSpace(string(want)) != string(got) {
				t.Errorf("plan differs from %s:\n%s", golden, got)
			}
			checkTargets(t, m, p)
		})
	}
}

func checkTargets(t *testing.T, m *Machine, p *IRQPlan) {
	t.Helper()
	nodeOfCPU := map[int]int{}
	for _, c := range m.CPUs {
		nodeOfCPU[c.ID] = c.Node
	}
	nic := map[string]NIC{}
	irqs := 0
	for _, n := range m.NICs {
		nic[n.Name] = n
		irqs += len(n.IRQs)
	}
	if len(p.Assignments) != irqs {
		t.Errorf("%d queue interrupts placed of %d", len(p.Assignments), irqs)
	}
	sides := map[string]*Side{"external": &p.External, "internal": &p.Internal}
	ext, _ := ParseCPUList(p.External.CPUs)
	in, _ := ParseCPUList(p.Internal.CPUs)
	if len(ext) == 0 || len(in) == 0 || len(ext.Intersect(in)) > 0 {
		t.Errorf("external CPUs %q and internal %q must be disjoint and not empty", p.External.CPUs, p.Internal.CPUs)
	}
	if shared := ext.Union(in).Intersect(m.Isolated); len(shared) > 0 {
		t.Errorf("isolated CPUs %v planned", shared)
	}
	type key struct {
		iface string
		queue int
	}
	perCPU := map[string]map[int]map[key]bool{"external": {}, "internal": {}}
	for _, a := range p.Assignments {
		cpus, _ := ParseCPUList(a.CPUs)
		side, _ := ParseCPUList(sides[a.Side].CPUs)
		if len(cpus) == 0 || len(cpus.Without(side)) > 0 {
			t.Errorf("IRQ %d (%s queue %d) on %s, outside the %s side's %s", a.IRQ, a.Iface, a.Queue, a.CPUs, a.Side, side.List())
		}
		n := nic[a.Iface]
		if n.Node >= 0 && slices.ContainsFunc(side, func(c int) bool { return nodeOfCPU[c] == n.Node }) {
			for _, c := range cpus {
				if nodeOfCPU[c] != n.Node {
					t.Errorf("IRQ %d of %s (node %d) on CPU %d of node %d", a.IRQ, a.Iface, n.Node, c, nodeOfCPU[c])
				}
			}
		}
		for _, c := range cpus {
			if perCPU[a.Side][c] == nil {
				perCPU[a.Side][c] = map[key]bool{}
			}
			perCPU[a.Side][c][key{a.Iface, a.Queue}] = true
		}
	}
	for name, s := range sides {
		cpus, _ := ParseCPUList(s.CPUs)
		bound := int(math.Ceil(float64(s.Queues)/float64(len(cpus)))) + 1
		for c, qs := range perCPU[name] {
			if len(qs) > bound {
				t.Errorf("CPU %d carries %d %s queues, more than ⌈%d/%d⌉+1", c, len(qs), name, s.Queues, len(cpus))
			}
		}
	}
	sideOf := map[string]CPUSet{}
	for _, n := range p.External.Ifaces {
		sideOf[n] = ext
	}
	for _, n := range p.Internal.Ifaces {
		sideOf[n] = in
	}
	for _, r := range p.RPS {
		cpus, _ := ParseCPUList(r.CPUs)
		if len(cpus.Without(sideOf[r.Iface])) > 0 {
			t.Errorf("RPS of %s rx-%d on %s, outside its side", r.Iface, r.Queue, r.CPUs)
		}
		if len(cpus) == 0 && queuesWithIRQs(nic[r.Iface]) < 2 {
			t.Errorf("%s spreads nothing in hardware and gets no RPS", r.Iface)
		}
	}
	// XPS: every usable CPU sends on exactly one queue of each NIC.
	xps := map[string]map[int]int{}
	for _, x := range p.XPS {
		cpus, _ := ParseCPUList(x.CPUs)
		if xps[x.Iface] == nil {
			xps[x.Iface] = map[int]int{}
		}
		for _, c := range cpus {
			xps[x.Iface][c]++
		}
	}
	for _, n := range m.NICs {
		if !n.HasXPS {
			continue
		}
		for _, c := range m.CPUs {
			if xps[n.Name][c.ID] != 1 {
				t.Errorf("CPU %d sends on %d queues of %s, want 1", c.ID, xps[n.Name][c.ID], n.Name)
			}
		}
	}
}

// TestIRQApplyCheckRollback applies a plan to a fixture copy: the files
// are written, check finds none drifted, then a changed affinity and a
// changed RPS mask; rollback restores every file, and a pending apply is
// undone only by its own token.
func TestIRQApplyCheckRollback(t *testing.T) {
	root, f := fixtureRoot(t, "seed-2x6x2-two-bonds")
	_, p := planFixture(t, root, f)
	before := snapshot(t, root, p.writes())
	if _, err := ApplyIRQ(root, p, "", "", noDeadline); err == nil || !strings.Contains(err.Error(), "irqbalance is running") {
		t.Fatalf("apply with irqbalance running and no --irqbalance: %v", err)
	}
	if _, err := ApplyIRQ(root, p, "ban", "", noDeadline); err != nil {
		t.Fatal(err)
	}
	for _, w := range p.writes() {
		got := readFile(t, filepath.Join(root, w.Path))
		if got != w.Want {
			t.Errorf("%s holds %q, want %q", w.Path, got, w.Want)
		}
	}
	args := readFile(t, filepath.Join(root, irqbalanceDefaults))
	if !strings.Contains(args, fmt.Sprintf("--banirq=%d", p.Assignments[0].IRQ)) {
		t.Errorf("irqbalance arguments do not ban IRQ %d:\n%s", p.Assignments[0].IRQ, args)
	}
	if _, drift, err := CheckIRQ(root); err != nil || len(drift) != 0 {
		t.Fatalf("check right after apply: %v %v", drift, err)
	}
	a := p.Assignments[3]
	other := p.Internal.CPUs
	os.WriteFile(filepath.Join(root, "proc/irq", fmt.Sprint(a.IRQ), "smp_affinity_list"), []byte(other+"\n"), 0o644)
	rps := fmt.Sprintf("sys/class/net/%s/queues/rx-0/rps_cpus", p.External.Ifaces[0])
	os.WriteFile(filepath.Join(root, rps), []byte("00ffffff\n"), 0o644)
	_, drift, err := CheckIRQ(root)
	if err != nil || len(drift) != 2 {
		t.Fatalf("check after two changes: %+v %v", drift, err)
	}
	if _, err := RollbackIRQ(root, ""); err != nil {
		t.Fatal(err)
	}
	if after := snapshot(t, root, p.writes()); !equalMaps(before, after) {
		t.Errorf("rollback left files changed")
	}
	if _, err := os.Stat(filepath.Join(root, irqbalanceDefaults)); !os.IsNotExist(err) {
		t.Errorf("irqbalance defaults written by the ban not removed: %v", err)
	}
	if _, _, err := CheckIRQ(root); err == nil {
		t.Errorf("check after rollback finds an apply")
	}

	// --confirm: only the watchdog holding the pending token undoes it.
	if _, err := ApplyIRQ(root, p, "ban", "tok1", noDeadline); err != nil {
		t.Fatal(err)
	}
	if a, err := RollbackIRQ(root, "other"); err != nil || a != nil {
		t.Fatalf("rollback with another token: %v %v", a, err)
	}
	if _, err := RollbackIRQ(root, "tok1"); err != nil {
		t.Fatal(err)
	}
	if after := snapshot(t, root, p.writes()); !equalMaps(before, after) {
		t.Errorf("the watchdog's rollback left files changed")
	}
	if _, err := ApplyIRQ(root, p, "ban", "tok2", noDeadline); err != nil {
		t.Fatal(err)
	}
	if err := ConfirmIRQ(root); err != nil {
		t.Fatal(err)
	}
	if a, err := RollbackIRQ(root, "tok2"); err != nil || a != nil {
		t.Fatalf("a confirmed apply rolled back by its watchdog: %v", err)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func snapshot(t *testing.T, root string, ws []Write) map[string]string {
	s := map[string]string{}
	for _, w := range ws {
		s[w.Path] = readFile(t, filepath.Join(root, w.Path))
	}
	return s
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		// Compared as CPU sets: the kernel pads masks and merges lists.
		x, _ := ParseCPUMask(v)
		y, _ := ParseCPUMask(b[k])
		if strings.Contains(k, "smp_affinity_list") {
			x, _ = ParseCPUList(v)
			y, _ = ParseCPUList(b[k])
		}
		if !slices.Equal(x, y) {
			return false
		}
	}
	return true
}

package cli_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rampart-fw/rampart/internal/engine"
	"github.com/rampart-fw/rampart/internal/lab"
	"github.com/rampart-fw/rampart/internal/testutil"
)

// labResult is the part of `lab drop --json` the tests read.
type labResult struct {
	Layer          string   `json:"layer"`
	Family         int      `json:"family"`
	Status         string   `json:"status"`
	Reason         string   `json:"reason"`
	Mode           string   `json:"mode"`
	MPPS           *float64 `json:"mpps"`
	MPPSMin        *float64 `json:"mpps_min"`
	MPPSMax        *float64 `json:"mpps_max"`
	OfferedMPPS    *float64 `json:"offered_mpps"`
	SetupSeconds   *float64 `json:"setup_seconds"`
	CPUBusy        *float64 `json:"cpu_busy"`
	NsPerPacket    *float64 `json:"ns_per_packet"`
	GeneratorBound *bool    `json:"generator_bound"`
	Packets        uint64   `json:"packets"`
}

// hostState is what the lab must leave as it found it: the host's
// namespaces, links, firewall rules, and rampart's pins and state.
func hostState(t *testing.T) map[string]string {
	t.Helper()
	s := map[string]string{}
	cmds := map[string][]string{
		"netns":    {"ip", "netns", "list"},
		"links":    {"ip", "-o", "link", "show"},
		"nft":      {"nft", "list", "ruleset"},
		"iptables": {"iptables-save"}, "ip6tables": {"ip6tables-save"},
		"iptables-legacy": {"iptables-legacy-save"}, "ip6tables-legacy": {"ip6tables-legacy-save"},
		"ipset": {"ipset", "list", "-n"},
	}
	for name, c := range cmds {
		if _, err := exec.LookPath(c[0]); err != nil {
			continue
		}
		out := testutil.Run(t, c[0], c[1:]...)
		var keep []string
		for _, l := range strings.Split(out, "\n") {
			// *-save stamps the time in comments; test pairs of packages
			// running beside this one come and go.
			if !strings.HasPrefix(l, "#") && !(name == "netns" && strings.HasPrefix(l, "rpt-")) {
				keep = append(keep, l)
			}
		}
		s[name] = strings.Join(keep, "\n")
	}
	// The lab's rampart layer pins under roots of its own, and the tests'
	// commands under the package's (TestMain); the host's are not touched.
	labPins, _ := filepath.Glob(lab.PinRootPrefix + "*")
	s["lab pins"] = strings.Join(labPins, "\n")
	_, err := os.Stat("/sys/fs/bpf/xdp-filter")
	s["xdp-filter pins"] = fmt.Sprint(err == nil)
	for _, root := range []string{os.Getenv("RAMPART_PIN_ROOT"), os.Getenv("RAMPART_STATE_ROOT"), engine.DefaultPinRoot, engine.DefaultStateRoot} {
		var names []string
		filepath.WalkDir(root, func(p string, _ os.DirEntry, _ error) error {
			names = append(names, p)
			return nil
		})
		s[root] = strings.Join(names, "\n")
	}
	return s
}

func assertUnchanged(t *testing.T, before map[string]string) {
	t.Helper()
	after := hostState(t)
	for k, v := range before {
		if after[k] != v {
			t.Errorf("%s changed:\nbefore:\n%s\nafter:\n%s", k, v, after[k])
		}
	}
	if strings.Contains(after["netns"], lab.NetnsPrefix) {
		t.Errorf("lab namespaces remain: %s", after["netns"])
	}
}

// TestLabDrop runs a short --quick study on three layers (and the floor
// rampart's row brings) and checks the JSON, that every layer's counter
// moved, that XDP dropped more than iptables raw, rampart's ratio to the
// floor, the files, and that nothing was left behind.
func TestLabDrop(t *testing.T) {
	testutil.Privileged(t)
	before := hostState(t)
	out := t.TempDir()
	var rep struct {
		Environment map[string]any   `json:"environment"`
		Results     []labResult      `json:"results"`
		Checks      []map[string]any `json:"checks"`
	}
	jsonOf(t, &rep, "lab", "drop", "--quick", "--warmup", "300ms", "--window", "400ms",
		"--layers", "iptables-raw,xdp-native,rampart", "--family", "4", "--list-size", "100000", "--out", out)
	if len(rep.Results) != 4 {
		t.Fatalf("want 4 results (xdp-floor with rampart), got %+v", rep.Results)
	}
	by := map[string]labResult{}
	for _, r := range rep.Results {
		if r.MPPS == nil || r.MPPSMin == nil || r.MPPSMax == nil || r.OfferedMPPS == nil || r.CPUBusy == nil ||
			r.NsPerPacket == nil || r.GeneratorBound == nil || r.Family != 4 {
			t.Fatalf("result lacks a field: %+v", r)
		}
		if r.Status != "ok" || r.Packets == 0 || *r.MPPS <= 0 || *r.OfferedMPPS <= 0 || *r.NsPerPacket <= 0 {
			t.Errorf("%s: counters did not move: %+v (%s)", r.Layer, r, r.Reason)
		}
		if *r.MPPSMin > *r.MPPS || *r.MPPS > *r.MPPSMax {
			t.Errorf("%s: median %v outside %v-%v", r.Layer, *r.MPPS, *r.MPPSMin, *r.MPPSMax)
		}
		by[r.Layer] = r
	}
	if x, raw := by["xdp-native"], by["iptables-raw"]; x.MPPS == nil || raw.MPPS == nil || *x.MPPS <= *raw.MPPS {
		t.Errorf("XDP dropped no more than iptables raw: %+v vs %+v", x, raw)
	}
	if m := by["xdp-native"].Mode; m != "xdp-native" {
		t.Errorf("xdp-native ran in mode %q", m)
	}
	if m := by["rampart"].Mode; !strings.HasPrefix(m, "xdp") {
		t.Errorf("rampart's auto mode on veth chose %q, want XDP", m)
	}
	if m := by["xdp-floor"].Mode; m != "xdp-native" {
		t.Errorf("xdp-floor ran in mode %q", m)
	}
	if !slices.ContainsFunc(rep.Checks, func(c map[string]any) bool { return c["name"] == "rampart ns/packet / xdp-floor" }) {
		t.Errorf("no rampart / xdp-floor check: %+v", rep.Checks)
	}
	if len(rep.Checks) == 0 || rep.Environment["kernel"] == "" {
		t.Errorf("no checks or environment: %+v %+v", rep.Checks, rep.Environment)
	}
	for _, f := range []string{"drop.json", "drop.csv", "drop.png", "drop.svg"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	assertUnchanged(t, before)
}

// TestLabDropUnlisted runs rampart's row with a list that holds none of
// the flood's sources: every frame passes the list's rule and the next
// drops it (its counter is the row's), against the floor, both families;
// and refuses a peer's layer, which would drop nothing.
func TestLabDropUnlisted(t *testing.T) {
	testutil.Privileged(t)
	before := hostState(t)
	var rep struct {
		Environment map[string]any   `json:"environment"`
		Results     []labResult      `json:"results"`
		Checks      []map[string]any `json:"checks"`
	}
	jsonOf(t, &rep, "lab", "drop", "--quick", "--warmup", "300ms", "--window", "400ms", "--repeats", "1",
		"--layers", "rampart", "--unlisted", "--family", "both", "--list-size", "100000", "--out", t.TempDir())
	if len(rep.Results) != 4 || rep.Environment["unlisted"] != true {
		t.Fatalf("want rampart's and xdp-floor's rows for both families, unlisted: %+v %+v", rep.Results, rep.Environment)
	}
	for _, r := range rep.Results {
		if r.Status != "ok" || r.Packets == 0 || r.MPPS == nil || *r.MPPS <= 0 {
			t.Errorf("%s IPv%d: counters did not move: %+v (%s)", r.Layer, r.Family, r, r.Reason)
		}
	}
	for _, fam := range []float64{4, 6} {
		if !slices.ContainsFunc(rep.Checks, func(c map[string]any) bool {
			return c["name"] == "rampart ns/packet / xdp-floor, unlisted sources" && c["family"] == fam
		}) {
			t.Errorf("no IPv%v rampart / xdp-floor check for unlisted sources: %+v", fam, rep.Checks)
		}
	}
	if _, err := rampart(t, "lab", "drop", "--unlisted", "--layers", "ipset", "--out", t.TempDir()); err == nil ||
		!strings.Contains(err.Error(), "--unlisted runs rampart and xdp-floor only") {
		t.Errorf("--unlisted with ipset: %v", err)
	}
	assertUnchanged(t, before)
}

// TestLabDropListPeers runs the list-based layers with one list: every
// peer's row and the floor's for both families (xdp-filter's IPv6 row
// skipped, saying why), their set-up times and counters, the comparisons
// with the best peer and with the floor, and nothing left behind: sets,
// tables, xdp-filter's pins.
func TestLabDropListPeers(t *testing.T) {
	testutil.Privileged(t)
	before := hostState(t)
	var rep struct {
		Results []labResult      `json:"results"`
		Checks  []map[string]any `json:"checks"`
	}
	jsonOf(t, &rep, "lab", "drop", "--quick", "--warmup", "300ms", "--window", "400ms", "--repeats", "1",
		"--layers", "ipset,nft-set,xdp-lpm,xdp-filter,rampart", "--family", "both", "--list-size", "5000", "--out", t.TempDir())
	if len(rep.Results) != 12 {
		t.Fatalf("want 12 results (xdp-floor with rampart), got %+v", rep.Results)
	}
	for _, r := range rep.Results {
		if r.Layer == "xdp-filter" && r.Family == 6 {
			if r.Status != "skipped" || !strings.Contains(r.Reason, "exact addresses") {
				t.Errorf("xdp-filter IPv6: %+v", r)
			}
			continue
		}
		if r.Status != "ok" || r.Packets == 0 || r.SetupSeconds == nil || *r.SetupSeconds <= 0 || r.NsPerPacket == nil || *r.NsPerPacket <= 0 {
			t.Errorf("%s IPv%d: %+v (%s)", r.Layer, r.Family, r, r.Reason)
		}
		if strings.HasPrefix(r.Layer, "xdp-") && r.Mode != "xdp-native" {
			t.Errorf("%s IPv%d ran in mode %q", r.Layer, r.Family, r.Mode)
		}
	}
	peerChecks, floorChecks := 0, 0
	for _, c := range rep.Checks {
		if strings.Contains(fmt.Sprint(c["name"]), "best list peer") {
			peerChecks++
		}
		if c["name"] == "rampart ns/packet / xdp-floor" {
			floorChecks++
		}
	}
	if peerChecks != 2 {
		t.Errorf("want the best-list-peer check for both families: %+v", rep.Checks)
	}
	if floorChecks != 2 {
		t.Errorf("want the xdp-floor check for both families: %+v", rep.Checks)
	}
	assertUnchanged(t, before)
}

// TestLabDropInterrupted: Ctrl-C while the rampart layer is applied still
// removes its pins, the namespaces and everything else, and exits non-zero.
func TestLabDropInterrupted(t *testing.T) {
	interruptLab(t, rampartApplied, "lab", "drop", "--layers", "rampart", "--family", "4", "--list-size", "100000", "--warmup", "1m")
}

// TestLabFloodInterrupted: Ctrl-C during a row of `lab flood` (its
// namespaces up, the flood's rows to come) leaves nothing behind.
func TestLabFloodInterrupted(t *testing.T) {
	interruptLab(t, labNamespaces, "lab", "flood", "--floods", "syn", "--defences", "rampart-syncookie", "--family", "4", "--warmup", "1m")
}

// TestLabEgressInterrupted: Ctrl-C with rampart applied at the client's
// egress leaves nothing behind.
func TestLabEgressInterrupted(t *testing.T) {
	interruptLab(t, rampartApplied, "lab", "egress", "--methods", "rampart", "--sizes", "10", "--window", "1m")
}

func rampartApplied() bool {
	m, _ := filepath.Glob(lab.PinRootPrefix + "*/netns-" + lab.NetnsPrefix + "*")
	return len(m) > 0
}

func labNamespaces() bool {
	m, _ := filepath.Glob("/run/netns/" + lab.NetnsPrefix + "*")
	return len(m) > 0
}

// interruptLab runs a lab command, sends it SIGINT once ready says the run
// is under way, and checks that it says so, fails, and leaves the host as
// it found it.
func interruptLab(t *testing.T, ready func() bool, args ...string) {
	testutil.Privileged(t)
	before := hostState(t)
	cmd := exec.Command(os.Args[0], append(args, "--out", t.TempDir())...)
	cmd.Env = append(os.Environ(), "RAMPART_TEST_AS_CLI=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !ready() {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("the run never got under way: %s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	if err == nil {
		t.Error("an interrupted run exited 0")
	}
	if !strings.Contains(stderr.String(), "interrupted") {
		t.Errorf("stderr does not say it was interrupted: %s", stderr.String())
	}
	assertUnchanged(t, before)
}

// floodResult is the part of `lab flood --json` the tests read.
type floodResult struct {
	Defence       string   `json:"defence"`
	Flood         string   `json:"flood"`
	Family        int      `json:"family"`
	Legit         string   `json:"legit"`
	Status        string   `json:"status"`
	Reason        string   `json:"reason"`
	LegitRequests int      `json:"legit_requests"`
	LegitSuccess  *float64 `json:"legit_success"`
	LegitP50      *float64 `json:"legit_p50_ms"`
	LegitP99      *float64 `json:"legit_p99_ms"`
	Offered       *float64 `json:"offered_mpps"`
	Dropped       *float64 `json:"dropped_mpps"`
	CPUBusy       *float64 `json:"cpu_busy"`
	NsPerPacket   *float64 `json:"ns_per_packet"`
}

// TestLabFlood runs `lab flood --quick` on two rows, the unflooded
// baseline and rampart's SYN cookies under the SYN flood, and checks the
// JSON, that the flood ran and was answered, that legitimate clients got
// through, the files, and that nothing was left behind.
func TestLabFlood(t *testing.T) {
	testutil.Privileged(t)
	before := hostState(t)
	out := t.TempDir()
	var rep struct {
		Environment map[string]any   `json:"environment"`
		Results     []floodResult    `json:"results"`
		Checks      []map[string]any `json:"checks"`
	}
	jsonOf(t, &rep, "lab", "flood", "--quick", "--warmup", "300ms", "--window", "1s",
		"--floods", "syn", "--defences", "rampart-syncookie", "--family", "4", "--out", out)
	if len(rep.Results) != 2 {
		t.Fatalf("want 2 results, got %+v", rep.Results)
	}
	for _, r := range rep.Results {
		if r.LegitSuccess == nil || r.LegitP50 == nil || r.LegitP99 == nil || r.Offered == nil || r.Dropped == nil ||
			r.CPUBusy == nil || r.NsPerPacket == nil || r.Family != 4 || r.Legit != "tcp" {
			t.Fatalf("result lacks a field: %+v", r)
		}
		if r.Status != "ok" || r.LegitRequests == 0 || *r.LegitSuccess < 0 || *r.LegitSuccess > 1 {
			t.Errorf("%s/%s: %+v (%s)", r.Flood, r.Defence, r, r.Reason)
		}
	}
	base, cookies := rep.Results[0], rep.Results[1]
	if base.Flood != "none" || base.Defence != "none" || *base.LegitSuccess < 0.9 || *base.Offered != 0 {
		t.Errorf("baseline: %+v", base)
	}
	if cookies.Flood != "syn" || cookies.Defence != "rampart-syncookie" || *cookies.Offered <= 0 || *cookies.Dropped <= 0 ||
		*cookies.NsPerPacket <= 0 || *cookies.LegitSuccess == 0 {
		t.Errorf("rampart syncookie under the SYN flood: %+v", cookies)
	}
	if len(rep.Checks) == 0 || rep.Environment["kernel"] == "" {
		t.Errorf("no checks or environment: %+v %+v", rep.Checks, rep.Environment)
	}
	for _, f := range []string{"flood.json", "flood.png", "flood.svg"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	assertUnchanged(t, before)
}

// TestLabEgress runs `lab egress` on two small sizes and three methods:
// every metric measured for each, the filters seen to drop a listed
// destination (a row whose check fails is failed), the files, and nothing
// left behind.
func TestLabEgress(t *testing.T) {
	testutil.Privileged(t)
	before := hostState(t)
	out := t.TempDir()
	var rep struct {
		Environment map[string]any `json:"environment"`
		Results     []struct {
			Method string   `json:"method"`
			Size   int      `json:"size"`
			Metric string   `json:"metric"`
			Value  *float64 `json:"value"`
			Min    *float64 `json:"min"`
			Max    *float64 `json:"max"`
			Status string   `json:"status"`
			Reason string   `json:"reason"`
		} `json:"results"`
		Checks []map[string]any `json:"checks"`
	}
	jsonOf(t, &rep, "lab", "egress", "--sizes", "10,1000", "--methods", "none,ipset,rampart", "--rounds", "1",
		"--window", "500ms", "--out", out)
	if len(rep.Results) != 6*3*2 {
		t.Fatalf("want 36 results, got %d: %+v", len(rep.Results), rep.Results)
	}
	for _, r := range rep.Results {
		if r.Value == nil || r.Min == nil || r.Max == nil {
			t.Fatalf("result lacks a field: %+v", r)
		}
		if r.Status != "ok" {
			t.Errorf("%s, %d prefixes, %s: %s (%s)", r.Method, r.Size, r.Metric, r.Status, r.Reason)
		}
		positive := r.Metric != "setup_seconds" || r.Method != "none"
		if positive && *r.Value <= 0 {
			t.Errorf("%s, %d prefixes, %s: %v", r.Method, r.Size, r.Metric, *r.Value)
		}
	}
	if len(rep.Checks) == 0 || rep.Environment["kernel"] == "" {
		t.Errorf("no checks or environment: %+v %+v", rep.Checks, rep.Environment)
	}
	for _, f := range []string{"egress.json", "egress.csv", "egress-udp_mpps.png", "egress-tcp_gbps.svg"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	assertUnchanged(t, before)
}

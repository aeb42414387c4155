package cli_test

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/rampart-fw/rampart/internal/testutil"
)

// TestBenchLookup runs a short lookup benchmark and checks its JSON: every
// structure for every family, size and traffic, costs and memory measured,
// rampart finding as many sources as the kernel's trie, listed
// traffic always in the list, and rampart's reads counted.
func TestBenchLookup(t *testing.T) {
	testutil.Privileged(t)
	var out struct {
		Results []struct {
			Structure      string   `json:"structure"`
			Family         int      `json:"family"`
			Mix            string   `json:"mix"`
			Size           int      `json:"size"`
			Traffic        string   `json:"traffic"`
			NsPerPacket    float64  `json:"ns_per_packet"`
			VsOneRead      float64  `json:"vs_one_read"`
			HitRate        *float64 `json:"hit_rate"`
			Reads          *float64 `json:"reads_per_lookup"`
			Pages          *float64 `json:"pages_per_lookup"`
			LoadSeconds    *float64 `json:"load_seconds"`
			BytesPerPrefix *float64 `json:"bytes_per_prefix"`
			Error          string   `json:"error"`
		} `json:"results"`
	}
	jsonOf(t, &out, "bench", "lookup", "--sizes", "10,100000", "--mix", "egress", "--family", "4,6", "--repeat", "20000", "--runs", "3")
	if len(out.Results) != 2*2*2*6 {
		t.Fatalf("%d results, want 48", len(out.Results))
	}
	type key struct {
		fam, size int
		traffic   string
	}
	hits := map[key]map[string]float64{}
	for _, r := range out.Results {
		if r.Error != "" || r.NsPerPacket <= 0 || r.Mix != "egress" || r.VsOneRead <= 0 {
			t.Errorf("bad row %+v", r)
		}
		switch r.Structure {
		case "xdp-drop", "parse", "baseline", "one-read":
			if r.LoadSeconds != nil || r.HitRate != nil {
				t.Errorf("%s row with load or hits: %+v", r.Structure, r)
			}
			if r.Structure == "one-read" && (r.Reads == nil || *r.Reads != 1) {
				t.Errorf("one-read row without its one read: %+v", r)
			}
		case "kernel-lpm", "rampart":
			if r.LoadSeconds == nil || r.BytesPerPrefix == nil || *r.BytesPerPrefix <= 0 || r.HitRate == nil {
				t.Fatalf("%s row without load, memory or hits: %+v", r.Structure, r)
			}
			if r.Structure == "rampart" && (r.Reads == nil || *r.Reads < 1 || r.Pages == nil || *r.Pages < 1) {
				t.Errorf("rampart row without reads and pages: %+v", r)
			}
			k := key{r.Family, r.Size, r.Traffic}
			if hits[k] == nil {
				hits[k] = map[string]float64{}
			}
			hits[k][r.Structure] = *r.HitRate
		default:
			t.Errorf("unknown structure %q", r.Structure)
		}
	}
	for k, h := range hits {
		switch {
		case k.traffic == "listed" && (h["rampart"] != 1 || h["kernel-lpm"] != 1):
			t.Errorf("%+v: listed sources not all found: %v", k, h)
		// 100k IPv4 prefixes of the egress mix cover about 1.6% of the space.
		case k.traffic == "uniform" && k.fam == 4 && k.size == 100000 && h["rampart"] < 0.01:
			t.Errorf("%+v: hit rate %v", k, h)
		// Both look up the same sources (a run the kernel cuts short for a
		// signal is run again, so not exactly as many times).
		case math.Abs(h["rampart"]-h["kernel-lpm"]) > 0.02+0.05*h["kernel-lpm"]:
			t.Errorf("%+v: hit rates differ: %v", k, h)
		}
	}
}

// TestBenchRules runs a short rules benchmark: every rule kind for both
// families, each dropping the frame (the bench refuses a run that does not),
// with a cost and its ratio to the drop rule of the same run.
func TestBenchRules(t *testing.T) {
	testutil.Privileged(t)
	var out struct {
		Results []struct {
			Rule        string  `json:"rule"`
			Family      int     `json:"family"`
			NsPerPacket float64 `json:"ns_per_packet"`
			VsDrop      float64 `json:"vs_drop"`
		} `json:"results"`
	}
	jsonOf(t, &out, "bench", "rules", "--repeat", "20000", "--runs", "3")
	if len(out.Results) != 6 {
		t.Fatalf("%d results, want 6: %+v", len(out.Results), out.Results)
	}
	for i, r := range out.Results {
		want := []string{"drop", "limit", "limit-per-source"}[i%3]
		if r.Rule != want || r.Family != []int{4, 6}[i/3] || r.NsPerPacket <= 0 || r.VsDrop <= 0 {
			t.Errorf("result %d: %+v, want rule %s", i, r, want)
		}
		if r.Rule == "drop" && r.VsDrop != 1 {
			t.Errorf("the drop rule against itself: %v", r.VsDrop)
		}
	}
}

// TestBenchProxyAlias: bench proxy is lab proxy under its old name, with
// the same flags, and says it is kept for one release.
func TestBenchProxyAlias(t *testing.T) {
	flags := func(help string) string {
		_, f, _ := strings.Cut(help, "\nFlags:\n")
		return f
	}
	lab := mustRampart(t, "lab", "proxy", "--help")
	old := mustRampart(t, "bench", "proxy", "--help")
	if flags(lab) == "" || flags(old) != flags(lab) {
		t.Errorf("bench proxy's flags differ from lab proxy's:\n%s\n---\n%s", old, lab)
	}
	if !strings.Contains(old, "kept for one release") {
		t.Errorf("bench proxy's help does not say it is kept for one release:\n%s", old)
	}
}

// TestBenchApply runs bench apply on small lists: a check and an apply row
// for every family and mix, each timed and with its process's peak memory,
// and nothing of the run left behind (its namespace, its pins).
func TestBenchApply(t *testing.T) {
	testutil.Privileged(t)
	t.Setenv("RAMPART_TEST_AS_CLI", "1") // the children are this binary, as the CLI
	var out struct {
		Results []struct {
			Step       string  `json:"step"`
			Family     int     `json:"family"`
			Mix        string  `json:"mix"`
			Size       int     `json:"size"`
			FileBytes  int64   `json:"file_bytes"`
			TableBytes uint64  `json:"table_bytes"`
			Seconds    float64 `json:"seconds"`
			SecondsMin float64 `json:"seconds_min"`
			SecondsMax float64 `json:"seconds_max"`
			PeakRSS    int64   `json:"peak_rss_bytes"`
			Generation int     `json:"generation"`
			PolicyHash string  `json:"policy_hash"`
			Error      string  `json:"error"`
		} `json:"results"`
	}
	jsonOf(t, &out, "bench", "apply", "--sizes", "20000", "--mix", "random32,networks,feed", "--family", "4,6", "--runs", "2")
	if len(out.Results) != 2*3*3 {
		t.Fatalf("%d results, want 18: %+v", len(out.Results), out.Results)
	}
	for i, r := range out.Results {
		want := []string{"check", "apply", "apply-change"}[i%3]
		if r.Step != want || r.Family != []int{4, 6}[i/9] || r.Mix != []string{"random32", "networks", "feed"}[i/3%3] || r.Size != 20000 || r.Error != "" {
			t.Errorf("result %d: %+v, want step %s", i, r, want)
		}
		if r.FileBytes < 20000*8 || r.TableBytes == 0 || r.PeakRSS < 1<<20 ||
			r.SecondsMin <= 0 || r.SecondsMin > r.Seconds || r.Seconds > r.SecondsMax {
			t.Errorf("result %d without its sizes or times: %+v", i, r)
		}
	}
	// apply-change measured a change: its first run made the next
	// generation live, of another policy.
	for i := 1; i+1 < len(out.Results); i += 3 {
		apply, change := out.Results[i], out.Results[i+1]
		if change.Generation != apply.Generation+1 || apply.Generation == 0 || change.PolicyHash == apply.PolicyHash {
			t.Errorf("results %d and %d: apply made generation %d of policy %q, the change generation %d of %q", i, i+1,
				apply.Generation, apply.PolicyHash, change.Generation, change.PolicyHash)
		}
	}
	// Named as the labs name theirs: rampart-lab-PID...
	run := fmt.Sprintf("rampart-lab-%d", os.Getpid())
	if ns, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(ns), run+"-apply") {
		t.Errorf("bench apply left its namespace:\n%s", ns)
	}
	if _, err := os.Stat("/sys/fs/bpf/" + run); err == nil {
		t.Errorf("bench apply left its pins in /sys/fs/bpf/%s", run)
	}
}

package egress

import (
	"bytes"
	"encoding/csv"
	"testing"

	"github.com/rampart-fw/rampart/internal/lab"
)

// TestDenyList: the study's mix, distinct, clear of what the lab routes,
// the probe's /24 in it.
func TestDenyList(t *testing.T) {
	l := denyList(10_000)
	if len(l) != 10_000 {
		t.Fatalf("%d prefixes, want 10000", len(l))
	}
	seen := map[string]bool{}
	bits := map[int]int{}
	probe := false
	for _, p := range l {
		if seen[p.String()] {
			t.Fatalf("%s twice", p)
		}
		seen[p.String()] = true
		bits[p.Bits()]++
		if p == probeNet {
			probe = true
		} else if p.Overlaps(servedNet) || p.Overlaps(lab.DstNet4) {
			t.Fatalf("%s overlaps what the lab routes", p)
		}
	}
	if !probe {
		t.Error("the probe's prefix is not in the list")
	}
	if bits[24] < 900 || bits[24] > 1100 || bits[16] < 80 || bits[16] > 120 || bits[32] < 8800 {
		t.Errorf("mix %v, want ~10%% /24, ~1%% /16, the rest /32", bits)
	}
}

func TestParsePing(t *testing.T) {
	out := []byte("PING 100.64.0.1 (100.64.0.1) 56(84) bytes of data.\n" +
		"64 bytes from 100.64.0.1: icmp_seq=1 ttl=64 time=0.010 ms\n" +
		"64 bytes from 100.64.0.1: icmp_seq=2 ttl=64 time=0.030 ms\n" +
		"64 bytes from 100.64.0.1: icmp_seq=3 ttl=64 time=0.020 ms\n")
	avg, p99, err := parsePing(out)
	if err != nil || avg != 20 || p99 != 30 {
		t.Errorf("parsePing: %v %v %v, want 20 30", avg, p99, err)
	}
	if _, _, err := parsePing([]byte("3 packets transmitted, 0 received")); err == nil {
		t.Error("no replies parsed without an error")
	}
}

// TestReport: checks computed from rows of the run, CSV, charts.
func TestReport(t *testing.T) {
	r := &Report{}
	add := func(m string, size int, metric string, v float64) {
		r.Results = append(r.Results, Result{Method: m, Size: size, Metric: metric, Value: v, Min: v, Max: v, Status: lab.StatusOK})
	}
	for _, size := range []int{10, 1_000_000} {
		add("none", size, MetricUDP, 1.0)
		add("none", size, MetricPingAvg, 10)
		add("none", size, MetricTCP, 20)
		add("rampart", size, MetricUDP, 0.97)
		add("rampart", size, MetricPingAvg, 12)
		add("rampart", size, MetricTCP, 19.8)
		add("rampart", size, MetricSetup, 1)
		add("ipset", size, MetricSetup, 12)
		add("iptables", size, MetricUDP, map[int]float64{10: 1, 1_000_000: 0.01}[size])
	}
	r.Results = append(r.Results, Result{Method: "nft-set", Size: 10, Metric: MetricSetup, Status: lab.StatusSkipped, Reason: "nft: not installed"})
	r.finish()
	met := map[string]bool{}
	for _, c := range r.Checks {
		met[c.Name] = c.Met
	}
	for name, want := range map[string]bool{
		"rampart UDP rate / none's, 1000000 prefixes":                                        true,
		"rampart ping / none's, 1000000 prefixes":                                            false,
		"ipset set-up / rampart's, 1000000 prefixes":                                         true,
		"study: iptables does not scale past 1k rules (UDP rate / none's, 1000000 prefixes)": true,
	} {
		if got, ok := met[name]; !ok || got != want {
			t.Errorf("check %q: met %v (present %v), want %v; all: %+v", name, got, ok, want, r.Checks)
		}
	}
	var cb bytes.Buffer
	if err := r.WriteCSV(&cb); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&cb).ReadAll()
	if err != nil || len(rows) != len(r.Results)+1 || rows[0][0] != "method" {
		t.Errorf("CSV: %v %v", rows, err)
	}
	png, err := r.Chart(MetricUDP, "png")
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Errorf("chart: %v", err)
	}
	if _, err := r.Chart("nothing", "png"); err == nil || r.measured("nothing") {
		t.Error("a chart of nothing measured")
	}
}

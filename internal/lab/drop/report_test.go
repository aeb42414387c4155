package drop

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/rampart-fw/rampart/internal/lab"
)

func TestParsers(t *testing.T) {
	nft, err := os.ReadFile("testdata/nft.json")
	if err != nil {
		t.Fatal(err)
	}
	tc, err := os.ReadFile("testdata/tc-qdisc.json")
	if err != nil {
		t.Fatal(err)
	}
	if n, err := parseNftCounters(nft); err != nil || n != 3000012 {
		t.Errorf("nft: %d, %v", n, err)
	}
	if _, err := parseNftCounters([]byte(`{"nftables": []}`)); err == nil {
		t.Error("nft: no counter gave no error")
	}
	if n, err := parseTCDrops(tc); err != nil || n != 2000000 {
		t.Errorf("tc: %d, %v", n, err)
	}
}

func TestSummarise(t *testing.T) {
	var r Result
	r.summarise([]sample{
		{mpps: 1.0, offered: 5, cpuBusy: 1.0, packets: 100},
		{mpps: 2.0, offered: 5, cpuBusy: 0.9, packets: 200},
		{mpps: 1.5, offered: 5, cpuBusy: 0.95, packets: 150},
	})
	if r.MPPS != 1.5 || r.MPPSMin != 1 || r.MPPSMax != 2 || r.OfferedMPPS != 5 || r.Packets != 450 {
		t.Errorf("summary %+v", r)
	}
	// ns/packet is the median of each window's busy/rate: 1000, 450, 633.
	if math.Abs(r.NsPerPacket-633.33) > 0.01 || r.CPUBusy != 95 {
		t.Errorf("ns/packet %v, cpu %v", r.NsPerPacket, r.CPUBusy)
	}
	if r.GeneratorBound {
		t.Error("a saturated receiver dropping 30% of the offer called generator-bound")
	}
	r.summarise([]sample{{mpps: 4.9, offered: 5, cpuBusy: 0.99}})
	if !r.GeneratorBound {
		t.Error("dropping 98% of the offer is generator-bound")
	}
	r.summarise([]sample{{mpps: 3, offered: 5, cpuBusy: 0.6}})
	if !r.GeneratorBound {
		t.Error("a receiver 60% busy is generator-bound")
	}
}

// sampleReport is a run's report as Drop leaves it: both families, a
// skipped and a failed row, and an inversion of the study's order.
func sampleReport() *Report {
	ok := func(layer string, fam int, mpps, lo, hi, ns float64, gb bool) Result {
		r := Result{Layer: layer, Family: fam, Status: lab.StatusOK, MPPS: mpps, MPPSMin: lo, MPPSMax: hi, OfferedMPPS: 5,
			CPUBusy: 90, NsPerPacket: ns, GeneratorBound: gb, Packets: 1000}
		if fam == 4 {
			for _, l := range layers {
				if l.name == layer {
					r.StudyMPPS = l.study
				}
			}
		}
		return r
	}
	rep := &Report{Env: Env{Kernel: "6.18.0", JIT: true, CPUModel: "Test CPU", CPUs: 2, ReceiveCPU: 1, AppCPU: 1, BatchSize: 64,
		Warmup: "2s", Window: "2s", Repeats: 5, Sources: 1000000, Src4: "10.0.0.0/8", Src6: "fd10::/32", Iptables: "iptables-legacy"}}
	rep.Results = []Result{
		ok("app", 4, 0.15, 0.14, 0.16, 6000, false),
		ok("iptables-raw", 4, 1.2, 1.1, 1.3, 700, false),
		ok("nft-ingress", 4, 1.25, 1.0, 1.4, 680, false), // above iptables-raw, unlike the study, within noise
		{Layer: "tc-u32", Family: 4, Status: lab.StatusSkipped, Reason: "the kernel has no gact action", StudyMPPS: 1.8},
		ok("xdp-native", 4, 5.0, 4.9, 5.1, 150, true),
		ok("rampart", 4, 4.9, 4.8, 5.0, 170, true),
		ok("iptables-raw", 6, 1.0, 0.9, 1.1, 800, false),
		ok("xdp-native", 6, 4.5, 4.4, 4.6, 160, true),
		{Layer: "rampart", Family: 6, Status: lab.StatusFailed, Reason: "rampart apply: boom"},
	}
	rep.finish()
	return rep
}

func TestChecksAndOrdering(t *testing.T) {
	rep := sampleReport()
	want := map[string]bool{
		"4 rampart drop rate / xdp-native": true, // 0.98
		"4 rampart ns/packet / xdp-native": true, // 1.13
		"4 xdp-native / iptables-raw":      true, // 4.17
		"6 xdp-native / iptables-raw":      true, // 4.5
		// xdp-native is generator-bound: 700/150 and 800/160 ns per packet.
		"4 xdp-native / iptables-raw capacity (ns/packet ratio)": true,
		"6 xdp-native / iptables-raw capacity (ns/packet ratio)": true,
	}
	got := map[string]bool{}
	for _, c := range rep.Checks {
		got[strings.Join([]string{string(rune('0' + c.Family)), c.Name}, " ")] = c.Met
	}
	for k, met := range want {
		if m, ok := got[k]; !ok || m != met {
			t.Errorf("check %q: got %v (present %v), want %v; all %+v", k, m, ok, met, rep.Checks)
		}
	}
	if _, ok := got["6 rampart drop rate / xdp-native"]; ok {
		t.Error("a check computed from a failed row")
	}
	if len(rep.Ordering) != 1 || !strings.Contains(rep.Ordering[0], "iptables-raw") || !strings.Contains(rep.Ordering[0], "nft-ingress") ||
		!strings.Contains(rep.Ordering[0], "overlap") {
		t.Errorf("ordering notes %q", rep.Ordering)
	}
}

// TestFloorCheck: rampart's ns/packet over the floor's, per family, only
// where both rows ran; and the floor runs whenever rampart's row does.
func TestFloorCheck(t *testing.T) {
	row := func(layer string, fam int, ns float64) Result {
		return Result{Layer: layer, Family: fam, Status: lab.StatusOK, MPPS: 1, NsPerPacket: ns}
	}
	rep := &Report{Results: []Result{
		row("xdp-floor", 4, 200), row("rampart", 4, 210), // 1.05
		row("xdp-floor", 6, 200), row("rampart", 6, 300), // 1.5
		row("xdp-native", 4, 150),
	}}
	rep.finish()
	got := map[int]lab.Check{}
	for _, c := range rep.Checks {
		if c.Name == "rampart ns/packet / xdp-floor" {
			got[c.Family] = c
		}
	}
	if c := got[4]; math.Abs(c.Value-1.05) > 1e-9 || !c.Met || c.Target != "<= 1.1" {
		t.Errorf("IPv4 floor check %+v", c)
	}
	if c := got[6]; math.Abs(c.Value-1.5) > 1e-9 || c.Met {
		t.Errorf("IPv6 floor check %+v", c)
	}
	rep.Results[0].Status = lab.StatusFailed
	rep.finish()
	for _, c := range rep.Checks {
		if c.Name == "rampart ns/packet / xdp-floor" && c.Family == 4 {
			t.Errorf("a floor check without the floor's row: %+v", c)
		}
	}

	for _, tc := range []struct {
		layers []string
		floor  bool
	}{{nil, true}, {[]string{"rampart"}, true}, {[]string{"xdp-floor"}, true}, {[]string{"ipset", "xdp-native"}, false}} {
		if o := (Options{Layers: tc.layers}); o.runs(floorLayer) != tc.floor {
			t.Errorf("layers %v: floor runs %v, want %v", tc.layers, !tc.floor, tc.floor)
		}
	}
}

func TestCSVAndJSON(t *testing.T) {
	rep := sampleReport()
	var cb bytes.Buffer
	if err := rep.WriteCSV(&cb); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&cb).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1+len(rep.Results) || strings.Join(recs[0], ",") != strings.Join(csvHeader, ",") {
		t.Fatalf("csv: %d records, header %v", len(recs), recs[0])
	}
	if r := recs[5]; r[0] != "xdp-native" || r[1] != "4" || r[5] != "5" || r[12] != "true" || r[14] != "10.1" {
		t.Errorf("csv xdp-native row %v", r)
	}
	js, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Results []map[string]any `json:"results"`
	}
	json.Unmarshal(js, &back)
	for _, k := range []string{"layer", "family", "mpps", "mpps_min", "mpps_max", "offered_mpps", "cpu_busy", "ns_per_packet", "generator_bound"} {
		if _, ok := back.Results[0][k]; !ok {
			t.Errorf("JSON result lacks %q", k)
		}
	}
}

func TestChart(t *testing.T) {
	rep := sampleReport()
	pngBytes, err := rep.Chart("png")
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(pngBytes))
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 600 || b.Dy() < 300 {
		t.Errorf("PNG is %v", b)
	}
	// Every series drew bars: its colour covers a fair area.
	for name, c := range map[string]color.RGBA{"IPv4": lab.ColorV4, "IPv6": lab.ColorV6, "study": colorStudy} {
		if n := countColor(img, c); n < 200 {
			t.Errorf("%s bars: %d pixels of their colour", name, n)
		}
	}
	svg, err := rep.Chart("svg")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<svg", "app", "xdp-native", "rampart", "IPv4 (this run)", "IPv6 (this run)", "2018 study", "log scale"} {
		if !bytes.Contains(svg, []byte(want)) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	if _, err := (&Report{}).Chart("svg"); err == nil {
		t.Error("a report without rows charted")
	}
}

func countColor(img image.Image, want color.RGBA) int {
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if uint8(r>>8) == want.R && uint8(g>>8) == want.G && uint8(bl>>8) == want.B {
				n++
			}
		}
	}
	return n
}

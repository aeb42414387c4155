package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/rampart-fw/rampart/internal/lab"
	"github.com/rampart-fw/rampart/internal/lab/drop"
	"github.com/rampart-fw/rampart/internal/lab/egress"
)

// TestRenderDrop: the drop table shows the run's rows beside the study's,
// the rows that did not run and why, the environment, the targets and
// where the order differs from the study's.
func TestRenderDrop(t *testing.T) {
	ok := func(layer string, fam int, mpps, study float64, gb bool) drop.Result {
		return drop.Result{Layer: layer, Family: fam, Status: lab.StatusOK, MPPS: mpps, MPPSMin: mpps, MPPSMax: mpps, OfferedMPPS: 5,
			CPUBusy: 90, NsPerPacket: 150, GeneratorBound: gb, Packets: 1000, StudyMPPS: study}
	}
	rep := &drop.Report{
		Env: drop.Env{Kernel: "6.18.0", JIT: true, CPUModel: "Test CPU", CPUs: 2, ReceiveCPU: 1, AppCPU: 1, BatchSize: 64,
			Warmup: "2s", Window: "2s", Repeats: 5, Sources: 1000000, Src4: "10.0.0.0/8", Src6: "fd10::/32", Iptables: "iptables-legacy"},
		Results: []drop.Result{
			ok("iptables-raw", 4, 1.2, 1.688, false),
			{Layer: "tc-u32", Family: 4, Status: lab.StatusSkipped, Reason: "the kernel has no gact action", StudyMPPS: 1.8},
			ok("xdp-native", 4, 5.0, 10.1, true),
			ok("xdp-floor", 4, 4.8, 0, true),
			{Layer: "rampart", Family: 6, Status: lab.StatusFailed, Reason: "rampart apply: boom"},
		},
		Checks: []lab.Check{{Name: "xdp-native / iptables-raw", Family: 4, Value: 5.0 / 1.2, Target: ">= 4", Met: true},
			{Name: "rampart ns/packet / xdp-floor", Family: 4, Value: 1.05, Target: "<= 1.1", Met: true}},
		Ordering: []string{"IPv4: nft-ingress 1.250 Mpps vs iptables-raw 1.200 Mpps, the study had 1.530 vs 1.688; their min-max ranges overlap"},
	}
	var tb bytes.Buffer
	renderDrop(&tb, rep)
	out := tb.String()
	for _, want := range []string{
		"xdp-native", "10.100", "1.688", "generator-bound",
		"skipped: the kernel has no gact action", "failed: rampart apply: boom",
		"kernel 6.18.0, BPF JIT on, Test CPU (2 CPUs)", "iptables-legacy",
		"IPv4 xdp-native / iptables-raw = 4.17 (target >= 4): met", "order differs from the study",
		"xdp-floor", "IPv4 rampart ns/packet / xdp-floor = 1.05 (target <= 1.1): met",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

// TestRenderEgress: a table per metric, median and range in each cell,
// the rows that did not run, and the checks.
func TestRenderEgress(t *testing.T) {
	r := &egress.Report{
		Results: []egress.Result{
			{Method: "rampart", Size: 10, Metric: egress.MetricUDP, Value: 0.97, Min: 0.97, Max: 0.97, Status: lab.StatusOK},
			{Method: "nft-set", Size: 10, Metric: egress.MetricSetup, Status: lab.StatusSkipped, Reason: "nft: not installed"},
		},
		Checks: []lab.Check{{Name: "rampart ping / none's, 10 prefixes", Family: 4, Value: 1.2, Target: "<= 1.05", Met: false}},
	}
	var tb bytes.Buffer
	renderEgress(&tb, r)
	for _, want := range []string{"udp_mpps", "rampart", "0.97 (0.97-0.97)", "nft-set, 10 prefixes: skipped: nft: not installed", "missed"} {
		if !strings.Contains(tb.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tb.String())
		}
	}
}

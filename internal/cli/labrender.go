package cli

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	labcrowdsec "github.com/rampart-fw/rampart/internal/lab/crowdsec"

	"github.com/rampart-fw/rampart/internal/lab"
	"github.com/rampart-fw/rampart/internal/lab/drop"
	"github.com/rampart-fw/rampart/internal/lab/egress"
	"github.com/rampart-fw/rampart/internal/lab/flood"
	labproxy "github.com/rampart-fw/rampart/internal/lab/proxy"
)

// renderDrop prints `lab drop`'s report for people: a row per layer and
// family beside the study's number, the environment, targets and where
// the order differs from the study's.
func renderDrop(w io.Writer, r *drop.Report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LAYER\tFAMILY\tMPPS\tMIN-MAX\tOFFERED\tCPU%\tNS/PKT\tSETUP\tSTUDY\tNOTE")
	for _, x := range r.Results {
		if x.Status != lab.StatusOK {
			fmt.Fprintf(tw, "%s\tIPv%d\t-\t-\t-\t-\t-\t-\t%s\t%s: %s\n", x.Layer, x.Family, studyCell(x), x.Status, x.Reason)
			continue
		}
		var note []string
		if x.GeneratorBound {
			note = append(note, "generator-bound")
		}
		if x.Mode != "" {
			note = append(note, x.Mode)
		}
		fmt.Fprintf(tw, "%s\tIPv%d\t%.3f\t%.3f-%.3f\t%.2f\t%.0f\t%.0f\t%.2fs\t%s\t%s\n", x.Layer, x.Family, x.MPPS, x.MPPSMin, x.MPPSMax,
			x.OfferedMPPS, x.CPUBusy, x.NsPerPacket, x.SetupSeconds, studyCell(x), strings.Join(note, ", "))
	}
	tw.Flush()
	e := r.Env
	fmt.Fprintf(w, "\nkernel %s, BPF JIT %s, %s (%d CPUs); generator on CPU %d (batch %d), receive on CPU %d, application on CPU %d\n",
		e.Kernel, onOff(e.JIT), e.CPUModel, e.CPUs, e.GeneratorCPU, e.BatchSize, e.ReceiveCPU, e.AppCPU)
	fmt.Fprintf(w, "%d windows of %s after %s of warm-up; flood from %d sources in %s and %s, the list-based layers' list; %s\n",
		e.Repeats, e.Window, e.Warmup, e.Sources, e.Src4, e.Src6, e.Iptables)
	if e.Unlisted {
		fmt.Fprintln(w, "unlisted: the list held as many other sources, none of the flood's; rampart dropped the flood by the rule after the list's")
	}
	if e.Emulated {
		fmt.Fprintf(w, "EMULATED: %s is a QEMU CPU model; these rates show each layer works, they are no performance figures\n", e.CPUModel)
	}
	fmt.Fprintln(w, "MPPS is what the layer's own counter dropped; NS/PKT is receiving-CPU time per dropped packet; SETUP is the time to set the layer up, its list loaded; STUDY is the 2018 study's IPv4 Mpps on a 10G NIC.")
	if len(r.Checks) > 0 {
		fmt.Fprintln(w, "\ntargets:")
		for _, c := range r.Checks {
			fmt.Fprintf(w, "  IPv%d %s = %.2f (target %s): %s\n", c.Family, c.Name, c.Value, c.Target, metWord(c.Met))
		}
	}
	if len(r.Ordering) > 0 {
		fmt.Fprintln(w, "\norder differs from the study:")
		for _, n := range r.Ordering {
			fmt.Fprintln(w, "  "+n)
		}
	}
}

func studyCell(x drop.Result) string {
	if x.StudyMPPS == 0 {
		return "-"
	}
	return strconv.FormatFloat(x.StudyMPPS, 'f', 3, 64)
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func metWord(b bool) string {
	if b {
		return "met"
	}
	return "missed"
}

// renderFlood prints `lab flood`'s report: one line per row, then the
// targets.
func renderFlood(w io.Writer, r *flood.Report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FLOOD\tDEFENCE\tIPv\tLEGIT\tANSWERED\tP50 ms\tP99 ms\tP99 ×UNFLOODED\tOFFERED Mpps\tRECEIVED Mpps\tSTOPPED Mpps\tSYN-ACK Mpps/CORE\tCPU BUSY\tns/PACKET")
	for _, x := range r.Results {
		if x.Status != lab.StatusOK {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s: %s\n", x.Flood, x.Defence, x.Family, x.Legit, x.Status, x.Reason)
			continue
		}
		opt := func(v float64, f string) string {
			if v == 0 {
				return "-"
			}
			return fmt.Sprintf(f, v)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%.1f%% of %d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f%%\t%s\n",
			x.Flood, x.Defence, x.Family, x.Legit, 100*x.LegitSuccess, x.LegitRequests,
			opt(x.LegitP50Ms, "%.2f"), opt(x.LegitP99Ms, "%.2f"), opt(x.P99VsUnflooded, "%.2f"),
			opt(x.OfferedMPPS, "%.2f"), opt(x.ReceivedMPPS, "%.2f"), opt(x.DroppedMPPS, "%.3f"), opt(x.AnsweredPerCore, "%.3f"),
			100*x.CPUBusy, opt(x.NsPerPacket, "%.0f"))
	}
	tw.Flush()
	if len(r.Checks) > 0 {
		fmt.Fprintln(w, "\nTargets:")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, c := range r.Checks {
			fmt.Fprintf(tw, "  IPv%d\t%s\t%.3f\t%s\t%s\n", c.Family, c.Name, c.Value, c.Target, metWord(c.Met))
		}
		tw.Flush()
	}
}

// renderEgress prints `lab egress`'s report: per metric, methods × sizes
// (median and range), the rows that did not run, then the checks.
func renderEgress(w io.Writer, r *egress.Report) {
	sizes := r.Sizes()
	for _, metric := range egress.Metrics {
		fmt.Fprintf(w, "%s\n", metric)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprint(tw, "METHOD")
		for _, s := range sizes {
			fmt.Fprintf(tw, "\t%d", s)
		}
		fmt.Fprintln(tw)
		for _, m := range r.Methods() {
			fmt.Fprint(tw, m)
			for _, s := range sizes {
				fmt.Fprintf(tw, "\t%s", egressCell(r, m, s, metric))
			}
			fmt.Fprintln(tw)
		}
		tw.Flush()
		fmt.Fprintln(w)
	}
	for _, x := range r.Results {
		if x.Status != lab.StatusOK && x.Metric == egress.MetricSetup {
			fmt.Fprintf(w, "%s, %d prefixes: %s: %s\n", x.Method, x.Size, x.Status, x.Reason)
		}
	}
	if len(r.Checks) > 0 {
		fmt.Fprintln(w, "\nChecks:")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, c := range r.Checks {
			fmt.Fprintf(tw, "  %s\t%.3f\t%s\t%s\n", c.Name, c.Value, c.Target, metWord(c.Met))
		}
		tw.Flush()
	}
}

// egressCell is a method's metric at a size: median (min-max), or why
// there is none.
func egressCell(r *egress.Report, method string, size int, metric string) string {
	num := func(v float64) string { return strconv.FormatFloat(v, 'g', 3, 64) }
	for _, x := range r.Results {
		if x.Method == method && x.Size == size && x.Metric == metric {
			if x.Status != lab.StatusOK {
				return x.Status
			}
			return fmt.Sprintf("%s (%s-%s)", num(x.Value), num(x.Min), num(x.Max))
		}
	}
	return "-"
}

// renderProxy prints the proxy benchmark's medians, one row per method,
// and the checks; command names the command that ran it.
func renderProxy(w io.Writer, command string, r *labproxy.Report) {
	fmt.Fprintf(w, "%s: %s, %d CPUs, kernel %s; %d rounds of %s; %d UDP sessions\n\n", command, r.Host.CPUModel, r.Host.CPUs, r.Host.Kernel, r.Rounds, r.Window, r.Sessions)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "METHOD\tTCP 1 CONN Gbit/s\tTCP 16 CONNS Gbit/s\tCONNS/s\tUDP pps\tRSS 1k / CAP MB\tSTATUS")
	for _, x := range r.Results {
		cell := func(k, format string) string {
			if v, ok := x.Metrics[k]; ok {
				return fmt.Sprintf(format, v)
			}
			return "-"
		}
		status := x.Status
		if x.Reason != "" {
			status += ": " + x.Reason
		}
		rss := "-"
		if lo, ok := x.Metrics[labproxy.MetricRSSLow]; ok {
			rss = fmt.Sprintf("%.1f / %.1f", lo, x.Metrics[labproxy.MetricRSSHigh])
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", x.Method, cell(labproxy.MetricTCP1, "%.2f"), cell(labproxy.MetricTCP16, "%.2f"),
			cell(labproxy.MetricCPS, "%.0f"), cell(labproxy.MetricUDPPps, "%.0f"), rss, status)
	}
	tw.Flush()
	if len(r.Checks) > 0 {
		fmt.Fprintln(w)
		for _, c := range r.Checks {
			fmt.Fprintf(w, "%-26s %6.3f  target %s  %s\n", c.Name, c.Value, c.Target, map[bool]string{true: "met", false: "MISSED"}[c.Met])
		}
	}
}

func renderCrowdSec(w io.Writer, command string, r *labcrowdsec.Report) {
	fmt.Fprintf(w, "%s: %s, %d CPUs, kernel %s\n\n", command, r.Host.CPUModel, r.Host.CPUs, r.Host.Kernel)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "BOUNCER\tDECISIONS\tIMPORT s\tENFORCED s\tAFTER IMPORT s\tCPU s\tRSS MB\tPEAK MB\tFLOOD ns/pkt\tMpps\tLEAKED\tSTATUS")
	for _, x := range r.Rows {
		status := x.Status
		if x.Reason != "" {
			status += ": " + x.Reason
		}
		if x.Status != "ok" {
			fmt.Fprintf(tw, "%s\t%d\t-\t-\t-\t-\t-\t-\t-\t-\t-\t%s\n", x.Bouncer, x.Decisions, status)
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.1f\t%.1f\t%.0f\t%.2f\t%d\t%s\n", x.Bouncer, x.Decisions, x.ImportSeconds, x.EnforcedSeconds,
			x.AfterImportSeconds, x.CPUSeconds, float64(x.RSSBytes)/1e6, float64(x.PeakRSSBytes)/1e6, x.NsPerPacket, x.FloodMpps, x.Leaked, status)
	}
	tw.Flush()
	for _, s := range r.Speedup {
		fmt.Fprintf(w, "\ncs-firewall-bouncer / rampart, import's end to enforced, %d decisions: %.1f× (target ≥ 10 at 100,000)", s.Decisions, s.Ratio)
		fmt.Fprintf(w, "\nrampart / cs-firewall-bouncer, CPU per packet of a flood from the banned sources, %d decisions: %.2f (target ≤ 0.33)", s.Decisions, s.Cost)
	}
	if len(r.Speedup) > 0 {
		fmt.Fprintln(w)
	}
	for _, x := range r.Refresh {
		kept := map[bool]string{true: "still enforced", false: "LIFTED"}[x.Kept]
		if x.Status != "ok" {
			kept = x.Status + ": " + x.Reason
		}
		fmt.Fprintf(w, "\nrefresh, %s: %d bans for %s, sent again for 1h halfway: %s 5 s after the first expiry", x.Bouncer, x.Decisions, x.First, kept)
	}
	if len(r.Refresh) > 0 {
		fmt.Fprintln(w)
	}
}

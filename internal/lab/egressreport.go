package lab

import (
	"encoding/csv"
	"errors"
	"fmt"
	"image/color"
	"io"
	"slices"
	"strconv"
	"text/tabwriter"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// value is a method's median of a metric at a size, if measured.
func (r *EgressReport) value(method string, size int, metric string) (float64, bool) {
	for _, x := range r.Results {
		if x.Method == method && x.Size == size && x.Metric == metric && x.Status == StatusOK {
			return x.Value, true
		}
	}
	return 0, false
}

func (r *EgressReport) sizes() []int {
	var s []int
	for _, x := range r.Results {
		if !slices.Contains(s, x.Size) {
			s = append(s, x.Size)
		}
	}
	slices.Sort(s)
	return s
}

func (r *EgressReport) methods() []string {
	var m []string
	for _, x := range r.Results {
		if !slices.Contains(m, x.Method) {
			m = append(m, x.Method)
		}
	}
	return m
}

// finish computes rampart's targets and the study's findings, each from
// rows of the same run.
func (r *EgressReport) finish() {
	r.Checks = []Check{}
	ratio := func(method, metric string, size int) (float64, bool) {
		a, ok1 := r.value(method, size, metric)
		b, ok2 := r.value("none", size, metric)
		if !ok1 || !ok2 || b == 0 {
			return 0, false
		}
		return a / b, true
	}
	for _, size := range r.sizes() {
		if v, ok := ratio("rampart", MetricUDP, size); ok {
			r.Checks = append(r.Checks, Check{fmt.Sprintf("rampart UDP rate / none's, %d prefixes", size), 4, v, ">= 0.95", v >= 0.95})
		}
		if v, ok := ratio("rampart", MetricCPU, size); ok {
			r.Checks = append(r.Checks, Check{fmt.Sprintf("rampart CPU at 1 Gbit/s / none's, %d prefixes", size), 4, v, "<= 1.05", v <= 1.05})
		}
		if v, ok := ratio("rampart", MetricPingAvg, size); ok {
			r.Checks = append(r.Checks, Check{fmt.Sprintf("rampart ping / none's, %d prefixes", size), 4, v, "<= 1.05", v <= 1.05})
		}
		a, ok1 := r.value("ipset", size, MetricSetup)
		b, ok2 := r.value("rampart", size, MetricSetup)
		if ok1 && ok2 && b > 0 && size >= 1_000_000 {
			r.Checks = append(r.Checks, Check{fmt.Sprintf("ipset set-up / rampart's, %d prefixes", size), 4, a / b, ">= 10", a/b >= 10})
		}
	}
	// The study's findings, at the largest size each method reached.
	last := func(method, metric string) (int, float64, bool) {
		s := r.sizes()
		for i := len(s) - 1; i >= 0; i-- {
			if v, ok := ratio(method, metric, s[i]); ok {
				return s[i], v, true
			}
		}
		return 0, 0, false
	}
	for _, m := range []string{"iptables", "ipset", "nft-set", "tc-lpm", "rampart"} {
		if size, v, ok := last(m, MetricTCP); ok {
			want := m != "iptables" || size <= 10_000
			r.Checks = append(r.Checks, Check{fmt.Sprintf("study: one TCP connection keeps its rate with %s (%d prefixes; the study: all but iptables past 10k)", m, size), 4, v, "≥ 0.95 expected " + yesNo(want), (v >= 0.95) == want})
		}
	}
	if size, v, ok := last("iptables", MetricUDP); ok && size > 1000 {
		r.Checks = append(r.Checks, Check{fmt.Sprintf("study: iptables does not scale past 1k rules (UDP rate / none's, %d prefixes)", size), 4, v, "< 0.95", v < 0.95})
	}
	s := r.sizes()
	if len(s) > 0 {
		big := s[len(s)-1]
		a, ok1 := r.value("ipset", big, MetricUDP)
		b, ok2 := r.value("tc-lpm", big, MetricUDP)
		if ok1 && ok2 && b > 0 {
			r.Checks = append(r.Checks, Check{fmt.Sprintf("study: ipset a little faster than the eBPF trie (UDP, %d prefixes)", big), 4, a / b, "> 1", a/b > 1})
		}
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// WriteTable prints, per metric, methods × sizes (median and range), then
// the checks.
func (r *EgressReport) WriteTable(w io.Writer) {
	sizes := r.sizes()
	for _, metric := range EgressMetrics {
		fmt.Fprintf(w, "%s\n", metric)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprint(tw, "METHOD")
		for _, s := range sizes {
			fmt.Fprintf(tw, "\t%d", s)
		}
		fmt.Fprintln(tw)
		for _, m := range r.methods() {
			fmt.Fprint(tw, m)
			for _, s := range sizes {
				fmt.Fprintf(tw, "\t%s", r.cell(m, s, metric))
			}
			fmt.Fprintln(tw)
		}
		tw.Flush()
		fmt.Fprintln(w)
	}
	for _, x := range r.Results {
		if x.Status != StatusOK && x.Metric == MetricSetup {
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

func (r *EgressReport) cell(method string, size int, metric string) string {
	for _, x := range r.Results {
		if x.Method == method && x.Size == size && x.Metric == metric {
			if x.Status != StatusOK {
				return x.Status
			}
			return fmt.Sprintf("%s (%s-%s)", num(x.Value), num(x.Min), num(x.Max))
		}
	}
	return "-"
}

func num(v float64) string { return strconv.FormatFloat(v, 'g', 3, 64) }

// WriteCSV writes one line per result.
func (r *EgressReport) WriteCSV(w io.Writer) error {
	c := csv.NewWriter(w)
	c.Write([]string{"method", "size", "metric", "value", "min", "max", "status", "reason"})
	for _, x := range r.Results {
		c.Write([]string{x.Method, strconv.Itoa(x.Size), x.Metric, num(x.Value), num(x.Min), num(x.Max), x.Status, x.Reason})
	}
	c.Flush()
	return c.Error()
}

// methodColors, in EgressMethods' order.
var methodColors = []color.RGBA{
	{0x7f, 0x7f, 0x7f, 0xff}, {0xd6, 0x27, 0x28, 0xff}, {0xff, 0x7f, 0x0e, 0xff},
	{0x2c, 0xa0, 0x2c, 0xff}, {0x94, 0x67, 0xbd, 0xff}, {0x1f, 0x77, 0xb4, 0xff},
}

// Measured says whether any method has a value of metric.
func (r *EgressReport) Measured(metric string) bool {
	for _, x := range r.Results {
		if x.Metric == metric && x.Status == StatusOK {
			return true
		}
	}
	return false
}

// Chart draws one metric against list size (log x), a line per method.
func (r *EgressReport) Chart(metric, format string) ([]byte, error) {
	p := plot.New()
	p.Title.Text = metric + " by list size"
	p.X.Label.Text = "prefixes in the list (log scale)"
	p.Y.Label.Text = metric
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = true
	any := false
	for i, m := range EgressMethodNames() {
		var xy plotter.XYs
		for _, s := range r.sizes() {
			if v, ok := r.value(m, s, metric); ok {
				xy = append(xy, plotter.XY{X: float64(s), Y: v})
			}
		}
		if len(xy) == 0 {
			continue
		}
		l, pts, err := plotter.NewLinePoints(xy)
		if err != nil {
			return nil, err
		}
		l.Color, pts.Color = methodColors[i], methodColors[i]
		p.Add(l, pts)
		p.Legend.Add(m, l, pts)
		any = true
	}
	if !any {
		return nil, errors.New("nothing measured to chart")
	}
	return render(p, 8*vg.Inch, format)
}

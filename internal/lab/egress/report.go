package egress

import (
	"encoding/csv"
	"errors"
	"fmt"
	"image/color"
	"io"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/rampart-fw/rampart/internal/lab"
)

// value is a method's median of a metric at a size, if measured.
func (r *Report) value(method string, size int, metric string) (float64, bool) {
	for _, x := range r.Results {
		if x.Method == method && x.Size == size && x.Metric == metric && x.Status == lab.StatusOK {
			return x.Value, true
		}
	}
	return 0, false
}

// Sizes lists the list sizes that have rows, smallest first.
func (r *Report) Sizes() []int {
	var s []int
	for _, x := range r.Results {
		if !slices.Contains(s, x.Size) {
			s = append(s, x.Size)
		}
	}
	slices.Sort(s)
	return s
}

// Methods lists the methods that have rows, in the run's order.
func (r *Report) Methods() []string {
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
func (r *Report) finish() {
	r.Checks = []lab.Check{}
	ratio := func(method, metric string, size int) (float64, bool) {
		a, ok1 := r.value(method, size, metric)
		b, ok2 := r.value("none", size, metric)
		if !ok1 || !ok2 || b == 0 {
			return 0, false
		}
		return a / b, true
	}
	for _, size := range r.Sizes() {
		if v, ok := ratio("rampart", MetricUDP, size); ok {
			r.Checks = append(r.Checks, lab.Check{Name: fmt.Sprintf("rampart UDP rate / none's, %d prefixes", size), Family: 4, Value: v, Target: ">= 0.95", Met: v >= 0.95})
		}
		if v, ok := ratio("rampart", MetricCPU, size); ok {
			r.Checks = append(r.Checks, lab.Check{Name: fmt.Sprintf("rampart CPU at 1 Gbit/s / none's, %d prefixes", size), Family: 4, Value: v, Target: "<= 1.05", Met: v <= 1.05})
		}
		if v, ok := ratio("rampart", MetricPingAvg, size); ok {
			r.Checks = append(r.Checks, lab.Check{Name: fmt.Sprintf("rampart ping / none's, %d prefixes", size), Family: 4, Value: v, Target: "<= 1.05", Met: v <= 1.05})
		}
		a, ok1 := r.value("ipset", size, MetricSetup)
		b, ok2 := r.value("rampart", size, MetricSetup)
		if ok1 && ok2 && b > 0 && size >= 1_000_000 {
			r.Checks = append(r.Checks, lab.Check{Name: fmt.Sprintf("ipset set-up / rampart's, %d prefixes", size), Family: 4, Value: a / b, Target: ">= 10", Met: a/b >= 10})
		}
	}
	// The study's findings, at the largest size each method reached.
	last := func(method, metric string) (int, float64, bool) {
		s := r.Sizes()
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
			r.Checks = append(r.Checks, lab.Check{Name: fmt.Sprintf("study: one TCP connection keeps its rate with %s (%d prefixes; the study: all but iptables past 10k)", m, size), Family: 4, Value: v, Target: "≥ 0.95 expected " + yesNo(want), Met: (v >= 0.95) == want})
		}
	}
	if size, v, ok := last("iptables", MetricUDP); ok && size > 1000 {
		r.Checks = append(r.Checks, lab.Check{Name: fmt.Sprintf("study: iptables does not scale past 1k rules (UDP rate / none's, %d prefixes)", size), Family: 4, Value: v, Target: "< 0.95", Met: v < 0.95})
	}
	s := r.Sizes()
	if len(s) > 0 {
		big := s[len(s)-1]
		a, ok1 := r.value("ipset", big, MetricUDP)
		b, ok2 := r.value("tc-lpm", big, MetricUDP)
		if ok1 && ok2 && b > 0 {
			r.Checks = append(r.Checks, lab.Check{Name: fmt.Sprintf("study: ipset a little faster than the eBPF trie (UDP, %d prefixes)", big), Family: 4, Value: a / b, Target: "> 1", Met: a/b > 1})
		}
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func num(v float64) string { return strconv.FormatFloat(v, 'g', 3, 64) }

// WriteCSV writes one line per result.
func (r *Report) WriteCSV(w io.Writer) error {
	c := csv.NewWriter(w)
	c.Write([]string{"method", "size", "metric", "value", "min", "max", "status", "reason"})
	for _, x := range r.Results {
		c.Write([]string{x.Method, strconv.Itoa(x.Size), x.Metric, num(x.Value), num(x.Min), num(x.Max), x.Status, x.Reason})
	}
	c.Flush()
	return c.Error()
}

// methodColors, in the order of MethodNames.
var methodColors = []color.RGBA{
	{0x7f, 0x7f, 0x7f, 0xff}, {0xd6, 0x27, 0x28, 0xff}, {0xff, 0x7f, 0x0e, 0xff},
	{0x2c, 0xa0, 0x2c, 0xff}, {0x94, 0x67, 0xbd, 0xff}, {0x1f, 0x77, 0xb4, 0xff},
}

// measured says whether any method has a value of metric.
func (r *Report) measured(metric string) bool {
	for _, x := range r.Results {
		if x.Metric == metric && x.Status == lab.StatusOK {
			return true
		}
	}
	return false
}

// Chart draws one metric against list size (log x), a line per method.
func (r *Report) Chart(metric, format string) ([]byte, error) {
	p := plot.New()
	p.Title.Text = metric + " by list size"
	p.X.Label.Text = "prefixes in the list (log scale)"
	p.Y.Label.Text = metric
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = true
	any := false
	for i, m := range MethodNames() {
		var xy plotter.XYs
		for _, s := range r.Sizes() {
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
	return lab.Render(p, 8*vg.Inch, format)
}

// WriteFiles writes egress.json, egress.csv and a chart for each metric
// something measured (egress-METRIC.png and .svg) into dir and returns
// their paths.
func (r *Report) WriteFiles(dir string) ([]string, error) {
	f := &lab.Files{Dir: dir}
	err := errors.Join(f.JSON("egress.json", r), f.CSV("egress.csv", r.WriteCSV))
	for _, metric := range Metrics {
		if r.measured(metric) {
			err = errors.Join(err, f.Charts("egress-"+metric, func(format string) ([]byte, error) { return r.Chart(metric, format) }))
		}
	}
	return f.Paths, err
}

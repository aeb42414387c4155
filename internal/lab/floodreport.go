package lab

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// WriteTable prints one line per row, then the targets.
func (r *FloodReport) WriteTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FLOOD\tDEFENCE\tIPv\tLEGIT\tANSWERED\tP50 ms\tP99 ms\tP99 ×UNFLOODED\tOFFERED Mpps\tRECEIVED Mpps\tSTOPPED Mpps\tSYN-ACK Mpps/CORE\tCPU BUSY\tns/PACKET")
	for _, x := range r.Results {
		if x.Status != StatusOK {
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

// Chart draws the share of legitimate requests answered, one bar per row
// and family. format is "png" or "svg".
func (r *FloodReport) Chart(format string) ([]byte, error) {
	type key struct{ flood, defence, legit string }
	var rows []key
	for _, x := range r.Results {
		if k := (key{x.Flood, x.Defence, x.Legit}); !slices.Contains(rows, k) {
			rows = append(rows, k)
		}
	}
	if len(rows) == 0 {
		return nil, errors.New("no rows to chart")
	}
	p := plot.New()
	p.Title.Text = "Legitimate requests answered within " + legitTimeout.String() + " under each flood"
	p.Y.Label.Text = "% answered"
	p.Y.Min, p.Y.Max = 0, 105
	names := make([]string, len(rows))
	for i, k := range rows {
		names[i] = fmt.Sprintf("%s flood (%s)\n%s", k.flood, k.legit, k.defence)
	}
	p.NominalX(names...)
	p.Legend.Top = true
	width := vg.Points(14)
	for i, fam := range []int{4, 6} {
		vals := make(plotter.Values, len(rows))
		any := false
		for j, k := range rows {
			if x := r.find(k.defence, k.flood, fam, k.legit); x != nil {
				vals[j], any = 100*x.LegitSuccess, true
			}
		}
		if !any {
			continue
		}
		b, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return nil, err
		}
		b.Color = colorV4
		if fam == 6 {
			b.Color = colorV6
		}
		b.Offset = width * vg.Length(float64(i)-0.5)
		p.Add(b)
		p.Legend.Add(fmt.Sprintf("IPv%d", fam), b)
	}
	return render(p, vg.Length(max(8, 1.2*float64(len(rows))))*vg.Inch, format)
}

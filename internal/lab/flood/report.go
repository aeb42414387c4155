package flood

import (
	"errors"
	"fmt"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/rampart-fw/rampart/internal/lab"
)

// WriteFiles writes flood.json and the chart, flood.png and flood.svg,
// into dir and returns their paths.
func (r *Report) WriteFiles(dir string) ([]string, error) {
	f := &lab.Files{Dir: dir}
	err := errors.Join(f.JSON("flood.json", r), f.Charts("flood", r.Chart))
	return f.Paths, err
}

// Chart draws the share of legitimate requests answered, one bar per row
// and family. format is "png" or "svg".
func (r *Report) Chart(format string) ([]byte, error) {
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
		b.Color = lab.ColorV4
		if fam == 6 {
			b.Color = lab.ColorV6
		}
		b.Offset = width * vg.Length(float64(i)-0.5)
		p.Add(b)
		p.Legend.Add(fmt.Sprintf("IPv%d", fam), b)
	}
	return lab.Render(p, vg.Length(max(8, 1.2*float64(len(rows))))*vg.Inch, format)
}

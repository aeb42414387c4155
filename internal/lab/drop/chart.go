package drop

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/rampart-fw/rampart/internal/lab"
)

// colorStudy draws the study's IPv4 numbers, in grey beside the run's.
var colorStudy = color.RGBA{R: 0xa0, G: 0xa0, B: 0xa0, A: 0xff}

// Chart draws the run as grouped bars, one group per layer, IPv4 and IPv6
// side by side with their min-max as whiskers and the study's IPv4 number
// beside them, on a log scale (the layers span two orders of magnitude).
// format is "png" or "svg".
func (r *Report) Chart(format string) ([]byte, error) {
	var names []string
	study := &logBars{name: "IPv4, the 2018 study (10G NIC)", color: colorStudy}
	for _, l := range layers {
		if slices.ContainsFunc(r.Results, func(x Result) bool { return x.Layer == l.name }) {
			names = append(names, l.name)
			study.values, study.low, study.high = append(study.values, l.study), append(study.low, 0), append(study.high, 0)
		}
	}
	if len(names) == 0 {
		return nil, errors.New("no rows to chart")
	}
	series := []*logBars{}
	for _, fam := range r.families() {
		b := &logBars{name: fmt.Sprintf("IPv%d (this run)", fam), color: lab.ColorV4}
		if fam == 6 {
			b.color = lab.ColorV6
		}
		for _, name := range names {
			var v, lo, hi float64
			if x := r.find(name, fam); x != nil {
				v, lo, hi = x.MPPS, x.MPPSMin, x.MPPSMax
			}
			b.values, b.low, b.high = append(b.values, v), append(b.low, lo), append(b.high, hi)
		}
		series = append(series, b)
	}
	series = append(series, study)

	p := plot.New()
	p.Title.Text = "Packets one receiving CPU drops per second, by layer"
	p.Y.Label.Text = "Mpps dropped (log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.NominalX(names...)
	p.Legend.Top = true
	p.Legend.Left = true
	width := vg.Points(14)
	for i, b := range series {
		b.width = width
		b.offset = width * vg.Length(float64(i)-float64(len(series)-1)/2)
		p.Add(b)
		p.Legend.Add(b.name, b)
	}
	lo, hi := math.Inf(1), 0.0
	for _, b := range series {
		for i, v := range b.values {
			if v > 0 {
				lo, hi = min(lo, v, nonZero(b.low[i], v)), max(hi, v, b.high[i])
			}
		}
	}
	if hi == 0 { // nothing measured: an empty chart still says so
		lo, hi = 0.1, 10
		p.Title.Text += " (no layer measured)"
	}
	p.Y.Min = math.Pow(10, math.Floor(math.Log10(lo)))
	p.Y.Max = math.Pow(10, math.Ceil(math.Log10(hi*1.5)))
	return lab.Render(p, vg.Length(max(8, 1.1*float64(len(names))))*vg.Inch, format)
}

func nonZero(v, or float64) float64 {
	if v > 0 {
		return v
	}
	return or
}

// logBars is one series of bars on a log axis. gonum's BarChart draws from
// zero, which a log scale cannot place; these start at the axis minimum.
type logBars struct {
	name              string
	values, low, high []float64 // per layer; 0 draws nothing
	color             color.Color
	width, offset     vg.Length
}

func (b *logBars) Plot(c draw.Canvas, plt *plot.Plot) {
	trX, trYRaw := plt.Transforms(&c)
	trY := func(v float64) vg.Length { return trYRaw(min(max(v, plt.Y.Min), plt.Y.Max)) }
	whisker := draw.LineStyle{Color: color.Black, Width: vg.Points(0.75)}
	label := draw.TextStyle{Color: color.Black, Font: plot.DefaultFont, Handler: plot.DefaultTextHandler, XAlign: draw.XCenter}
	label.Font.Size = vg.Points(7)
	for i, v := range b.values {
		if v <= 0 {
			continue
		}
		x := trX(float64(i)) + b.offset
		bottom, top := trY(plt.Y.Min), trY(v)
		c.FillPolygon(b.color, c.ClipPolygonY([]vg.Point{
			{X: x - b.width/2, Y: bottom}, {X: x + b.width/2, Y: bottom},
			{X: x + b.width/2, Y: top}, {X: x - b.width/2, Y: top},
		}))
		if b.high[i] > 0 {
			c.StrokeLine2(whisker, x, trY(b.low[i]), x, trY(b.high[i]))
		}
		c.FillText(label, vg.Point{X: x, Y: max(top, trY(b.high[i])) + vg.Points(2)}, strconv.FormatFloat(v, 'g', 3, 64))
	}
}

// DataRange covers the layers on x; y is set by Chart.
func (b *logBars) DataRange() (xmin, xmax, ymin, ymax float64) {
	return -0.5, float64(len(b.values)) - 0.5, math.NaN(), math.NaN()
}

// Thumbnail draws the legend's swatch.
func (b *logBars) Thumbnail(c *draw.Canvas) {
	c.FillPolygon(b.color, []vg.Point{
		{X: c.Min.X, Y: c.Min.Y}, {X: c.Max.X, Y: c.Min.Y}, {X: c.Max.X, Y: c.Max.Y}, {X: c.Min.X, Y: c.Max.Y},
	})
}

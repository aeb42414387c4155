package lab

import (
	"bytes"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
)

// Series colours of the two families.
var (
	ColorV4 = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	ColorV6 = color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
)

// Render draws p, 5 inches high, as png or svg.
func Render(p *plot.Plot, width vg.Length, format string) ([]byte, error) {
	wt, err := p.WriterTo(width, 5*vg.Inch, format)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if _, err := wt.WriteTo(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

package bench

import (
	"errors"
	"image/color"
	"os"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// drawChart draws jobs/s against buyers of the hot-key rows that kept the
// invariant, one line per contender and placement (embedded dashed), on log
// scales, with the legend beside the plot, into a PNG file.
func drawChart(file string, rows []*row) error {
	type series struct {
		name     string
		color    int
		embedded bool
		xys      plotter.XYs
	}
	var all []*series
	index := map[string]*series{}
	colors := map[string]int{}
	var ticks plot.ConstantTicks
	seen := map[int]bool{}
	for _, r := range rows {
		if r.w.Name != "hot" || r.w.Durable || !r.ok || r.med.Rate() < 1 {
			continue
		}
		name := r.s.c.Name()
		if _, ok := colors[name]; !ok {
			colors[name] = len(colors)
		}
		label := name
		if r.placement != "" {
			label += " (" + r.where() + ")"
		}
		s := index[label]
		if s == nil {
			s = &series{name: label, color: colors[name], embedded: r.placement == Embedded}
			index[label] = s
			all = append(all, s)
		}
		s.xys = append(s.xys, plotter.XY{X: float64(r.w.Buyers), Y: r.med.Rate()})
		if !seen[r.w.Buyers] {
			seen[r.w.Buyers] = true
			ticks = append(ticks, plot.Tick{Value: float64(r.w.Buyers), Label: strconv.Itoa(r.w.Buyers)})
		}
	}
	if len(all) == 0 {
		return errors.New("bench: no hot-key row kept the invariant: nothing to chart")
	}
	p := plot.New()
	p.Title.Text = "Hot key: purchases per second against buyers (median of runs)"
	p.X.Label.Text = "buyers"
	p.Y.Label.Text = "jobs/s"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker = ticks
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Add(plotter.NewGrid())
	legend := plot.NewLegend()
	legend.Top, legend.Left = true, true
	for _, s := range all {
		line, points, err := plotter.NewLinePoints(s.xys)
		if err != nil {
			return err
		}
		c := palette[s.color%len(palette)]
		line.Color, points.Color = c, c
		points.Shape = plotutil.Shape(s.color)
		line.Width = vg.Points(1.5)
		if s.embedded {
			line.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		}
		p.Add(line, points)
		legend.Add(s.name, line, points)
	}
	const width, legendWidth = 11 * vg.Inch, 3.4 * vg.Inch
	img := vgimg.New(width, 6*vg.Inch)
	dc := draw.New(img)
	p.Draw(draw.Crop(dc, 0, -legendWidth, 0, 0))
	legend.Draw(draw.Crop(dc, width-legendWidth+vg.Points(8), 0, 0, -vg.Points(30)))
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// palette is Tableau 10: one distinct color for each contender.
var palette = []color.Color{
	color.RGBA{0x4e, 0x79, 0xa7, 0xff}, color.RGBA{0xf2, 0x8e, 0x2b, 0xff},
	color.RGBA{0xe1, 0x57, 0x59, 0xff}, color.RGBA{0x76, 0xb7, 0xb2, 0xff},
	color.RGBA{0x59, 0xa1, 0x4f, 0xff}, color.RGBA{0xed, 0xc9, 0x48, 0xff},
	color.RGBA{0xb0, 0x7a, 0xa1, 0xff}, color.RGBA{0xff, 0x9d, 0xa7, 0xff},
	color.RGBA{0x9c, 0x75, 0x5f, 0xff}, color.RGBA{0xba, 0xb0, 0xac, 0xff},
}

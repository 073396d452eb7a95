package main

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"os"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/qpdrain/qpdrain/ipoibcm/churn"
)

// churnSeries is one plotted line.
type churnSeries struct {
	name  string
	color color.RGBA
	value func(churn.Sample) int
}

// The top panel: the QPs on each list and in all; the bottom one: the
// connections accepted and rejected so far, whose scale is another.
var (
	churnListSeries = []churnSeries{
		{"passive_ids", color.RGBA{0x1f, 0x77, 0xb4, 0xff}, func(s churn.Sample) int { return s.Passive }},
		{"rx_error_list", color.RGBA{0xff, 0x7f, 0x0e, 0xff}, func(s churn.Sample) int { return s.Error }},
		{"rx_flush_list", color.RGBA{0xd6, 0x27, 0x28, 0xff}, func(s churn.Sample) int { return s.Flush }},
		{"rx_drain_list", color.RGBA{0x94, 0x67, 0xbd, 0xff}, func(s churn.Sample) int { return s.Drain }},
		{"quarantine", color.RGBA{0x8c, 0x56, 0x4b, 0xff}, func(s churn.Sample) int { return s.Quarantine }},
		{"QPs held", color.RGBA{0, 0, 0, 0xff}, func(s churn.Sample) int { return s.QPs }},
	}
	churnConnSeries = []churnSeries{
		{"accepted", color.RGBA{0x2c, 0xa0, 0x2c, 0xff}, func(s churn.Sample) int { return s.Accepted }},
		{"rejected", color.RGBA{0xd6, 0x27, 0x28, 0xff}, func(s churn.Sample) int { return s.Rejected }},
	}
)

func churnPanel(res *churn.Result, series []churnSeries, title, ylabel string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "time (hours)"
	if res.RealTime {
		p.X.Label.Text = "time (hours, real)"
	}
	p.Y.Label.Text = ylabel
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	// Headroom above the highest line for the legend.
	top := 0
	for _, s := range series {
		for _, smp := range res.Samples {
			top = max(top, s.value(smp))
		}
	}
	p.Y.Min, p.Y.Max = 0, float64(top)*1.45+1
	for _, s := range series {
		xy := make(plotter.XYs, len(res.Samples))
		for i, smp := range res.Samples {
			xy[i].X, xy[i].Y = smp.At.Hours(), float64(s.value(smp))
		}
		line, err := plotter.NewLine(xy)
		if err != nil {
			return nil, fmt.Errorf("plotting %s: %w", s.name, err)
		}
		line.Color = s.color
		line.Width = vg.Points(1.5)
		p.Add(line)
		p.Legend.Add(s.name, line)
	}
	return p, nil
}

// writeChurnPlot draws the run to file, a PNG or SVG by its extension:
// the QPs on each list over time above, the connections accepted and
// rejected below.
func writeChurnPlot(file string, res *churn.Result, quirks []string) (err error) {
	q := "no quirk"
	if len(quirks) > 0 {
		q = strings.Join(quirks, ", ")
	}
	srq := "SRQ"
	if !res.SRQ {
		srq = "no SRQ"
	}
	top, err := churnPanel(res, churnListSeries,
		fmt.Sprintf("IPoIB-CM receive QPs per list: policy %s, %s, %s, seed %d", res.Policy, srq, q, res.Seed), "QPs")
	if err != nil {
		return err
	}
	bottom, err := churnPanel(res, churnConnSeries, "connections so far", "connections")
	if err != nil {
		return err
	}
	const w, h = 10 * vg.Inch, 7 * vg.Inch
	var canvas interface {
		vg.CanvasSizer
		io.WriterTo
	}
	if strings.HasSuffix(file, ".svg") {
		canvas = vgsvg.New(w, h)
	} else {
		canvas = vgimg.PngCanvas{Canvas: vgimg.New(w, h)}
	}
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadX: vg.Millimeter * 3, PadY: vg.Millimeter * 5, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
	plots := [][]*plot.Plot{{top}, {bottom}}
	cs := plot.Align(plots, tiles, draw.New(canvas))
	top.Draw(cs[0][0])
	bottom.Draw(cs[1][0])
	f, err := os.Create(file)
	if err != nil {
		return fmt.Errorf("writing the plot: %w", err)
	}
	defer func() { err = errors.Join(err, f.Close()) }()
	if _, err := canvas.WriteTo(f); err != nil {
		return fmt.Errorf("writing the plot to %s: %w", file, err)
	}
	return nil
}

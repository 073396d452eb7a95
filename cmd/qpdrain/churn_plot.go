package main

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"slices"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/qpdrain/qpdrain/ipoibcm/churn"
)

// churnSeries is one plotted line. Each has its own colour, dashes and
// marker, so that series on the same values (several lists at 0) stay
// visible: the markers of each sit on different samples.
type churnSeries struct {
	name   string
	color  color.RGBA
	dashes []vg.Length
	glyph  draw.GlyphDrawer
	value  func(churn.Sample) int
}

// The top panel: the QPs on each list and in all; the bottom one: the
// connections accepted and rejected so far, whose scale is another.
var (
	churnListSeries = []churnSeries{
		{"QPs held", color.RGBA{0, 0, 0, 0xff}, nil, draw.CircleGlyph{}, func(s churn.Sample) int { return s.QPs }},
		{"passive_ids", color.RGBA{0x1f, 0x77, 0xb4, 0xff}, []vg.Length{vg.Points(6), vg.Points(2)}, draw.BoxGlyph{}, func(s churn.Sample) int { return s.Passive }},
		{"rx_error_list", color.RGBA{0xff, 0x7f, 0x0e, 0xff}, []vg.Length{vg.Points(2), vg.Points(2)}, draw.TriangleGlyph{}, func(s churn.Sample) int { return s.Error }},
		{"rx_flush_list", color.RGBA{0xd6, 0x27, 0x28, 0xff}, []vg.Length{vg.Points(8), vg.Points(3), vg.Points(2), vg.Points(3)}, draw.CrossGlyph{}, func(s churn.Sample) int { return s.Flush }},
		{"rx_drain_list", color.RGBA{0x94, 0x67, 0xbd, 0xff}, []vg.Length{vg.Points(4), vg.Points(4)}, draw.PlusGlyph{}, func(s churn.Sample) int { return s.Drain }},
		{"quarantine", color.RGBA{0x8c, 0x56, 0x4b, 0xff}, []vg.Length{vg.Points(1), vg.Points(3)}, draw.RingGlyph{}, func(s churn.Sample) int { return s.Quarantine }},
	}
	churnConnSeries = []churnSeries{
		{"accepted", color.RGBA{0x2c, 0xa0, 0x2c, 0xff}, nil, draw.CircleGlyph{}, func(s churn.Sample) int { return s.Accepted }},
		{"rejected", color.RGBA{0xd6, 0x27, 0x28, 0xff}, []vg.Length{vg.Points(4), vg.Points(3)}, draw.CrossGlyph{}, func(s churn.Sample) int { return s.Rejected }},
	}
	limitColor = color.RGBA{0xd6, 0x27, 0x28, 0xff}
)

// churnMarkers is how many markers each series draws over the run.
const churnMarkers = 12

// niceCeil rounds n up to 1, 2 or 5 times a power of ten, past a few
// percent of headroom, for an axis end that two runs of the same flags
// share.
func niceCeil(n float64) float64 {
	if n <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(n)))
	for _, m := range []float64{1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10} {
		if m*p >= n {
			return m * p
		}
	}
	return 10 * p
}

// intTicks labels an axis of counts or whole time units with integers,
// from 0 in steps of 1, 2 or 5 times a power of ten, at most about 8.
type intTicks struct{}

func (intTicks) Ticks(lo, hi float64) []plot.Tick {
	step := 1.0
search:
	for p := 1.0; p < 1e12; p *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if (hi-lo)/(m*p) <= 8 {
				step = m * p
				break search
			}
		}
	}
	var ticks []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi+1e-9; v += step {
		ticks = append(ticks, plot.Tick{Value: v, Label: fmt.Sprintf("%d", int64(math.Round(v)))})
		// Unlabelled minor ticks halfway.
		if m := v + step/2; m < hi && step >= 2 {
			ticks = append(ticks, plot.Tick{Value: m})
		}
	}
	return ticks
}

// churnTimeUnit is the x axis's unit: minutes, or hours once the run is
// longer than three.
func churnTimeUnit(end time.Duration) (time.Duration, string) {
	if end > 3*time.Hour {
		return time.Hour, "hours"
	}
	return time.Minute, "minutes"
}

// churnSegments splits the samples where the lines must not join them:
// at the churn's end (its last event; the peers still connected then all
// leave at once, then the lists settle on their timers), and where
// samples are far apart (more than 3 times the median spacing of their
// phase), so that no line claims a gradual change nobody sampled.
func churnSegments(samples []churn.Sample, total int) [][]churn.Sample {
	var segs [][]churn.Sample
	end := slices.IndexFunc(samples, func(s churn.Sample) bool { return s.Events >= total })
	if end < 0 || end == len(samples)-1 {
		return splitSparse(samples)
	}
	segs = append(segs, splitSparse(samples[:end+1])...)
	return append(segs, splitSparse(samples[end+1:])...)
}

func splitSparse(samples []churn.Sample) [][]churn.Sample {
	if len(samples) < 3 {
		return [][]churn.Sample{samples}
	}
	gaps := make([]time.Duration, 0, len(samples)-1)
	for i := 1; i < len(samples); i++ {
		gaps = append(gaps, samples[i].At-samples[i-1].At)
	}
	sorted := slices.Clone(gaps)
	slices.Sort(sorted)
	limit := 3 * sorted[len(sorted)/2]
	var segs [][]churn.Sample
	start := 0
	for i, g := range gaps {
		if g > limit {
			segs = append(segs, samples[start:i+1])
			start = i + 1
		}
	}
	return append(segs, samples[start:])
}

// churnAxes are the axes of the plot, chosen from the flags more than from
// the run, so that two runs of the same flags under two policies are drawn
// on the same axes: time up to --plot-until, QPs up to past max_qp,
// connections up to the events.
type churnAxes struct {
	unit     time.Duration
	unitName string
	xMax     float64
	qpMax    float64 // top panel
	connMax  float64 // bottom panel
	limit    int     // max_qp drawn, 0 when it is far above the data
}

func newChurnAxes(run *churnRun, until time.Duration) churnAxes {
	res := run.Result
	var end time.Duration
	top, conns := 0, 0 // conns: a run cut short may have fewer events
	for _, s := range res.Samples {
		end = max(end, s.At)
		for _, ser := range churnListSeries {
			top = max(top, ser.value(s))
		}
		conns = max(conns, s.Accepted+s.Rejected)
	}
	a := churnAxes{}
	if until > 0 {
		end = until
	}
	a.unit, a.unitName = churnTimeUnit(end)
	a.xMax = float64(end) / float64(a.unit)
	if until == 0 {
		a.xMax = niceCeil(a.xMax)
	}
	a.qpMax = niceCeil(float64(top) * 1.05)
	if run.MaxQP > 0 && float64(run.MaxQP) <= 4*float64(max(top, 1)) {
		a.limit = run.MaxQP
		a.qpMax = niceCeil(float64(run.MaxQP) * 1.1)
	}
	// Every connection is one of the events.
	a.connMax = niceCeil(float64(max(conns, res.Events.Total())))
	return a
}

// churnPanel draws series over time into a plot, and their legend entries
// into leg.
// A limit above 0 is drawn first, under the data.
func churnPanel(res *churn.Result, a churnAxes, series []churnSeries, limit int, title, ylabel string, yMax float64, leg *plot.Legend) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "time since the start (" + a.unitName + ")"
	if res.RealTime {
		p.X.Label.Text = "time since the start (" + a.unitName + ", real clock)"
	}
	p.Y.Label.Text = ylabel
	p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = 0, a.xMax, 0, yMax
	p.X.Tick.Marker, p.Y.Tick.Marker = intTicks{}, intTicks{}
	p.Add(plotter.NewGrid())
	if limit > 0 {
		if err := addLimit(p, a, leg); err != nil {
			return nil, err
		}
	}
	segs := churnSegments(res.Samples, res.Events.Total())
	every := max(1, len(res.Samples)/churnMarkers)
	for k, s := range series {
		style := draw.LineStyle{Color: s.color, Width: vg.Points(1.6), Dashes: s.dashes}
		var thumb []plot.Thumbnailer
		for _, seg := range segs {
			xy := make(plotter.XYs, len(seg))
			for i, smp := range seg {
				xy[i].X, xy[i].Y = float64(smp.At)/float64(a.unit), float64(s.value(smp))
			}
			line, err := plotter.NewLine(xy)
			if err != nil {
				return nil, fmt.Errorf("plotting %s: %w", s.name, err)
			}
			line.LineStyle = style
			p.Add(line)
			thumb = []plot.Thumbnailer{line}
		}
		// Markers on every few samples, each series offset from the
		// others, so that series on the same values all show.
		var pts plotter.XYs
		for i, smp := range res.Samples {
			if (i+k*every/len(series))%every == 0 {
				pts = append(pts, plotter.XY{X: float64(smp.At) / float64(a.unit), Y: float64(s.value(smp))})
			}
		}
		if len(pts) > 0 {
			sc, err := plotter.NewScatter(pts)
			if err != nil {
				return nil, fmt.Errorf("plotting %s: %w", s.name, err)
			}
			sc.GlyphStyle = draw.GlyphStyle{Color: s.color, Radius: vg.Points(3), Shape: s.glyph}
			p.Add(sc)
			thumb = append(thumb, sc)
		}
		leg.Add(s.name, thumb...)
	}
	return p, nil
}

// addLimit draws max_qp across the top panel, labelled.
func addLimit(p *plot.Plot, a churnAxes, leg *plot.Legend) error {
	line, err := plotter.NewLine(plotter.XYs{{X: 0, Y: float64(a.limit)}, {X: a.xMax, Y: float64(a.limit)}})
	if err != nil {
		return err
	}
	line.LineStyle = draw.LineStyle{Color: limitColor, Width: vg.Points(4), Dashes: []vg.Length{vg.Points(10), vg.Points(4)}}
	p.Add(line)
	// Right of the middle: the QPs rise through the left part.
	lab, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: a.xMax * 0.62, Y: float64(a.limit)}},
		Labels: []string{fmt.Sprintf("max_qp %d: no QP, no connection past it", a.limit)}})
	if err != nil {
		return err
	}
	lab.TextStyle[0].Color = limitColor
	lab.Offset = vg.Point{Y: vg.Points(3)}
	p.Add(lab)
	leg.Add(fmt.Sprintf("max_qp %d", a.limit), line)
	return nil
}

// churnEnd marks where the churn's events end: the peers still connected
// then leave at once, and the lists settle.
func churnEnd(res *churn.Result, a churnAxes, p *plot.Plot, yMax float64) error {
	total := res.Events.Total()
	i := slices.IndexFunc(res.Samples, func(s churn.Sample) bool { return s.Events >= total })
	if i < 0 {
		return nil
	}
	x := float64(res.Samples[i].At) / float64(a.unit)
	line, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: yMax}})
	if err != nil {
		return err
	}
	line.LineStyle = draw.LineStyle{Color: color.Gray{0x80}, Width: vg.Points(1), Dashes: []vg.Length{vg.Points(2), vg.Points(2)}}
	p.Add(line)
	lab, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: x, Y: yMax * 0.97}}, Labels: []string{"last event "}})
	if err != nil {
		return err
	}
	lab.TextStyle[0].XAlign = draw.XRight
	lab.TextStyle[0].Color = color.Gray{0x50}
	p.Add(lab)
	return nil
}

// writeChurnPlot draws the run to w, an SVG when file ends in .svg (any
// case), else a PNG: the QPs on each list over time, with the device's
// max_qp, above; the connections accepted and rejected below; the legends
// to the right of the data.
func writeChurnPlot(w io.Writer, file string, run *churnRun, until time.Duration) error {
	res := run.Result
	srq := "SRQ"
	if !res.SRQ {
		srq = "no SRQ"
	}
	a := newChurnAxes(run, until)
	limit := ""
	if a.limit == 0 && run.MaxQP > 0 {
		limit = fmt.Sprintf("; max_qp %d, far above the scale", run.MaxQP)
	}
	topLeg, bottomLeg := plot.NewLegend(), plot.NewLegend()
	top, err := churnPanel(res, a, churnListSeries, a.limit,
		fmt.Sprintf("IPoIB-CM receive QPs per list: policy %s, %s, quirks: %s, seed %d\nat the end: %s leaked, %d behind a hung drain%s",
			res.Policy, srq, quirkList(run.Quirks), res.Seed, plural(res.Leaked, "QP"), res.HungDrains, limit),
		"QPs", a.qpMax, &topLeg)
	if err != nil {
		return err
	}
	bottom, err := churnPanel(res, a, churnConnSeries, 0,
		fmt.Sprintf("connections so far: %d accepted, %d rejected", res.Accepted, res.RejectedNoQP+res.RejectedOther), "connections", a.connMax, &bottomLeg)
	if err != nil {
		return err
	}
	for _, pc := range []struct {
		p *plot.Plot
		y float64
	}{{top, a.qpMax}, {bottom, a.connMax}} {
		if err := churnEnd(res, a, pc.p, pc.y); err != nil {
			return err
		}
	}
	const wd, ht, legendW = 11 * vg.Inch, 7.5 * vg.Inch, 1.7 * vg.Inch
	var canvas interface {
		vg.CanvasSizer
		io.WriterTo
	}
	if fileKind(file, ".svg") != "" {
		canvas = vgsvg.New(wd, ht)
	} else {
		canvas = vgimg.PngCanvas{Canvas: vgimg.New(wd, ht)}
	}
	dc := draw.New(canvas)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadX: vg.Millimeter * 3, PadY: vg.Millimeter * 6, PadTop: vg.Millimeter * 2,
		PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	cs := plot.Align([][]*plot.Plot{{top}, {bottom}}, tiles, draw.Crop(dc, 0, -legendW, 0, 0))
	top.Draw(cs[0][0])
	bottom.Draw(cs[1][0])
	for i, leg := range []*plot.Legend{&topLeg, &bottomLeg} {
		leg.Top, leg.Left = true, true
		leg.ThumbnailWidth = vg.Points(30)
		lc := draw.Crop(dc, wd-legendW, 0, 0, 0)
		lc.Min.Y, lc.Max.Y = cs[i][0].Min.Y, cs[i][0].Max.Y-vg.Millimeter*12 // below the title
		leg.Draw(lc)
	}
	if _, err := canvas.WriteTo(w); err != nil {
		return err
	}
	return nil
}

// Package churnplot draws a run of the IPoIB-CM churn simulator (package
// churn): the QPs on each of ipoib_cm.c's lists over time against the
// device's max_qp, above; the connections accepted and rejected so far,
// below. Two runs of the same flags under two policies are drawn on the same
// axes, so that their plots compare side by side.
//
// What the plot claims is what was sampled: between two samples a line
// holds the earlier value and steps at the later one (the simulator samples
// every few events, then ten times while the lists settle), and it breaks
// at the churn's last event, where the peers still connected leave at once
// and nothing is sampled until the lists settle: a note at the marker says
// so.
package churnplot

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

// Options are what a plot shows besides the run.
type Options struct {
	// MaxQP is the device's max_qp, drawn across the QP panel when the data
	// come near it; 0 for unknown.
	MaxQP int
	// Quirks names the soft device's provider quirks for the title
	// ("none" when empty).
	Quirks string
	// Until ends the time axis (0: at the run's end, rounded up), so that
	// two runs share it.
	Until time.Duration
	// SVG draws an SVG; else a PNG.
	SVG bool
}

// series is one plotted line. Each has its own colour, dashes and
// marker, so that series on the same values (several lists at 0) stay
// visible: the markers of each sit on different samples.
type series struct {
	name   string
	color  color.RGBA
	dashes []vg.Length
	glyph  draw.GlyphDrawer
	value  func(churn.Sample) int
}

// The top panel: the QPs on each list and in all; the bottom one: the
// connections accepted and rejected so far, whose scale is another.
var (
	listSeries = []series{
		{"QPs held", color.RGBA{0, 0, 0, 0xff}, nil, draw.CircleGlyph{}, func(s churn.Sample) int { return s.QPs }},
		{"passive_ids", color.RGBA{0x1f, 0x77, 0xb4, 0xff}, []vg.Length{vg.Points(6), vg.Points(2)}, draw.BoxGlyph{}, func(s churn.Sample) int { return s.Passive }},
		{"rx_error_list", color.RGBA{0xff, 0x7f, 0x0e, 0xff}, []vg.Length{vg.Points(2), vg.Points(2)}, draw.TriangleGlyph{}, func(s churn.Sample) int { return s.Error }},
		{"rx_flush_list", color.RGBA{0xd6, 0x27, 0x28, 0xff}, []vg.Length{vg.Points(8), vg.Points(3), vg.Points(2), vg.Points(3)}, draw.CrossGlyph{}, func(s churn.Sample) int { return s.Flush }},
		{"rx_drain_list", color.RGBA{0x94, 0x67, 0xbd, 0xff}, []vg.Length{vg.Points(4), vg.Points(4)}, draw.PlusGlyph{}, func(s churn.Sample) int { return s.Drain }},
		{"quarantine", color.RGBA{0x8c, 0x56, 0x4b, 0xff}, []vg.Length{vg.Points(1), vg.Points(3)}, draw.RingGlyph{}, func(s churn.Sample) int { return s.Quarantine }},
	}
	connSeries = []series{
		{"accepted", color.RGBA{0x2c, 0xa0, 0x2c, 0xff}, nil, draw.CircleGlyph{}, func(s churn.Sample) int { return s.Accepted }},
		{"rejected", color.RGBA{0xd6, 0x27, 0x28, 0xff}, []vg.Length{vg.Points(4), vg.Points(3)}, draw.CrossGlyph{}, func(s churn.Sample) int { return s.Rejected }},
	}
	limitColor = color.RGBA{0xd6, 0x27, 0x28, 0xff}
)

// markers is how many markers each series draws over the run.
const markers = 12

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

// timeUnit is the x axis's unit: minutes, or hours once the run is
// longer than three.
func timeUnit(end time.Duration) (time.Duration, string) {
	if end > 3*time.Hour {
		return time.Hour, "hours"
	}
	return time.Minute, "minutes"
}

// lastEvent is the index of the sample at the churn's last event, or -1
// when the run was cut short before it.
func lastEvent(res *churn.Result) int {
	total := res.Events.Total()
	return slices.IndexFunc(res.Samples, func(s churn.Sample) bool { return s.Events >= total })
}

// segments splits the samples at the churn's last event: the peers still
// connected then leave at once, and no sample shows the lists until they
// settle, so no line may join the two.
func segments(res *churn.Result) [][]churn.Sample {
	end := lastEvent(res)
	if end < 0 || end == len(res.Samples)-1 {
		return [][]churn.Sample{res.Samples}
	}
	return [][]churn.Sample{res.Samples[:end+1], res.Samples[end+1:]}
}

// axes are the axes of the plot, chosen from the flags more than from the
// run, so that two runs of the same flags under two policies are drawn on
// the same axes: time up to Options.Until, QPs up to past max_qp,
// connections up to the events.
type axes struct {
	unit     time.Duration
	unitName string
	xMax     float64
	qpMax    float64 // top panel
	connMax  float64 // bottom panel
	limit    int     // max_qp drawn, 0 when it is far above the data
}

func newAxes(res *churn.Result, o Options) axes {
	var end time.Duration
	top, conns := 0, 0 // conns: a run cut short may have fewer events
	for _, s := range res.Samples {
		end = max(end, s.At)
		for _, ser := range listSeries {
			top = max(top, ser.value(s))
		}
		conns = max(conns, s.Accepted+s.Rejected)
	}
	a := axes{}
	if o.Until > 0 {
		end = o.Until
	}
	a.unit, a.unitName = timeUnit(end)
	a.xMax = float64(end) / float64(a.unit)
	if o.Until == 0 {
		a.xMax = niceCeil(a.xMax)
	}
	a.qpMax = niceCeil(float64(top) * 1.05)
	if o.MaxQP > 0 && float64(o.MaxQP) <= 4*float64(max(top, 1)) {
		a.limit = o.MaxQP
		// Room above the limit for its label, clear of the data, which
		// never pass it.
		a.qpMax = niceCeil(float64(o.MaxQP) * 1.15)
	}
	// Every connection is one of the events.
	a.connMax = niceCeil(float64(max(conns, res.Events.Total())))
	return a
}

// panel draws series over time into a plot, and their legend entries into
// leg in the order of series.
func panel(res *churn.Result, a axes, ser []series, limit int, title, ylabel string, yMax float64, leg *plot.Legend) (*plot.Plot, error) {
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
	l, err := layers(res, a, ser, limit, leg)
	if err != nil {
		return nil, err
	}
	p.Add(l...)
	return p, nil
}

// layers are a panel's lines and markers in drawing order: a limit above
// 0 first, thin, then the series last to first, so that the first (the
// QPs held) lies on top of the limit and of every list it equals.
func layers(res *churn.Result, a axes, ser []series, limit int, leg *plot.Legend) ([]plot.Plotter, error) {
	var out []plot.Plotter
	if limit > 0 {
		l, err := limitLayers(a)
		if err != nil {
			return nil, err
		}
		out = append(out, l...)
		leg.Add(fmt.Sprintf("max_qp %d", limit), l[0].(plot.Thumbnailer))
	}
	segs := segments(res)
	every := max(1, len(res.Samples)/markers)
	thumbs := make([][]plot.Thumbnailer, len(ser))
	for k := len(ser) - 1; k >= 0; k-- {
		s := ser[k]
		style := draw.LineStyle{Color: s.color, Width: vg.Points(1.6), Dashes: s.dashes}
		if k == 0 {
			style.Width = vg.Points(2.4)
		}
		for _, seg := range segs {
			xy := make(plotter.XYs, len(seg))
			for i, smp := range seg {
				xy[i].X, xy[i].Y = float64(smp.At)/float64(a.unit), float64(s.value(smp))
			}
			line, err := plotter.NewLine(xy)
			if err != nil {
				return nil, fmt.Errorf("plotting %s: %w", s.name, err)
			}
			// A sample holds until the next one: a step, not a slope
			// that would claim a gradual change nobody sampled.
			line.LineStyle, line.StepStyle = style, plotter.PostStep
			out = append(out, line)
			thumbs[k] = []plot.Thumbnailer{line}
		}
		// Markers on every few samples, each series offset from the
		// others, so that series on the same values all show.
		var pts plotter.XYs
		for i, smp := range res.Samples {
			if (i+k*every/len(ser))%every == 0 {
				pts = append(pts, plotter.XY{X: float64(smp.At) / float64(a.unit), Y: float64(s.value(smp))})
			}
		}
		if len(pts) > 0 {
			sc, err := plotter.NewScatter(pts)
			if err != nil {
				return nil, fmt.Errorf("plotting %s: %w", s.name, err)
			}
			sc.GlyphStyle = draw.GlyphStyle{Color: s.color, Radius: vg.Points(3), Shape: s.glyph}
			out = append(out, sc)
			thumbs[k] = append(thumbs[k], sc)
		}
	}
	for k, s := range ser {
		leg.Add(s.name, thumbs[k]...)
	}
	return out, nil
}

// limitLayers are max_qp's line across the top panel, thin and dashed,
// and its label above the line at the right end: nothing passes the
// limit, so the band above it is free of data.
func limitLayers(a axes) ([]plot.Plotter, error) {
	line, err := plotter.NewLine(plotter.XYs{{X: 0, Y: float64(a.limit)}, {X: a.xMax, Y: float64(a.limit)}})
	if err != nil {
		return nil, err
	}
	line.LineStyle = draw.LineStyle{Color: limitColor, Width: vg.Points(1.2), Dashes: []vg.Length{vg.Points(6), vg.Points(3)}}
	lab, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: a.xMax, Y: float64(a.limit)}},
		Labels: []string{fmt.Sprintf("max_qp %d: no QP, no connection past it", a.limit)}})
	if err != nil {
		return nil, err
	}
	lab.TextStyle[0].Color = limitColor
	lab.TextStyle[0].XAlign = draw.XRight
	// Past the markers (radius 3) and the held line on the limit.
	lab.Offset = vg.Point{X: -vg.Points(4), Y: vg.Points(8)}
	return []plot.Plotter{line, lab}, nil
}

// markEnd marks the churn's last event with a line and a note, on the side
// of the line with more room.
func markEnd(res *churn.Result, a axes, p *plot.Plot, yMax float64, note string) error {
	i := lastEvent(res)
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
	lab, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: x, Y: yMax}}, Labels: []string{note}})
	if err != nil {
		return err
	}
	ts := &lab.TextStyle[0]
	ts.Color, ts.YAlign = color.Gray{0x40}, draw.YTop
	lab.Offset = vg.Point{X: vg.Points(4), Y: -vg.Points(3)}
	if x > a.xMax/2 {
		ts.XAlign = draw.XRight
		lab.Offset.X = -lab.Offset.X
	}
	p.Add(lab)
	return nil
}

// Write draws the run to w: the QPs on each list over time, with the
// device's max_qp, above; the connections accepted and rejected below; the
// legends to the right of the data.
func Write(w io.Writer, res *churn.Result, o Options) error {
	srq := "SRQ"
	if !res.SRQ {
		srq = "no SRQ"
	}
	quirks := o.Quirks
	if quirks == "" {
		quirks = "none"
	}
	a := newAxes(res, o)
	limit := ""
	if a.limit == 0 && o.MaxQP > 0 {
		limit = fmt.Sprintf("; max_qp %d, far above the scale", o.MaxQP)
	}
	topLeg, bottomLeg := plot.NewLegend(), plot.NewLegend()
	top, err := panel(res, a, listSeries, a.limit,
		fmt.Sprintf("IPoIB-CM receive QPs per list: policy %s, %s, quirks: %s, seed %d\nat the end: %d QPs leaked, %d behind a hung drain%s",
			res.Policy, srq, quirks, res.Seed, res.Leaked, res.HungDrains, limit),
		"QPs", a.qpMax, &topLeg)
	if err != nil {
		return err
	}
	bottom, err := panel(res, a, connSeries, 0,
		fmt.Sprintf("connections so far: %d accepted, %d rejected", res.Accepted, res.RejectedNoQP+res.RejectedOther), "connections", a.connMax, &bottomLeg)
	if err != nil {
		return err
	}
	if err := markEnd(res, a, top, a.qpMax, "last event"); err != nil {
		return err
	}
	if err := markEnd(res, a, bottom, a.connMax, "last event: the peers still connected leave at once;\n"+
		"no sample until the lists settle, so the lines break here"); err != nil {
		return err
	}
	const wd, ht, legendW = 11 * vg.Inch, 7.5 * vg.Inch, 1.7 * vg.Inch
	var canvas interface {
		vg.CanvasSizer
		io.WriterTo
	}
	if o.SVG {
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
	_, err = canvas.WriteTo(w)
	return err
}

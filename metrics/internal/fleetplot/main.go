// Command fleetplot draws the fleet end-to-end run (scripts/rxe/fleet.sh,
// make demo-fleet) from the @@FLEET lines TestFleetPrometheusRxe prints,
// read on stdin without their prefix: the series Prometheus stored (the
// stuck-in-error QPs of the leak finding, the QPs in ERR, the exporter's
// up) over the run, with a line at each alert's change of state and at
// the reap and the exporter's stop. It writes a PNG to -o.
//
// Input lines: "start=MS reap=MS exporter_stopped=MS end=MS", "event MS
// ALERT STATE" (STATE empty when resolved), "series QUERY MS VALUE"; MS
// are Unix milliseconds.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"os"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

func main() {
	out := flag.String("o", "", "the PNG to write")
	flag.Parse()
	if *out == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "fleetplot: usage: fleetplot -o FILE.png < series")
		os.Exit(2)
	}
	if err := run(os.Stdin, *out); err != nil {
		fmt.Fprintln(os.Stderr, "fleetplot:", err)
		os.Exit(1)
	}
}

// fleetRun is the run the input describes, in seconds.
type fleetRun struct {
	start, reap, stopped, end float64 // Unix seconds
	events                    []event
	series                    map[string]plotter.XYs
	order                     []string
}

type event struct {
	at           float64 // Unix seconds
	alert, state string
}

func parse(r io.Reader) (*fleetRun, error) {
	rn := &fleetRun{series: map[string]plotter.XYs{}}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 4 && strings.HasPrefix(f[0], "start="):
			for i, dst := range []*float64{&rn.start, &rn.reap, &rn.stopped, &rn.end} {
				_, v, _ := strings.Cut(f[i], "=")
				ms, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return nil, fmt.Errorf("%q: %w", sc.Text(), err)
				}
				*dst = ms / 1000
			}
		case len(f) >= 3 && f[0] == "event":
			ms, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return nil, fmt.Errorf("%q: %w", sc.Text(), err)
			}
			e := event{at: ms / 1000, alert: f[2]}
			if len(f) > 3 {
				e.state = f[3]
			}
			rn.events = append(rn.events, e)
		case len(f) == 4 && f[0] == "series":
			ms, err1 := strconv.ParseFloat(f[2], 64)
			v, err2 := strconv.ParseFloat(f[3], 64)
			if err := errors.Join(err1, err2); err != nil {
				return nil, fmt.Errorf("%q: %w", sc.Text(), err)
			}
			if _, ok := rn.series[f[1]]; !ok {
				rn.order = append(rn.order, f[1])
			}
			rn.series[f[1]] = append(rn.series[f[1]], plotter.XY{X: ms / 1000, Y: v})
		default:
			return nil, fmt.Errorf("line %q: not a @@FLEET line", sc.Text())
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if rn.end <= rn.start || len(rn.order) == 0 {
		return nil, errors.New("no run in the input (no start=... line or no series)")
	}
	return rn, nil
}

var dashes = [][]vg.Length{nil, {vg.Points(8), vg.Points(4)}, {vg.Points(3), vg.Points(3)}}

var colors = []color.Color{color.RGBA{0xd6, 0x27, 0x28, 0xff}, color.RGBA{0x1f, 0x77, 0xb4, 0xff}, color.RGBA{0x2c, 0xa0, 0x2c, 0xff}}

// run plots the input r to the PNG path.
func run(r io.Reader, path string) error {
	rn, err := parse(r)
	if err != nil {
		return err
	}
	p := plot.New()
	p.Title.Text = "qpdrain exporter, Prometheus and the shipped alert rules (for: 5s) on rxe"
	p.X.Label.Text = "seconds since Prometheus started"
	p.Y.Label.Text = "value"
	p.X.Min, p.X.Max, p.Y.Min = 0, rn.end-rn.start, 0
	yMax := 1.0
	for _, xy := range rn.series {
		for _, pt := range xy {
			yMax = max(yMax, pt.Y)
		}
	}
	// Above the data, a band for the event labels, then the legend.
	const band = 2.5
	p.Y.Max = yMax + band
	p.Add(plotter.NewGrid())
	p.Legend.Top, p.Legend.Left = true, false
	p.Legend.YOffs = -vg.Inch * 2
	// Prometheus returns a point only where the series exists: a gap of
	// more than a step (TestFleetPrometheusRxe's are a quarter second) is
	// the series absent (the exporter down), drawn as a break.
	const gap = 0.5
	for k, q := range rn.order {
		var seg plotter.XYs
		legended := false
		flush := func() error {
			if len(seg) == 0 {
				return nil
			}
			l, err := plotter.NewLine(seg)
			if err != nil {
				return err
			}
			// Thinner and dashed each: series on the same values all show.
			l.LineStyle = draw.LineStyle{Color: colors[k%len(colors)], Width: vg.Points(3 - 0.8*float64(k)), Dashes: dashes[k%len(dashes)]}
			l.StepStyle = plotter.PostStep
			p.Add(l)
			if !legended {
				p.Legend.Add(q, l)
				legended = true
			}
			seg = nil
			return nil
		}
		for i, pt := range rn.series[q] {
			pt.X -= rn.start
			if i > 0 && pt.X-(rn.series[q][i-1].X-rn.start) > gap {
				if err := flush(); err != nil {
					return err
				}
			}
			seg = append(seg, pt)
		}
		if err := flush(); err != nil {
			return err
		}
	}
	marks := []event{{at: rn.reap, alert: "qpdrain reap"}, {at: rn.stopped, alert: "exporter stopped"}}
	for _, e := range rn.events {
		state := e.state
		if state == "" {
			state = "resolved"
		}
		marks = append(marks, event{at: e.at, alert: e.alert + " " + state})
	}
	for i, m := range marks {
		x := m.at - rn.start
		l, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: p.Y.Max}})
		if err != nil {
			return err
		}
		l.LineStyle = draw.LineStyle{Color: color.Gray{0x80}, Width: vg.Points(0.8), Dashes: []vg.Length{vg.Points(2), vg.Points(2)}}
		p.Add(l)
		// Staggered heights: marks seconds apart would print over each other.
		lab, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: x, Y: p.Y.Max - 0.25*float64(i%6)}}, Labels: []string{m.alert}})
		if err != nil {
			return err
		}
		ts := &lab.TextStyle[0]
		ts.Color, ts.YAlign = color.Gray{0x30}, draw.YTop
		lab.Offset = vg.Point{X: vg.Points(2)}
		// Each label starts at its line, but near the right edge.
		if x > 0.8*p.X.Max {
			ts.XAlign = draw.XRight
			lab.Offset.X = -lab.Offset.X
		}
		p.Add(lab)
	}
	return p.Save(12*vg.Inch, 6*vg.Inch, path)
}

package churnplot

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"

	"github.com/qpdrain/qpdrain/ipoibcm/churn"
)

// The plot's axes: integer ticks from 0, and the same axes for two runs of
// the same flags.
func TestAxes(t *testing.T) {
	for _, tc := range []struct {
		lo, hi float64
		want   string
	}{{0, 150, "0 20 40 60 80 100 120 140"}, {0, 3000, "0 500 1000 1500 2000 2500 3000"}, {0, 7, "0 1 2 3 4 5 6 7"}, {0, 60, "0 10 20 30 40 50 60"}} {
		var labels []string
		for _, tk := range (intTicks{}).Ticks(tc.lo, tc.hi) {
			if tk.Label != "" {
				labels = append(labels, tk.Label)
			}
		}
		if got := strings.Join(labels, " "); got != tc.want {
			t.Errorf("ticks %v-%v: %q, want %q", tc.lo, tc.hi, got, tc.want)
		}
	}
	short := &churn.Result{Samples: samples(), Events: churn.Events{Connects: 10, Sends: 20}}
	long := &churn.Result{Samples: sparse(), Events: churn.Events{Connects: 25, Sends: 5}}
	o := Options{MaxQP: 128, Until: time.Hour}
	if a, b := newAxes(short, o), newAxes(long, o); a != b || a.limit != 128 || a.xMax != 60 || a.unitName != "minutes" || a.qpMax <= 128*1.1 {
		t.Errorf("axes %+v and %+v, want the same, to 60 minutes, max_qp 128 drawn with room above it", a, b)
	}
}

func sample(at time.Duration, events int) churn.Sample {
	return churn.Sample{At: at, Events: events, QPs: 100}
}

// samples are 3 during the churn's 30 events, then 2 while the lists settle.
func samples() []churn.Sample {
	return []churn.Sample{sample(time.Minute, 10), sample(2*time.Minute, 20), sample(3*time.Minute, 30), sample(4*time.Minute, 30), sample(5*time.Minute, 30)}
}

// sparse are samples with a long gap during the churn.
func sparse() []churn.Sample {
	return []churn.Sample{sample(time.Minute, 1), sample(2*time.Minute, 2), sample(3*time.Minute, 3), sample(30*time.Minute, 4), sample(31*time.Minute, 5)}
}

// The lines break at the churn's last event and nowhere else (a long gap
// between samples is a step, not a break or a slope), and every line is a
// step.
func TestSegmentsAndSteps(t *testing.T) {
	res := &churn.Result{Samples: samples(), Events: churn.Events{Connects: 10, Sends: 20}}
	if segs := segments(res); len(segs) != 2 || len(segs[0]) != 3 || len(segs[1]) != 2 {
		t.Errorf("segments %v, want the events' 3 samples, then the settle's 2", segs)
	}
	gap := &churn.Result{Samples: sparse(), Events: churn.Events{Connects: 50, Sends: 50}}
	if segs := segments(gap); len(segs) != 1 {
		t.Errorf("segments %v, want one: the run was cut short of its last event", segs)
	}
	leg := plot.NewLegend()
	drawn, err := layers(res, newAxes(res, Options{MaxQP: 128}), listSeries, 128, &leg)
	if err != nil {
		t.Fatal(err)
	}
	lines := 0
	for _, pl := range drawn {
		if l, ok := pl.(*plotter.Line); ok && len(l.XYs) > 2 {
			lines++
			if l.StepStyle != plotter.PostStep {
				t.Errorf("a line of %d samples is drawn with slopes", len(l.XYs))
			}
		}
	}
	if lines == 0 {
		t.Error("no lines")
	}
}

// The QPs held lie on top of the limit line and of every list: drawn last,
// with max_qp drawn first.
func TestHeldOnTop(t *testing.T) {
	res := &churn.Result{Samples: samples(), Events: churn.Events{Connects: 10, Sends: 20}}
	leg := plot.NewLegend()
	drawn, err := layers(res, newAxes(res, Options{MaxQP: 128}), listSeries, 128, &leg)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, pl := range drawn {
		if l, ok := pl.(*plotter.Line); ok {
			order = append(order, lineName(l))
		}
	}
	if order[0] != "limit" || order[len(order)-1] != "QPs held" {
		t.Errorf("drawing order %v, want the limit first and the QPs held last", order)
	}
}

// lineName tells the limit from the series by their styles.
func lineName(l *plotter.Line) string {
	if l.LineStyle.Color == limitColor && len(l.XYs) == 2 && l.XYs[0].Y == l.XYs[1].Y && l.StepStyle == plotter.NoStep {
		return "limit"
	}
	for _, s := range listSeries {
		if l.LineStyle.Color == s.color {
			return s.name
		}
	}
	return "?"
}

// The whole plot draws, as a PNG and as an SVG, with the note at the last
// event.
func TestWrite(t *testing.T) {
	res := &churn.Result{Samples: samples(), Events: churn.Events{Connects: 10, Sends: 20}, SRQ: true}
	var png, svg bytes.Buffer
	if err := Write(&png, res, Options{MaxQP: 128}); err != nil || !bytes.HasPrefix(png.Bytes(), []byte("\x89PNG")) {
		t.Errorf("PNG: %v", err)
	}
	if err := Write(&svg, res, Options{MaxQP: 128, SVG: true}); err != nil || !strings.Contains(svg.String(), "the peers still connected leave at once") {
		t.Errorf("SVG without the note at the last event: %v", err)
	}
}

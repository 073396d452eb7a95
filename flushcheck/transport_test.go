package flushcheck

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/rcsetup"
	"github.com/qpdrain/qpdrain/soft"
)

// TestRetryProbes: peer-gone and rnr-exhausted pass on the soft device on
// real time, however late a loaded machine fires its retry timers within
// their wait (run it with -count=20 beside a load).
func TestRetryProbes(t *testing.T) {
	dev := openSoft(t, soft.Quirks{})
	for _, name := range []string{ProbePeerGone, ProbeRNRExhausted} {
		p, _ := Lookup(name)
		r := p.Run(context.Background(), dev, on(dev, quick))
		t.Logf("%s %s: %s", name, r.Outcome, r.Observed)
		if r.Outcome != Pass {
			t.Errorf("%s: %s: %s", name, r.Outcome, r.Observed)
		}
	}
}

// TestRetrySeriesFails: the verdict on a retry series still fails a device
// that never ends the series (rnr_retry 7, retry forever) once its wait has
// passed, and one that ends it sooner than the series it reports.
func TestRetrySeriesFails(t *testing.T) {
	dev := openSoft(t, soft.Quirks{})
	forever := rnrRetry
	forever.RNRRetry = rnrInfinite
	for _, tc := range []struct {
		name   string
		rt     rcsetup.Retry
		series retrySeries
		says   string
	}{
		{"never", forever, retrySeries{timers: 3, timer: rnrTimer(rnrRetry.MinRNRTimer), why: "rnr_retry 7"}, "no completion within"},
		{"sooner", rnrRetry, retrySeries{timers: 3, timer: time.Second, why: "3 timers of 1s"}, "sooner than its retry budget"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(context.Background(), dev, on(dev, quick).withDefaults())
			defer func() {
				if err := e.close(); err != nil {
					t.Error(err)
				}
			}()
			_, a, _, err := e.connected(tc.rt)
			if err != nil {
				t.Fatal(err)
			}
			start := e.clk.Now()
			v, err := requesterError(e, a, ibv.WCRNRRetryExcErr, tc.series)
			took := e.clk.Now().Sub(start)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("after %v: %s", took, v.observed)
			if v.ok || !strings.Contains(v.observed, tc.says) {
				t.Errorf("verdict ok %v, %q; want a deviation saying %q", v.ok, v.observed, tc.says)
			}
			if w := tc.series.wait(e.o.Timeout); tc.name == "never" && took < w {
				t.Errorf("gave up after %v, before its wait of %v", took, w)
			}
		})
	}
}

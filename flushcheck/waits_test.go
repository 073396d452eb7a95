package flushcheck

import (
	"context"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/soft"
)

// TestWaitsFollowTheDevice: a wait for what the device already owes by
// what came before it (the responder's event once the requester has the
// NAK's completion, a receive's flush once a send posted behind it is
// flushed, a send in SQD once the receives are posted and an RNR timer has
// passed) lasts Quiet past that, not a whole Timeout.
func TestWaitsFollowTheDevice(t *testing.T) {
	o := Options{Timeout: time.Second, Quiet: 20 * time.Millisecond}
	for _, tc := range []struct {
		probe string
		quirk soft.Quirks
		took  string // a regexp whose group is the wait, as observed
	}{
		{ProbeRecvInError, soft.Quirks{RecvInErrorNotFlushed: true}, `then (\S+) more after posting a send behind it`},
		{ProbeSQD, soft.Quirks{}, `sends \[256 SUCCESS\] by (\S+),`},
		{ProbeResponderAccessError, soft.Quirks{NoResponderErrorEvent: true}, `no async event within (\S+),`},
	} {
		t.Run(tc.probe, func(t *testing.T) {
			dev := openSoft(t, tc.quirk)
			p, _ := Lookup(tc.probe)
			r := p.Run(context.Background(), dev, on(dev, o))
			m := regexp.MustCompile(tc.took).FindStringSubmatch(r.Observed)
			if m == nil {
				t.Fatalf("%s: %s, observed %q: want it to match %q", tc.probe, r.Outcome, r.Observed, tc.took)
			}
			if d, err := time.ParseDuration(m[1]); err != nil || d >= o.Timeout/2 {
				t.Errorf("%s waited %s (%v), want about Quiet (%v), far less than Timeout (%v): %q", tc.probe, m[1], err, o.Quiet, o.Timeout, r.Observed)
			}
		})
	}
}

// Options.OnWait hears once of each wait on the wall clock that lasts
// LongWait: for the flush of a receive posted in ERROR that the device
// never flushes, for a Last WQE Reached it never raises; nothing of waits
// that end sooner or run on a simulated clock.
func TestOnWait(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out LongWait in real time")
	}
	o := Options{Timeout: LongWait + 300*time.Millisecond, Quiet: 20 * time.Millisecond}
	var told []Wait
	o.OnWait = func(w Wait) { told = append(told, w) }
	for _, tc := range []struct {
		probe string
		quirk soft.Quirks
		real  bool
		want  []Wait
	}{
		{ProbeRecvInError, soft.Quirks{RecvInErrorNotFlushed: true}, true, []Wait{{ProbeRecvInError, "1 completion", o.Timeout}}},
		{ProbeLastWQEReached, soft.Quirks{NoLastWQEReached: true}, true, []Wait{{ProbeLastWQEReached, "an async event", o.Timeout}}},
		{ProbeSendInError, soft.Quirks{}, true, nil},
		{ProbeRecvInError, soft.Quirks{RecvInErrorNotFlushed: true}, false, nil},
	} {
		told = nil
		dev := openSoft(t, tc.quirk)
		po := o
		if tc.real {
			onRealTime(dev)
		} else {
			po = on(dev, o)
		}
		p, _ := Lookup(tc.probe)
		if r := p.Run(context.Background(), dev, po); r.Outcome != Pass && r.Outcome != Deviation {
			t.Fatalf("%s: %s: %v", tc.probe, r.Outcome, r.Err)
		}
		if !slices.Equal(told, tc.want) {
			t.Errorf("%s with %+v (wall clock %v): OnWait heard %+v, want %+v", tc.probe, tc.quirk, tc.real, told, tc.want)
		}
	}
}

package flushcheck

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/soft"
)

// runWedged runs the check with o on a soft device whose verbs call blocks,
// holding the device's lock as a call stuck in the kernel holds the
// kernel's, at every trace entry block matches, until the test ends. It
// returns the results and how long after the first call blocked Run
// returned; it fails t if Run has not returned within a minute. At
// cleanup the call returns, the probe given up on closes its objects, and
// the device is closed.
func runWedged(t *testing.T, ctx context.Context, o Options, block func(soft.TraceEntry) bool) ([]Result, time.Duration) {
	t.Helper()
	unblock := make(chan struct{})
	blocked := make(chan time.Time, 1)
	dev, err := soft.Open(soft.Config{Trace: func(e soft.TraceEntry) {
		if block(e) {
			select {
			case blocked <- time.Now():
			default:
			}
			<-unblock
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	onRealTime(dev)
	done := make(chan []Result, 1)
	t.Cleanup(func() {
		close(unblock)
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Error("Run did not return once the blocked call did")
		}
		// The probe given up on closes its objects once its call returns.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			err := dev.Close()
			if !errors.Is(err, ibv.ErrBusy) || time.Now().After(deadline) {
				if err != nil {
					t.Errorf("closing the device: %v", err)
				}
				return
			}
		}
	})
	go func() { done <- Run(ctx, dev, o) }()
	var results []Result
	select {
	case results = <-done:
		done <- results
	case <-time.After(time.Minute):
		t.Fatal("Run did not return within a minute of a verbs call that never returns")
	}
	returned := time.Now()
	for _, r := range results {
		t.Logf("%-22s %-9s %8v  %s", r.Name, r.Outcome, roundDur(r.Duration), r.Observed)
	}
	select {
	case at := <-blocked:
		return results, returned.Sub(at)
	default:
		t.Fatal("no verbs call blocked")
		return nil, 0
	}
}

// A verbs call that never returns (the soft device blocks every move of a
// QP to RESET, as rxe on Linux 5.10 did not return from calls of
// reset-reuse) ends the check within the call timeout: reset-reuse hung in
// that call, the probes after it not run, those before it passed. Before
// the probes ran in a goroutine the check never ended (Run had not returned
// after 30 s).
func TestHungCall(t *testing.T) {
	o := quick
	o.CallTimeout = MinCallTimeout
	results, after := runWedged(t, context.Background(), o, func(e soft.TraceEntry) bool {
		return e.Kind == soft.TraceState && e.To == ibv.QPSReset
	})
	// A twentieth of the call timeout between looks, and a loaded machine.
	if bound := o.CallTimeout + time.Second; after > bound {
		t.Errorf("Run returned %v after the call blocked, want within %v", after, bound)
	}
	i := slices.IndexFunc(results, func(r Result) bool { return r.Name == ProbeResetReuse })
	if len(results) != len(probes) || i < 0 {
		t.Fatalf("%d results, want %d with reset-reuse", len(results), len(probes))
	}
	// Before and after in the order Run runs the probes.
	ran := make([]Result, len(runOrder))
	for k, j := range runOrder {
		ran[k] = results[j]
	}
	hung := results[i]
	i = slices.Index(runOrder, i)
	if hung.Outcome != Hung || !errors.Is(hung.Err, ErrHung) ||
		!regexp.MustCompile(`^ibv_modify_qp on QP \d+ to RESET did not return within 1s \(blocked for 1(\.\d+)?s\); the device may be wedged: see the kernel log \(dmesg\)$`).MatchString(hung.Observed) {
		t.Errorf("reset-reuse: %s, %q (%v); want hung in ibv_modify_qp to RESET, wrapping ErrHung", hung.Outcome, hung.Observed, hung.Err)
	}
	for _, r := range ran[:i] {
		if r.Outcome != Pass && !allowed(t, r) {
			t.Errorf("%s before the hang: %s, want pass", r.Name, r.Outcome)
		}
	}
	for _, r := range ran[i+1:] {
		if r.Outcome != NotRun || r.Observed != "not run: reset-reuse hung before it, and the device may be wedged" {
			t.Errorf("%s after the hang: %s, %q; want not run because reset-reuse hung", r.Name, r.Outcome, r.Observed)
		}
	}
	if c := Count(results); c.Hung != 1 || c.NotRun != len(probes)-1-i || c.Errors != 0 {
		t.Errorf("Count = %+v, want 1 hung and %d not run", c, len(probes)-1-i)
	}
}

// A probe blocked where it records no verbs call (drain.DrainAll's own
// ibv_modify_qp to ERR here) is hung once it has not returned CallTimeout
// after its context ended, naming the last call it recorded.
func TestHungOutsideRecordedCalls(t *testing.T) {
	o := quick
	o.CallTimeout = MinCallTimeout
	o.Run = regexp.MustCompile("^drain-wr$")
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	results, _ := runWedged(t, ctx, o, func(e soft.TraceEntry) bool {
		return e.Kind == soft.TraceState && e.To == ibv.QPSErr
	})
	r, _ := lookupResult(results, ProbeDrainWR)
	if want := "the probe did not return within 1s of its end (context deadline exceeded), blocked outside the verbs calls it records (the last: ibv_post_recv on QP "; r.Outcome != Hung || !strings.HasPrefix(r.Observed, want) {
		t.Errorf("drain-wr: %s, %q; want hung saying %q", r.Outcome, r.Observed, want)
	}
	if c := Count(results); c != (Tally{Hung: 1, Skipped: len(probes) - 1}) {
		t.Errorf("Count = %+v, want 1 hung, the others skipped", c)
	}
}

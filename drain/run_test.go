package drain_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/clock"
	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
)

// firstWait tells, once, when Run first waits on the completion channel,
// and counts the channel's wakes.
type firstWait struct {
	ibv.CompChannel
	at    chan time.Time // buffered, 1
	wakes atomic.Int32
}

func (w *firstWait) Wake() {
	w.wakes.Add(1)
	w.CompChannel.Wake()
}

func (w *firstWait) WaitCQ(ctx context.Context) (ibv.CQ, error) {
	select {
	case w.at <- time.Now():
	default:
	}
	return w.CompChannel.WaitCQ(ctx)
}

// Run on a completion channel polls on for its spin's budget after the CQ
// is found empty while a QP is pending, then arms the CQ and sleeps: a
// wait of seconds (here a Last WQE Reached that is never fed) costs one
// spin, not a processor. With nothing pending it sleeps at once. The spin
// runs in real time, so it ends on a clock that stands still too.
func TestRunSpinsThenSleeps(t *testing.T) {
	const spin = 100 * time.Millisecond
	for _, tc := range []struct {
		name    string
		pending bool
		clock   clock.Clock
		spin    time.Duration
		// the first wait comes at least min and less than max after Run
		// starts
		min, max time.Duration
	}{
		{"pending", true, clock.Real{}, spin, spin, spin + devtest.Timeout},
		{"idle", false, clock.Real{}, time.Hour, 0, devtest.Timeout},
		{"pending, clock standing still", true, clock.NewVirtual(time.Now()), spin, spin, spin + devtest.Timeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := devtest.Open(t)
			ch, cq := newCQ(t, dev, 1024, true)
			r := newRig(t, dev, cq, 64)
			rp := newReaper(t, cq, drain.Options{Clock: tc.clock, LastWQETimeout: devtest.Timeout, DrainTimeout: devtest.Timeout})
			rp.SetSpin(tc.spin)
			if tc.pending {
				// No async events are fed: the SRQ side waits for its Last
				// WQE Reached until the test ends.
				add(t, rp, r.pair(true), drain.AddOptions{})
			}
			w := &firstWait{CompChannel: ch, at: make(chan time.Time, 1)}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			start := time.Now()
			go func() { done <- rp.Run(ctx, drain.Feed{Channel: w}) }()
			select {
			case at := <-w.at:
				if d := at.Sub(start); d < tc.min || d >= tc.max {
					t.Errorf("Run first waited on the channel %v after it started, want at least %v and less than %v", d, tc.min, tc.max)
				}
			case <-time.After(tc.max):
				t.Errorf("Run did not wait on the channel within %v", tc.max)
			}
			// On the virtual clock Run's sleep moves the clock to the QP's
			// deadline at once.
			if _, real := tc.clock.(clock.Real); real && tc.pending && rp.Stats().Pending != 1 {
				t.Errorf("stats %+v: want the QP pending", rp.Stats())
			}
			stopRun(t, rp, cancel, done)
		})
	}
}

// An Add that needs Run's poll (a QP counting its receives waits for an
// empty poll begun after it) wakes Run's wait on the channel itself
// (CompChannel.Wake), before Add returns: a wake through Run's context
// goes through a goroutine of context.AfterFunc's, which waits for a
// processor while the adding goroutine keeps one.
func TestAddWakesRun(t *testing.T) {
	dev := devtest.Open(t)
	ch, cq := newCQ(t, dev, 1024, true)
	r := newRig(t, dev, cq, 64)
	rp := newReaper(t, cq, drain.Options{Queue: queueOf, DrainTimeout: devtest.Timeout})
	w := &firstWait{CompChannel: ch, at: make(chan time.Time, 1)}
	ctx, cancel := context.WithTimeout(context.Background(), devtest.Timeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- rp.Run(ctx, drain.Feed{Channel: w}) }()
	select {
	case <-w.at:
	case <-ctx.Done():
		t.Fatal("Run did not wait on the channel")
	}
	qp := r.pair(false)
	r.postRecvs(qp, 1)
	h := add(t, rp, qp, withSendCount(drain.AddOptions{CountRecvs: true, Recvs: 1}))
	if n := w.wakes.Load(); n != 1 {
		t.Errorf("Add returned with the channel woken %d times, want once", n)
	}
	if rep, err := h.Wait(ctx); err != nil || rep.Outcome != report.Safe {
		t.Errorf("drain = %v, %v; want safe", rep.Outcome, err)
	}
	stopRun(t, rp, cancel, done)
}

// stopRun cancels Run (cancel), checks that it returned (on done) the
// context's error, and shuts rp down.
func stopRun(t *testing.T, rp *drain.Reaper, cancel context.CancelFunc, done <-chan error) {
	t.Helper()
	cancel()
	if err := <-done; err != context.Canceled {
		t.Errorf("Run returned %v, want context.Canceled", err)
	}
	ended, end := context.WithCancel(context.Background())
	end()
	rp.Shutdown(ended)
}

// cqErrorAfter is an event source that raises EventCQErr on cq once, after
// a delay, and nothing else.
type cqErrorAfter struct {
	cq    ibv.CQ
	delay time.Duration
	sent  atomic.Bool
}

func (s *cqErrorAfter) NextAsyncEvent(ctx context.Context) (ibv.AsyncEvent, error) {
	if !s.sent.Swap(true) {
		select {
		case <-time.After(s.delay):
			return ibv.AsyncEvent{Type: ibv.EventCQErr, CQ: s.cq}, nil
		case <-ctx.Done():
			return ibv.AsyncEvent{}, ctx.Err()
		}
	}
	<-ctx.Done()
	return ibv.AsyncEvent{}, ctx.Err()
}

// DrainAll feeds its reaper in the caller's goroutine until every QP has
// an outcome. When the last outcome comes from the event goroutine (here
// a CQ error failing an SRQ QP that waits for its Last WQE Reached, which
// the event source never gives) while the loop sleeps on the channel with
// nothing on the CQ, DrainAll returns then, not at the next deadline.
func TestDrainAllEndsOnEventOutcome(t *testing.T) {
	dev := devtest.Open(t)
	ch, cq := newCQ(t, dev, 1024, true)
	r := newRig(t, dev, cq, 64)
	qp := r.pair(true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*devtest.Timeout)
	defer cancel()
	began := time.Now()
	reps, err := drain.DrainAll(ctx, []ibv.QP{qp}, drain.AddOptions{},
		drain.Options{LastWQETimeout: time.Hour, DrainTimeout: time.Hour},
		drain.Feed{Channel: ch, Events: &cqErrorAfter{cq: cq, delay: 100 * time.Millisecond}})
	if d := time.Since(began); d >= devtest.Timeout {
		t.Errorf("DrainAll returned %v after the CQ error", d)
	}
	if !errors.Is(err, drain.ErrCQError) || reps[0].Outcome != report.Failed {
		t.Errorf("DrainAll = %v, %v; want Failed with ErrCQError", reps[0].Outcome, err)
	}
}

package drain

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/qpdrain/qpdrain/clock"
	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/ibv"
)

// pollBatch is how many completions Poll moves per call.
const pollBatch = 64

// pollBufs holds Poll's completion arrays: an array handed to the CQ
// interface escapes, and one per call would be an allocation per poll.
var pollBufs = sync.Pool{New: func() any { return new([pollBatch]ibv.WC) }}

// maxIdleSleep caps Run's back-off between empty polls when it has no
// completion channel.
const maxIdleSleep = time.Millisecond

// Poll polls the reaper's CQ once, for callers that own it: drain WRs'
// completions are consumed, every other completion is counted in
// Stats.ForeignWCs (Run hands them to Feed.OnWC). A poll that finds
// nothing counts as CQEmpty. It returns how many completions it polled.
func (r *Reaper) Poll() (int, error) { return r.poll(nil) }

// poll is Poll, handing foreign completions to onWC (outside the reaper's
// lock) when it is set.
func (r *Reaper) poll(onWC func(ibv.WC)) (int, error) {
	wcs := pollBufs.Get().(*[pollBatch]ibv.WC)
	defer pollBufs.Put(wcs)
	polledAt := r.opts.Clock.Now()
	n, err := r.cq.Poll(wcs[:])
	if err != nil {
		return 0, fmt.Errorf("polling the reaper's CQ: %w", err)
	}
	r.mu.Lock()
	if n == 0 {
		r.cqEmpty(polledAt)
		r.mu.Unlock()
		return 0, nil
	}
	now := r.opts.Clock.Now()
	foreign := wcs[:0] // kept for onWC only: Poll just counts them
	for i := 0; i < n; {
		claimed, k := r.handleWC(wcs[i:n], now)
		switch {
		case claimed:
		case onWC == nil:
			r.stats.ForeignWCs += k
		default:
			foreign = append(foreign, wcs[i:i+k]...)
		}
		i += k
	}
	r.expire(now)
	r.mu.Unlock()
	if onWC != nil {
		for _, wc := range foreign {
			onWC(wc)
		}
	}
	return n, nil
}

// spinFor is how long Run polls on, while a QP is pending, after a poll
// found the CQ empty, before it arms the CQ and sleeps on the completion
// channel. A wake-up through the channel (the completion event, the
// channel's fd, a thread to run Run again) costs far more than a poll,
// and a drain's completions come in bursts close together: this is what
// Linux's busy polling does before a socket sleeps (net.core.busy_read
// and busy_poll: the microseconds to busy-loop on the device queue, 50 to
// 100 recommended). Idle, with no QP pending, Run sleeps at once, and a
// wait of seconds (a Last WQE Reached, a stalled drain WR) costs one spin
// per wake-up.
const spinFor = 100 * time.Microsecond

// Run polls the reaper's CQ until ctx ends, for callers that own the CQ:
// event-driven through f.Channel when set (after an empty poll and a
// bounded spin of polls while a QP is pending, the CQ is armed), otherwise
// by polling with a back-off of up to 1 ms.
// With f.Events set it also reads the device's async events and hands
// them to HandleEvent, passing the unclaimed ones to f.OnEvent; foreign
// completions go to f.OnWC. Run
// returns ctx's cause, or the first verbs error; every goroutine it starts
// has ended when it returns.
func (r *Reaper) Run(ctx context.Context, f Feed) error { return r.run(ctx, f, false) }

// run is Run, returning nil also once every QP added has an outcome when
// untilIdle is set (DrainAll's reaper, fed in its caller's goroutine).
func (r *Reaper) run(ctx context.Context, f Feed, untilIdle bool) error {
	r.mu.Lock()
	r.untilIdle = untilIdle
	r.mu.Unlock()
	ctx, cancel := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel(nil)
		wg.Wait()
	}()
	if f.Events != nil {
		wg.Go(func() {
			if err := r.pumpEvents(ctx, f); err != nil {
				cancel(err)
			}
		})
	}
	var err error
	if f.Channel != nil {
		err = r.runChannel(ctx, f)
	} else {
		err = r.runPolling(ctx, f.OnWC)
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return err
}

// pumpEvents hands the device's async events to the reaper until ctx ends.
func (r *Reaper) pumpEvents(ctx context.Context, f Feed) error {
	for {
		ev, err := f.Events.NextAsyncEvent(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("reading async events: %w", err)
		}
		if !r.HandleEvent(ev) && f.OnEvent != nil {
			f.OnEvent(ev)
		}
	}
}

func (r *Reaper) runPolling(ctx context.Context, onWC func(ibv.WC)) error {
	idle := time.Duration(0)
	// The back-off paces the CPU, not a deadline: it runs in real time on
	// any Clock (a virtual clock advanced by idle polls would time drains
	// out by how fast the CPU spins). Poll expires the deadlines.
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for ctx.Err() == nil {
		n, err := r.poll(onWC)
		if err != nil {
			return err
		}
		if n > 0 {
			idle = 0
			continue
		}
		r.mu.Lock()
		done := r.idle()
		r.mu.Unlock()
		if done {
			return nil
		}
		idle = min(max(2*idle, time.Microsecond), maxIdleSleep)
		timer.Reset(idle)
		select {
		case <-ctx.Done():
		case <-timer.C:
		}
	}
	return nil
}

func (r *Reaper) runChannel(ctx context.Context, f Feed) error {
	for ctx.Err() == nil {
		n, err := r.poll(f.OnWC)
		if err != nil {
			return err
		}
		if n == 0 {
			if n, err = r.spin(ctx, f.OnWC); err != nil {
				return err
			}
		}
		if n > 0 {
			continue
		}
		if err := r.cq.ReqNotify(false); err != nil {
			return fmt.Errorf("arming the reaper's CQ: %w", err)
		}
		// A completion that arrived between the empty poll and the arming
		// raises no event: poll once more before sleeping.
		if n, err = r.poll(f.OnWC); err != nil || n > 0 {
			if err != nil {
				return err
			}
			continue
		}
		// A QP counting its receives is moved to ERROR only after an
		// empty poll, so its Add raises no completion that would end the
		// wait: Add cancels it (r.wake), or, added since the last poll,
		// has it skipped (r.kicked).
		r.mu.Lock()
		if r.kicked {
			r.kicked = false
			r.mu.Unlock()
			continue
		}
		if r.idle() {
			r.mu.Unlock()
			return nil
		}
		next := r.nextDeadline()
		// The next stall deadline ends the wait on the reaper's clock, so a
		// virtual clock's advance wakes it as the wall clock's would.
		stop := afterUntil(r.opts.Clock, next, f.Channel.Wake)
		// Add, HandleEvent and the rest end the wait early when they leave
		// a deadline before next (wakeForDeadline). They wake the channel
		// from their own goroutine (ibv.CompChannel.Wake): through ctx the
		// wake-up waits for a goroutine of context.AfterFunc's to get a
		// processor, which a busy waker holds (docs/BENCH.md). A wake that
		// comes after the wait ended ends the next one at once: one more
		// poll.
		r.wake, r.wakeAt = f.Channel.Wake, next
		r.mu.Unlock()
		_, err = f.Channel.WaitCQ(ctx)
		r.mu.Lock()
		r.wake = nil
		r.mu.Unlock()
		stop()
		if err != nil && ctx.Err() == nil && !errors.Is(err, ibv.ErrWoken) {
			return fmt.Errorf("waiting on the completion channel: %w", err)
		}
	}
	return nil
}

// idle says whether run, told to stop once idle, is to stop: every QP
// added has an outcome. r.mu must be held.
func (r *Reaper) idle() bool { return r.untilIdle && r.stats.Pending == 0 }

// spin polls the CQ until a poll finds completions, as long as a QP is
// pending, for spinFor at most; it returns what the last poll found. The
// spin paces the CPU, not a deadline, so it runs in real time on any
// Clock (on a virtual clock that stands still it would never end).
func (r *Reaper) spin(ctx context.Context, onWC func(ibv.WC)) (int, error) {
	budget := spinFor
	r.mu.Lock()
	if r.spinFor != 0 {
		budget = r.spinFor // a test's, negative for none
	}
	pending := r.stats.Pending > 0
	r.mu.Unlock()
	if budget <= 0 || !pending {
		return 0, nil
	}
	until := time.Now().Add(budget)
	for ctx.Err() == nil && time.Now().Before(until) {
		// Yield: a goroutine of the caller's (one adding QPs, say) may be
		// waiting for this processor.
		runtime.Gosched()
		if n, err := r.poll(onWC); err != nil || n > 0 {
			return n, err
		}
	}
	return 0, nil
}

// DrainAll drains qps, which all complete into one CQ that the caller
// owns, for a caller that needs no more than their outcomes: the one call
// of this package's first tier. It makes a Reaper of its own on that CQ,
// adds every QP with what add states of each, and feeds the reaper as Run
// does, in the calling goroutine, as f says (an SRQ-attached QP needs the
// device's async events, f.Events), until every QP has an outcome or ctx
// ends. It returns one report per QP, in the
// order of qps (a QP the reaper refused gets a Failed report with the
// refusal), and an error joining those of the QPs that are not safe to
// destroy: nil exactly when every QP may be destroyed now. Completions of
// other QPs on the CQ, their flushes included, go to f.OnWC (dropped
// without it), and events that are not the reaper's to f.OnEvent.
//
// On a simulated clock (Options.Clock other than clock.Real: a clock.Virtual,
// or the soft device's fabric) DrainAll feeds the reaper everything that
// has come, then moves the clock, in turn, so that time never passes a
// deadline before the reaper has seen what came before it; a wait of
// hours of device time takes milliseconds.
//
// A QP that ended quarantined (ErrQuarantined) is the caller's to keep;
// one that failed was handed back with its drain WRs outstanding, and a
// Reaper made on the CQ afterwards counts them against its headroom (see
// NewReaper). Callers draining QPs over time, or feeding the reaper from
// their own poll loop, use a Reaper.
func DrainAll(ctx context.Context, qps []ibv.QP, add AddOptions, opts Options, f Feed) ([]*report.Report, error) {
	if len(qps) == 0 {
		return nil, nil
	}
	if qps[0] == nil {
		return nil, fmt.Errorf("draining: qps[0] is nil: %w", ibv.ErrInvalidArgument)
	}
	r, err := NewReaper(qps[0].SendCQ(), opts)
	if err != nil {
		return nil, fmt.Errorf("draining: %w", err)
	}
	defer r.Shutdown(ended)
	// Every QP is in before anything polls the CQ, so that the flushes of
	// a QP already in ERROR (by rdma_disconnect, say) are counted in its
	// report rather than polled before its Add.
	hs := make([]*Handle, len(qps))
	reps := make([]*report.Report, len(qps))
	errs := make([]error, len(qps))
	r.addAll(qps, add, func(i int, h *Handle, err error) {
		if err != nil {
			rep := &report.Report{Start: r.opts.Clock.Now(), Outcome: report.Failed, Err: err}
			if qps[i] != nil {
				rep.QPNum, rep.SRQ = qps[i].Num(), qps[i].SRQ() != nil
			}
			reps[i], errs[i] = rep, err
		}
		hs[i] = h
	})
	// On the wall clock the reaper is fed by Run's loop in this goroutine
	// until every QP has an outcome: the caller has nothing else to do, and
	// a Run of its own would hand every outcome to this goroutine through
	// the scheduler (on rxe 6.12 under qemu, 0.11-0.24x of the device floor
	// in three runs of four, docs/BENCH.md). A verbs error ends the waits
	// below with it.
	// On a simulated clock a wait would move the clock past a deadline at
	// once, before a poll in real time saw what came before it: there the
	// reaper is fed, then the clock stepped, in turn.
	wait := (*Handle).Wait
	if _, real := r.opts.Clock.(clock.Real); real {
		runCtx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		if err := r.run(runCtx, f, true); err != nil && runCtx.Err() == nil {
			cancel(err)
		}
		ctx = runCtx
	} else {
		wait = func(h *Handle, ctx context.Context) (*report.Report, error) {
			for done, d := h.Done(), simStep; ; {
				select {
				case <-done:
					return h.Wait(ctx)
				default:
				}
				fed, err := r.feed(f)
				if err == nil {
					d = r.nextStep(d, fed)
					err = r.opts.Clock.Sleep(ctx, d)
				}
				if err != nil {
					return h.Wait(ctx) // the context's error, or the clock's deadlines
				}
			}
		}
	}
	// QPs end about in the order they were added: waiting for the last
	// first finds most of the others ended, one wake-up instead of one
	// per QP.
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i] != nil {
			reps[i], errs[i] = wait(hs[i], ctx)
		}
	}
	return reps, errors.Join(errs...)
}

// simStep is how far DrainAll first moves a simulated clock once the
// reaper has seen everything that came: short against any timeout, so that
// a device's own timers (a soft fabric's retries) fire in between.
const simStep = 200 * time.Microsecond

// nextStep is how far to move a simulated clock after a step of d that
// found something (fed) or nothing: simStep again after something, else
// twice d, so that a long quiet wait takes few steps, but never past the
// reaper's next deadline, whose expiry must see what came before it.
func (r *Reaper) nextStep(d time.Duration, fed bool) time.Duration {
	if fed {
		return simStep
	}
	d *= 2
	if next := r.NextDeadline(); !next.IsZero() {
		d = min(d, next.Sub(r.opts.Clock.Now()))
	}
	return max(d, simStep)
}

// feed hands the reaper everything that has come, as f says: the CQ until
// a poll finds it empty, then the events already queued. It reports
// whether anything came, and fails when a verbs call fails.
func (r *Reaper) feed(f Feed) (bool, error) {
	fed := false
	for {
		n, err := r.poll(f.OnWC)
		if err != nil {
			return fed, err
		}
		if n == 0 {
			break
		}
		fed = true
	}
	for f.Events != nil {
		ev, err := f.Events.NextAsyncEvent(ended)
		if errors.Is(err, context.Canceled) {
			break
		}
		if err != nil {
			return fed, fmt.Errorf("reading async events: %w", err)
		}
		fed = true
		if !r.HandleEvent(ev) && f.OnEvent != nil {
			f.OnEvent(ev)
		}
	}
	return fed, nil
}

// ended is a context that has ended: Shutdown then waits for nothing.
var ended = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

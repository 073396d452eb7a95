package drain

import (
	"context"
	"fmt"
	"time"

	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/ilist"
)

// closedChan is the Done channel of a handle that ended before anyone asked.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Handle follows one QP through its drain.
//
// Its fields are those of every drain, in the order the passes over the
// handles read them, 280 bytes in a slab of AddAll's (256, four cache
// lines, before the steps' log held their errors too: at 65,536 QPs on
// the soft device that cost about 2.5% of the drain's time, docs/BENCH.md).
// A QP's handle is read in AddAll, when its flushes are counted and when
// its drain WR completes, and at 65,536 QPs each pass finds most of them
// outside the cache, so every byte a QP costs in each. What only some
// drains need is in a handleExt, made on first need.
type Handle struct {
	r   *Reaper
	qpn uint32
	// given is the state AddOptions stated, QPSUnknown when none was: a
	// byte, as every ibv.QPState up to QPSUnknown fits (Add refuses a
	// stated state above QPSErr).
	given uint8

	// Guarded by r.mu. What a poll reads of every QP comes first: the
	// stage, the list links, the steps; then what a drain WR's completion
	// reads and writes (the drain WRs, then the report's proofs,
	// progress), then what counting flushes does (the report's start and
	// counts). The rest is for rarer paths.
	stage       stage
	on          stage // the stage of the list h is on, stageAdding for none (a byte: a pointer would cost 8 per QP)
	outcome     report.Outcome
	srq         bool
	ended       bool
	lastWQE     bool // Last WQE Reached seen before the QP became ready, or stated
	barrierDone bool // a drain WR posted after the QP became ready completed
	needSend    bool // a drain WR on its own send queue is still to be posted
	needRecv    bool // a receive drain WR is still to be posted
	countRecvs  bool // AddOptions.CountRecvs, on a QP with its own receive queue
	unsure      bool // a completion with its number came while stageProving
	noSends     bool // AddOptions.NoSends, or CountSends with Sends 0
	stated      bool // AddOptions.LastWQESeen
	sawLastWQE  bool // a Last WQE Reached of the QP was handed to HandleEvent (a step)
	destroyed   bool // by Destroy
	// recvsLeft counts the receives still to come back of a QP counting
	// them; progress.recvsBack those back. A count of sends, rarer, is in
	// the handleExt (counter gives either).
	recvsLeft uint32
	links     ilist.Links[Handle]
	steps     report.Log // the report's steps, packed
	// The drain WRs outstanding; once the QP is handed back, those it was
	// handed back with, which Destroy lets go of.
	sendID uint64
	recvID uint64
	// barrierAfter is the sequence number of the last drain WR posted
	// before the QP became ready: only a later one is a barrier for it.
	barrierAfter uint64
	report       progress
	// deadline (since r.epoch) is when the wait the QP's list stands for
	// runs out; a proving QP's began DrainTimeout before (added).
	deadline time.Duration
	qp       ibv.QP
	x        *handleExt // nil until needed (ext)
}

// handleExt is what a handle needs only on some drains: a Done channel
// asked for, a drain that did not end Safe, a full queue, a QP reset
// before.
type handleExt struct {
	done     chan struct{} // made by Done on demand, closed at the outcome
	err      error         // Report.Err
	stall    error         // Report.Stall
	retryGen uint64        // the poll generation the last post found the queue full at, when full
	full     bool          // the last post found the queue full
	// stalled: the drain stalled under DestroyWhenEmpty, at stalledAt
	// (since r.epoch); only a poll begun after that releases the QP.
	stalled   bool
	stalledAt time.Duration
	resets    uint64 // the QP's error episode (ibv.QP.Resets) when not 0
	// countSends, sendsLeft and sendsBack are the send counter
	// (AddOptions.CountSends), as countRecvs, recvsLeft and
	// progress.recvsBack are the receive counter.
	countSends           bool
	sole                 bool // AddOptions.SoleQP
	sendsLeft, sendsBack uint32
}

// counter returns counter c of h (countRecv, countSend): whether the
// caller counts that queue, and the completions left to come back and
// back. A send counter makes h's handleExt, so r.mu must be held or h not
// yet shared; reads that need no send counter go through countsLeft.
func (h *Handle) counter(c int) (on *bool, left, back *uint32) {
	if c == countRecv {
		return &h.countRecvs, &h.recvsLeft, &h.report.recvsBack
	}
	x := h.ext()
	return &x.countSends, &x.sendsLeft, &x.sendsBack
}

// counting reports whether the caller counts the queue of counter c.
func (h *Handle) counting(c int) bool {
	if c == countRecv {
		return h.countRecvs
	}
	return h.x != nil && h.x.countSends
}

// counted reports whether the caller counts a queue of h.
func (h *Handle) counted() bool { return h.countRecvs || h.counting(countSend) }

// sole reports whether the caller stated h's QP the only one on its CQ.
func (h *Handle) sole() bool { return h.x != nil && h.x.sole }

// ext is h.x, made if h has none yet; r.mu must be held.
func (h *Handle) ext() *handleExt {
	if h.x == nil {
		h.x = new(handleExt)
	}
	return h.x
}

// resets is the error episode of h's QP when it was added (ibv.QP.Resets).
func (h *Handle) resets() uint64 {
	if h.x == nil {
		return 0
	}
	return h.x.resets
}

// added is when a proving QP was added, since r.epoch.
func (h *Handle) added() time.Duration { return h.deadline - h.r.opts.DrainTimeout }

// stalled reports whether h's drain stalled under DestroyWhenEmpty.
func (h *Handle) stalled() bool { return h.x != nil && h.x.stalled }

// QP is the QP being drained.
func (h *Handle) QP() ibv.QP { return h.qp }

// Done is closed when the drain has an outcome.
func (h *Handle) Done() <-chan struct{} {
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	if h.x == nil || h.x.done == nil {
		if h.ended {
			return closedChan
		}
		h.ext().done = make(chan struct{})
	}
	return h.x.done
}

// Destroy destroys the QP (h.QP().Close()) once the drain has an outcome
// that hands it back: Safe, DestroyedAfterEmptyCQ, Failed, or returned by
// Shutdown. It is the way to destroy a QP the reaper took: a drain WR
// still outstanding on it takes a CQ slot if it completes, so it counts
// against Options.Headroom until its completion is polled or, once Destroy
// has destroyed the QP, a poll begun after that finds the CQ empty; a QP
// destroyed any other way keeps its slots until completions that may
// never come. Destroy refuses, with an error wrapping ibv.ErrBusy, while
// the drain has no outcome or the QP is in quarantine (Shutdown hands
// those back). It may be called from any goroutine at any time, and
// again: once the QP is destroyed it does nothing.
func (h *Handle) Destroy() error {
	r := h.r
	r.destroyMu.Lock()
	defer r.destroyMu.Unlock()
	r.mu.Lock()
	stage, done, o := h.stage, h.destroyed, h.outcome
	r.mu.Unlock()
	switch {
	case done:
		return nil
	case stage != stageDone:
		return fmt.Errorf("destroying qpn %d: its drain is %s: %w", h.qpn, o, ibv.ErrBusy)
	}
	// Without r.mu, which the poll loop needs: a destroy may take long.
	if err := h.qp.Close(); err != nil {
		return fmt.Errorf("destroying qpn %d: %w", h.qpn, err)
	}
	r.mu.Lock()
	h.destroyed = true
	shut, ids := r.shut, [...]uint64{h.sendID, h.recvID}
	if !shut {
		r.destroyed(h, r.opts.Clock.Now())
	}
	r.mu.Unlock()
	if shut {
		// Its drain WRs still counted are the ledger's (Shutdown).
		for _, id := range ids {
			if id != 0 {
				destroyedLeft(r.cq, id)
			}
		}
	}
	return nil
}

// Report returns a copy of what the drain has seen so far.
func (h *Handle) Report() *report.Report {
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	return h.snapshot()
}

// snapshot copies the report, its steps built from h's; r.mu must be held.
func (h *Handle) snapshot() *report.Report {
	p := &h.report
	rep := &report.Report{QPNum: h.qpn, SRQ: h.srq, Start: h.r.epoch.Add(p.start), Recv: p.recv.queueProof(int(p.recvsBack)),
		Send: p.send.queueProof(0), Batch: int(p.batch), Outcome: h.outcome}
	for q := range p.flushed {
		rep.Flushed[q] = p.flushed[q].counts()
	}
	if h.x != nil {
		rep.Err, rep.Stall = h.x.err, h.x.stall
		rep.Send.Count = int(h.x.sendsBack)
	}
	rep.Log = h.steps // shared: a log only grows past a report's part
	return rep
}

// Wait waits until the drain has an outcome and returns its report. The
// error is nil exactly when the QP may be destroyed. When ctx ends first,
// the error wraps the sentinel of the step still waited for and ctx's
// cause, and the drain goes on (bounded by the reaper's timeouts); Wait may
// be called again. Stall timeouts fire while someone waits, even if no
// completion or event arrives.
func (h *Handle) Wait(ctx context.Context) (*report.Report, error) {
	r := h.r
	// A batch's Waits mostly find the drain over (DrainAll waits for the
	// last QP first): one lock then, and no pass over the deadlines.
	r.mu.Lock()
	if h.ended {
		rep := h.snapshot()
		r.mu.Unlock()
		return rep, rep.Err
	}
	r.mu.Unlock()
	done := h.Done()
	for {
		r.mu.Lock()
		r.expire(r.opts.Clock.Now())
		next := r.nextDeadline()
		r.mu.Unlock()
		select {
		case <-done:
			rep := h.Report()
			return rep, rep.Err
		default:
		}
		fire := make(chan struct{})
		stop := afterUntil(r.opts.Clock, next, func() { close(fire) })
		select {
		case <-done:
		case <-fire:
		case <-ctx.Done():
		}
		stop()
		if ctx.Err() == nil {
			continue
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		rep := h.snapshot()
		if rep.Outcome != report.Pending {
			return rep, rep.Err
		}
		return rep, fmt.Errorf("qpn %d: %w: %w", h.qpn, h.waitingFor(), context.Cause(ctx))
	}
}

// waitingFor names the step a pending drain is waiting on.
func (h *Handle) waitingFor() error {
	switch {
	case h.stage == stageAdding:
		return ErrModifyToError
	case h.stage == stageError:
		return ErrNoLastWQE
	case h.stage == stageEmptyWait || h.stage == stageProving:
		return ErrCQNotEmpty
	case h.stage == stageFlush:
		return ErrNoHeadroom
	case h.sendID == 0 && h.recvID == 0 && h.countsLeft():
		return countMissing[h.firstLeft()]
	}
	return ErrDrainNotFlushed
}

// countsLeft reports whether a queue the caller counts still has
// completions to come back.
func (h *Handle) countsLeft() bool { return h.recvsLeft > 0 || h.x != nil && h.x.sendsLeft > 0 }

// firstLeft is the first counter with completions still to come back.
func (h *Handle) firstLeft() int {
	if h.recvsLeft > 0 {
		return countRecv
	}
	return countSend
}

// tally counts, in the report, the completions at the front of wcs (the
// first one h's) up to the first of another QP or a drain WR's, as of
// queue q, polled at (from the start); it returns how many it counted.
func (h *Handle) tally(q report.Queue, wcs []ibv.WC, at time.Duration, now time.Time) int {
	f := &h.report.flushed[q]
	if f.flushed+f.other == 0 {
		f.first = at
	}
	f.last = at
	flushed, other := f.flushed, f.other
	n := 0
	for ; n < len(wcs); n++ {
		wc := &wcs[n]
		if n > 0 && (wc.QPNum != h.qpn || IsDrainWRID(wc.ID)) {
			break
		}
		switch wc.Status {
		case ibv.WCWRFlushErr:
			if flushed == 0 {
				h.step(now, &report.Step{Kind: report.StepFlushed, Queue: q})
			}
			flushed++
		case ibv.WCSuccess:
			other++
		default:
			other++
			h.step(now, &report.Step{Kind: report.StepErrorWC, Queue: q, Status: wc.Status, WRID: wc.ID})
		}
	}
	f.flushed, f.other = flushed, other
	return n
}

// stepBytes is the room firstSteps gives a step: the steps of a QP
// drained the usual way take 7-8 bytes each (report.Log).
const stepBytes = 8

// firstSteps is the room for h's first steps, from room, which holds
// those of the left QPs of its batch from h on, made by the first that
// needs it. A QP that goes on at once and ends Safe takes 8 steps: its
// state, a drain WR posted and done on each of its two queues, a first
// flush on each, the outcome. An SRQ QP takes its stated Last WQE Reached
// in place of the receive drain WR's two, and without Options.Queue one
// flush step counts both queues: room for what it takes, stepBytes a
// step, and no more, as rooms are zeroed when made and written in the
// passes over the handles; a log that outgrows its room moves out
// (report.Log.Append). One that waits for Last WQE Reached, perhaps long, gets
// none: its transitions take what they need, grown at its next step.
func (h *Handle) firstSteps(room *[]byte, left int) report.Log {
	if h.srq && !h.lastWQE {
		return report.Log{}
	}
	n := 8
	if h.srq {
		n--
	}
	if h.r.opts.Queue == nil {
		n--
	}
	n *= stepBytes
	if len(*room) < n {
		*room = make([]byte, n*left)
	}
	s := (*room)[:0:n]
	*room = (*room)[n:]
	return report.MakeLog(s)
}

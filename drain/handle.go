package drain

import (
	"context"
	"fmt"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/ilist"
)

// closedChan is the Done channel of a handle that ended before anyone asked.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Handle follows one QP through its drain.
type Handle struct {
	r   *Reaper
	qp  ibv.QP
	qpn uint32
	// given is the state AddOptions stated, QPSUnknown when none was.
	given ibv.QPState

	// Guarded by r.mu.
	done        chan struct{} // made by Done on demand, closed at the outcome
	stage       stage
	on          stage // the stage of the list h is on, stageAdding for none (a byte: a pointer would cost 8 per QP)
	srq         bool
	ended       bool
	lastWQE     bool // Last WQE Reached seen before the QP became ready, or stated
	barrierDone bool // a drain WR posted after the QP became ready completed
	needSend    bool // a drain WR on its own send queue is still to be posted
	needRecv    bool // a receive drain WR is still to be posted
	countRecvs  bool
	full        bool // the last post found the queue full, at poll generation retryGen
	stalled     bool
	unsure      bool // a completion with its number came while stageProving
	noSends     bool // AddOptions.NoSends
	stated      bool // AddOptions.LastWQESeen
	recvsLeft   int
	sendID      uint64 // outstanding drain WRs
	recvID      uint64
	// barrierAfter is the sequence number of the last drain WR posted
	// before the QP became ready: only a later one is a barrier for it.
	barrierAfter uint64
	retryGen     uint64
	deadline     time.Duration // since r.epoch, of the wait the QP's list stands for
	// since (since r.epoch) is when a proving QP was added, or when a
	// stalled one first stalled: one field, as a QP stalls only after it
	// has stopped proving.
	since  time.Duration
	links  ilist.Links[Handle]
	report Report
}

// QP is the QP being drained.
func (h *Handle) QP() ibv.QP { return h.qp }

// Done is closed when the drain has an outcome.
func (h *Handle) Done() <-chan struct{} {
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	if h.done == nil {
		if h.ended {
			return closedChan
		}
		h.done = make(chan struct{})
	}
	return h.done
}

// Report returns a copy of what the drain has seen so far.
func (h *Handle) Report() *Report {
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	return h.snapshot()
}

// snapshot copies the report; r.mu must be held.
func (h *Handle) snapshot() *Report {
	rep := h.report
	rep.Steps = append([]Step(nil), h.report.Steps...)
	return &rep
}

// Wait waits until the drain has an outcome and returns its report. The
// error is nil exactly when the QP may be destroyed. When ctx ends first,
// the error wraps the sentinel of the step still waited for and ctx's
// cause, and the drain goes on (bounded by the reaper's timeouts); Wait may
// be called again. Stall timeouts fire while someone waits, even if no
// completion or event arrives.
func (h *Handle) Wait(ctx context.Context) (*Report, error) {
	r := h.r
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
		if rep.Outcome != Pending {
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
	case h.sendID == 0 && h.recvID == 0 && h.countRecvs && h.recvsLeft > 0:
		return ErrRecvsMissing
	}
	return ErrDrainNotFlushed
}

// step appends s. A drain that goes past its first step takes about 6, so
// the second grows the slice to 8 at once instead of doubling from 1.
func (h *Handle) step(s Step) {
	if st := h.report.Steps; len(st) == cap(st) && cap(st) < 8 {
		h.report.Steps = append(make([]Step, 0, 8), st...)
	}
	h.report.Steps = append(h.report.Steps, s)
}

func (h *Handle) statedLastWQE() bool {
	for _, s := range h.report.Steps {
		if s.Kind == StepEvent && s.Event == ibv.EventQPLastWQEReached {
			return false
		}
	}
	return true
}

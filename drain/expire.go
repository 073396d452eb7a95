package drain

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/ibv"
)

// expire applies the policy to every wait that has run out of time.
func (r *Reaper) expire(now time.Time) {
	t := r.at(now)
	for h := r.lists[stageProving].Front(); h != nil && h.deadline <= t; h = r.lists[stageProving].Front() {
		r.begin(h, false, now)
	}
	for h := r.lists[stageError].Front(); h != nil && h.deadline <= t; h = r.lists[stageError].Front() {
		r.lists[stageError].remove(h)
		err := fmt.Errorf("qpn %d: %w within %v", h.qpn, ErrNoLastWQE, r.opts.LastWQETimeout)
		if r.eventsSeen == 0 {
			err = fmt.Errorf("%w: no async event was delivered to the reaper (through Run's Feed.Events or HandleEvent)", err)
		}
		if r.stall(h, err, now) {
			// The drain WR still orders everything the QP completed so
			// far; only the proof that nothing is left is missing.
			r.ready(h, now)
		}
	}
	for _, l := range [...]*list{&r.lists[stageFlush], &r.lists[stageWait], &r.lists[stageBarrier]} {
		for h := l.Front(); h != nil && h.deadline <= t; h = l.Front() {
			l.remove(h)
			if r.stall(h, r.stallErr(h), now) {
				h.needSend, h.needRecv = false, false
				r.waitEmpty(h, now)
			}
		}
	}
	for h := r.lists[stageEmptyWait].Front(); h != nil && h.deadline <= t; h = r.lists[stageEmptyWait].Front() {
		err := fmt.Errorf("qpn %d: %w: no poll begun after the stall found the CQ empty within %v", h.qpn, ErrCQNotEmpty, r.opts.DrainTimeout)
		h.step(now, &report.Step{Kind: report.StepStall, Err: err})
		r.finish(h, report.Failed, err, now)
	}
	r.post(now)
	r.wakeForDeadline()
}

// wakeForDeadline ends Run's wait on the completion channel when a wait
// now runs out before the one Run sleeps until: a drain WR posted with no
// completion to come (a provider that does not flush it) must still stall
// on time.
func (r *Reaper) wakeForDeadline() {
	if r.wake == nil {
		return
	}
	if next := r.nextDeadline(); !next.IsZero() && (r.wakeAt.IsZero() || next.Before(r.wakeAt)) {
		r.wake()
		r.wake = nil
	}
}

// stallErr says why a ready QP is still unproven at its deadline.
func (r *Reaper) stallErr(h *Handle) error {
	d := r.opts.DrainTimeout
	switch {
	case h.sendID != 0:
		return fmt.Errorf("qpn %d: %w: WR %#x posted on qpn %d, no completion within %v", h.qpn, ErrDrainNotFlushed, h.sendID, h.qpn, d)
	case h.recvID != 0:
		return fmt.Errorf("qpn %d: %w: receive drain WR %#x, no completion within %v", h.qpn, ErrDrainNotFlushed, h.recvID, d)
	case (h.needSend || h.needRecv) && h.x != nil && h.x.full:
		return fmt.Errorf("qpn %d: %w: %w after every poll for %v", h.qpn, ErrPostDrain, ibv.ErrQueueFull, d)
	case h.needSend || h.needRecv:
		return fmt.Errorf("qpn %d: %w within %v: %d drain WRs outstanding, headroom %d", h.qpn, ErrNoHeadroom, d, r.inFlight, r.opts.Headroom)
	case h.countsLeft():
		c := h.firstLeft()
		_, left, back := h.counter(c)
		return fmt.Errorf("qpn %d: %w: %d of %d back within %v", h.qpn, countMissing[c], *back, *back+*left, d)
	}
	return fmt.Errorf("qpn %d: %w: no barrier drain WR posted after Last WQE Reached completed within %v", h.qpn, ErrDrainNotFlushed, d)
}

// stall records that h's current step ran out of time and applies the
// policy. It returns true when the drain goes on (DestroyWhenEmpty); the
// caller, who knows the step, moves h on.
func (r *Reaper) stall(h *Handle, err error, now time.Time) bool {
	h.ext().stall = err
	h.step(now, &report.Step{Kind: report.StepStall, Err: err})
	r.debug(h, "drain stalled", slog.Any("policy", r.opts.Policy), slog.Any("error", err))
	if r.opts.Policy == DestroyWhenEmpty {
		if !h.x.stalled {
			h.x.stalled, h.x.stalledAt = true, r.at(now)
		}
		return true
	}
	if r.lists[stageQuarantine].Len() >= r.opts.MaxQuarantine {
		r.finish(h, report.Failed, fmt.Errorf("%w (%d QPs): %w", ErrQuarantineFull, r.lists[stageQuarantine].Len(), err), now)
		return false
	}
	// A quarantined QP is kept, not given up: its drain WRs may still
	// complete, so they keep counting against the headroom until they do.
	// They are no barrier one can count on any more.
	r.noBarrier(h.sendID)
	r.noBarrier(h.recvID)
	h.stage = stageQuarantine
	r.lists[stageQuarantine].push(h)
	r.stats.Quarantined++
	r.stats.Pending--
	r.conclude(h, report.Quarantined, fmt.Errorf("%w: %w", ErrQuarantined, err), now)
	return false
}

// waitEmpty puts h, stalled under DestroyWhenEmpty with nothing else
// left to wait for, on the wait for a poll begun after its stall that
// finds the CQ empty, for at most DrainTimeout: on a CQ that other QPs'
// traffic keeps busy no such poll may ever come.
func (r *Reaper) waitEmpty(h *Handle, now time.Time) {
	h.stage = stageEmptyWait
	h.deadline = r.at(now) + r.opts.DrainTimeout
	r.lists[stageEmptyWait].push(h)
}

// giveUp hands h's drain WRs over with h to the caller, who may destroy
// it: they count against the headroom until they complete, or until the
// caller destroys the QP through h (Handle.Destroy) and a poll begun after
// that finds the CQ empty. h keeps their IDs for Destroy.
func (r *Reaper) giveUp(h *Handle) {
	for _, id := range [...]uint64{h.sendID, h.recvID} {
		if id != 0 {
			r.noBarrier(id)
			r.loseWR(id, h.qpn)
		}
	}
}

// destroyed records that h's QP was destroyed at now: a poll begun after
// now that finds the CQ empty is past every completion of the drain WRs
// it was handed back with that are still counted (cqEmpty).
func (r *Reaper) destroyed(h *Handle, now time.Time) {
	for _, id := range [...]uint64{h.sendID, h.recvID} {
		if _, ok := r.lost[id]; ok {
			r.orphans = append(r.orphans, orphan{id: id, at: r.at(now)})
		}
	}
}

// NextDeadline is when the reaper next needs feeding, on Options.Clock:
// the earliest time one of its waits runs out, or, while a QP stalled
// under DestroyWhenEmpty waits for an empty poll begun after its stall,
// the first instant after the stall; zero if nothing waits. A caller that
// moves a virtual clock itself feeds the reaper by then (Poll, CQEmpty,
// HandleWC: each runs the deadlines that are due), so that simulated time
// never passes a deadline unseen.
func (r *Reaper) NextDeadline() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	next := r.nextDeadline()
	for h := r.lists[stageEmptyWait].Front(); h != nil; h = h.links.Next() {
		if t := r.epoch.Add(h.x.stalledAt + 1); next.IsZero() || t.Before(next) {
			next = t
		}
	}
	return next
}

// nextDeadline is the earliest time a wait runs out, or zero if nothing
// waits.
func (r *Reaper) nextDeadline() time.Time {
	d := time.Duration(-1)
	for _, l := range [...]*list{&r.lists[stageProving], &r.lists[stageError], &r.lists[stageFlush], &r.lists[stageWait], &r.lists[stageBarrier], &r.lists[stageEmptyWait]} {
		if h := l.Front(); h != nil && (d < 0 || h.deadline < d) {
			d = h.deadline
		}
	}
	if d < 0 {
		return time.Time{}
	}
	return r.epoch.Add(d)
}

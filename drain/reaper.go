package drain

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/qpdrain/qpdrain/ibv"
)

// Drain WR IDs. Every WR the reaper posts has an ID whose top 16 bits are
// WRIDTag; the low 48 bits are a sequence number. Callers must not use IDs
// in that range: the reaper claims every completion that carries one. User
// space and kernel pointers (top 16 bits all zeros or all ones) and small
// indexes never fall in it.
const (
	WRIDTag  uint64 = 0xd7a1 << 48
	WRIDMask uint64 = 0xffff << 48
)

// IsDrainWRID reports whether id is in the range reserved for drain WRs.
func IsDrainWRID(id uint64) bool { return id&WRIDMask == WRIDTag }

// stage is where a QP is in its drain; each stage but the transient ones is
// one of the reaper's lists, named as in ipoib_cm.c.
type stage uint8

const (
	stageAdding     stage = iota // being moved to ERROR, on no list yet
	stageError                   // errorList: waiting for Last WQE Reached
	stageFlush                   // flushList: receive side done, drain WR not posted yet
	stageDrain                   // drainList: behind the outstanding drain WR
	stageRecvWait                // recvWaitList: send barrier passed, receive drain WR pending
	stageEmptyWait               // emptyWaitList: stalled, waiting for an empty poll
	stageQuarantine              // quarantine: stalled, kept
	stageDone                    // outcome reached, forgotten by the reaper
)

// list is an intrusive FIFO of handles, so moving a QP between lists costs
// no allocation and removal is O(1).
type list struct {
	head, tail *Handle
	n          int
}

func (l *list) push(h *Handle) {
	h.list, h.prev, h.next = l, l.tail, nil
	if l.tail != nil {
		l.tail.next = h
	} else {
		l.head = h
	}
	l.tail = h
	l.n++
}

func (l *list) remove(h *Handle) {
	if h.prev != nil {
		h.prev.next = h.next
	} else {
		l.head = h.next
	}
	if h.next != nil {
		h.next.prev = h.prev
	} else {
		l.tail = h.prev
	}
	h.list, h.prev, h.next = nil, nil, nil
	l.n--
}

// Handle follows one QP through its drain.
type Handle struct {
	r    *Reaper
	qp   ibv.QP
	qpn  uint32
	done chan struct{}

	// Guarded by r.mu.
	stage       stage
	srq         bool
	lastWQE     bool // Last WQE Reached seen, or the caller said so
	rqDone      bool // receive side finished: Last WQE Reached, receive drain WR completed, or forced
	sqDone      bool // a drain WR posted after rqDone completed, or forced
	stalledAt   time.Time
	deadline    time.Time // of the wait on errorList or recvWaitList
	recvDrainID uint64
	list        *list
	prev, next  *Handle
	report      Report
}

// QP is the QP being drained.
func (h *Handle) QP() ibv.QP { return h.qp }

// Done is closed when the drain has an outcome.
func (h *Handle) Done() <-chan struct{} { return h.done }

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
	// One timer for every stall deadline; since Go 1.23 Reset never
	// delivers a stale expiry.
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		r.mu.Lock()
		r.expire(time.Now())
		next := r.nextDeadline()
		r.mu.Unlock()
		select {
		case <-h.done:
			rep := h.Report()
			return rep, rep.Err
		default:
		}
		var fire <-chan time.Time
		if !next.IsZero() {
			timer.Reset(time.Until(next))
			fire = timer.C
		}
		select {
		case <-h.done:
		case <-fire:
		case <-ctx.Done():
			r.mu.Lock()
			defer r.mu.Unlock()
			rep := h.snapshot()
			if rep.Outcome != Pending {
				return rep, rep.Err
			}
			return rep, fmt.Errorf("qpn %#x: %w: %w", h.qpn, h.waitingFor(), context.Cause(ctx))
		}
	}
}

// waitingFor names the step a pending drain is waiting on.
func (h *Handle) waitingFor() error {
	switch h.stage {
	case stageAdding:
		return ErrModifyToError
	case stageError:
		return ErrNoLastWQE
	case stageEmptyWait:
		return ErrCQNotEmpty
	}
	return ErrDrainNotFlushed
}

func (h *Handle) step(s Step) { h.report.Steps = append(h.report.Steps, s) }

// Stats count what a reaper did since it was created.
type Stats struct {
	Added        int // QPs handed to Add and accepted
	Pending      int // QPs without an outcome yet
	Safe         int // outcome Safe
	AfterEmptyCQ int // outcome DestroyedAfterEmptyCQ
	Quarantined  int // QPs in quarantine now
	Failed       int // outcome Failed
	DrainWRs     int // drain WRs posted on send queues (one per batch)
	RecvDrainWRs int // receive drain WRs posted on non-SRQ QPs
	// RepeatedLastWQE counts Last WQE Reached events for a QP that had
	// already had one; they are harmless and otherwise ignored.
	RepeatedLastWQE int
	// LateEvents and LateDrainWCs count events of quarantined QPs and
	// completions of drain WRs given up on.
	LateEvents   int
	LateDrainWCs int
	// ForeignWCs counts completions Poll found that were not the reaper's
	// and that no Options.OnWC took.
	ForeignWCs int
}

// Reaper drains QPs that share one CQ, as IPoIB connected mode does: QPs
// that reached Last WQE wait on the flush list; one drain WR at a time is
// posted, on the send queue of the first of them, and the whole flush list
// moves to the drain list behind it; when that WR's completion is polled the
// batch is safe to destroy and the next drain starts.
//
// A Reaper never polls the CQ unless asked to (Poll, Run): the caller's poll
// loop hands every completion to HandleWC and every async event to
// HandleEvent, and keeps those the reaper does not claim. All methods are
// safe for concurrent use.
type Reaper struct {
	cq   ibv.CQ
	opts Options

	mu sync.Mutex
	// handles holds every QP without an outcome, and the quarantined ones,
	// by QP number.
	handles       map[uint32]*Handle
	errorList     list // rx_error_list: in ERROR, Last WQE Reached not seen
	flushList     list // rx_flush_list: receive side done, drain WR not yet posted
	drainList     list // rx_drain_list: behind the outstanding drain WR
	recvWaitList  list // drain WR done, non-SRQ receive drain WR still pending
	emptyWaitList list // stalled under DestroyWhenEmpty, waiting for an empty poll
	quarantine    list
	// The one outstanding drain WR, when drainID != 0.
	drainID       uint64
	drainCarrier  uint32
	drainDeadline time.Time
	recvDrains    map[uint64]*Handle
	lastWC        *Handle // the handle of the last completion counted
	seq           uint64
	cqErr         error
	shut          bool
	stats         Stats
}

// NewReaper returns a reaper for the QPs that complete into cq. Every QP
// handed to it must use cq as both its send and its receive CQ, and cq and
// each QP's send queue must keep room for one drain WR (and each non-SRQ
// QP's receive queue for one receive drain WR).
func NewReaper(cq ibv.CQ, opts Options) *Reaper {
	return &Reaper{
		cq:         cq,
		opts:       opts.withDefaults(),
		handles:    make(map[uint32]*Handle),
		recvDrains: make(map[uint64]*Handle),
	}
}

// Add starts draining qp: it moves qp to ERROR unless it is there already,
// then waits (without blocking the caller) for Last WQE Reached if qp is
// attached to an SRQ, and batches it behind the next drain WR. Add returns
// an error, and no handle, only when qp cannot be taken at all; every later
// failure is reported by the handle.
func (r *Reaper) Add(qp ibv.QP, o AddOptions) (*Handle, error) {
	qpn := qp.Num()
	if t := qp.Type(); t != ibv.QPTRC && t != ibv.QPTUC {
		return nil, fmt.Errorf("qpn %#x is a %s QP: %w", qpn, t, ErrUnsupportedQP)
	}
	if qp.SendCQ() != r.cq || qp.RecvCQ() != r.cq {
		return nil, fmt.Errorf("qpn %#x does not complete into the reaper's CQ on both queues: %w", qpn, ErrUnsupportedQP)
	}
	h := &Handle{r: r, qp: qp, qpn: qpn, srq: qp.SRQ() != nil, lastWQE: o.LastWQESeen, done: make(chan struct{})}
	h.report = Report{QPNum: qpn, SRQ: h.srq, Start: time.Now(), Steps: make([]Step, 0, 8)}

	r.mu.Lock()
	switch {
	case r.shut:
		r.mu.Unlock()
		return nil, fmt.Errorf("adding qpn %#x: %w", qpn, ErrShutdown)
	case r.cqErr != nil:
		r.mu.Unlock()
		return nil, fmt.Errorf("adding qpn %#x: %w", qpn, r.cqErr)
	case r.handles[qpn] != nil:
		r.mu.Unlock()
		return nil, fmt.Errorf("qpn %#x is already being drained: %w", qpn, ibv.ErrBusy)
	}
	// Registered before the move to ERROR, so that the flushes and events it
	// causes are attributed to this QP even if another goroutine polls them
	// before Add returns.
	r.handles[qpn] = h
	r.stats.Added++
	r.stats.Pending++
	r.mu.Unlock()

	began := time.Now()
	from, err := moveToError(qp)

	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	// Completions and events that arrived during the modify were caused by
	// it: the transition goes first, at the time it began.
	h.report.Steps = slices.Insert(h.report.Steps, 0, Step{At: began, Kind: StepState, From: from, To: ibv.QPSErr})
	switch {
	case h.stage != stageAdding:
		// A CQ error or shutdown ended the drain meanwhile.
		return h, nil
	case err != nil:
		r.finish(h, Failed, fmt.Errorf("qpn %#x: %w: %w", qpn, ErrModifyToError, err), now)
		return h, nil
	}
	switch {
	case !h.srq && !r.opts.RecvDrain:
		// No Last WQE Reached comes for a QP with its own receive queue
		// (o11-5.2.5): the send drain WR is the whole barrier.
		h.rqDone = true
		r.toFlush(h)
	case !h.srq:
		// A receive drain WR behind the QP's receives orders its receive
		// queue; it may complete before or after the send drain WR.
		id := r.nextID()
		if err := qp.PostRecv([]ibv.RecvWR{{ID: id}}); err != nil {
			r.finish(h, Failed, fmt.Errorf("posting the receive drain WR on qpn %#x: %w: %w", qpn, ErrPostDrain, err), now)
			return h, nil
		}
		h.recvDrainID = id
		r.recvDrains[id] = h
		r.stats.RecvDrainWRs++
		h.step(Step{At: now, Kind: StepRecvDrainPosted, WRID: id})
		r.toFlush(h)
	case h.lastWQE:
		r.toFlush(h)
	default:
		h.stage = stageError
		h.deadline = now.Add(r.opts.LastWQETimeout)
		r.errorList.push(h)
	}
	r.startDrain(now)
	return h, nil
}

// moveToError moves qp to ERROR unless it is there and returns the state it
// was found in.
func moveToError(qp ibv.QP) (ibv.QPState, error) {
	attr, _, err := qp.Query(ibv.QPAttrState)
	if err != nil {
		return ibv.QPSUnknown, fmt.Errorf("querying the state: %w", err)
	}
	if attr.State == ibv.QPSErr {
		return attr.State, nil
	}
	if err := qp.Modify(ibv.QPAttr{State: ibv.QPSErr}, ibv.QPAttrState); err != nil {
		return attr.State, fmt.Errorf("modifying %s -> ERR: %w", attr.State, err)
	}
	return attr.State, nil
}

func (r *Reaper) nextID() uint64 {
	r.seq++
	return WRIDTag | r.seq&^WRIDMask
}

func (r *Reaper) toFlush(h *Handle) {
	h.rqDone = h.rqDone || h.srq
	h.stage = stageFlush
	r.flushList.push(h)
}

// startDrain posts the next drain WR if none is outstanding: on the send
// queue of the first QP of the flush list, which then moves, up to
// MaxBatch QPs, to the drain list (ipoib_cm_start_rx_drain). It posts
// under r.mu so that the WR's completion, which a synchronous provider may
// produce inside PostSend, cannot be handed to HandleWC before drainID
// names it.
func (r *Reaper) startDrain(now time.Time) {
	for r.drainID == 0 && r.flushList.n > 0 && r.cqErr == nil {
		carrier := r.flushList.head
		id := r.nextID()
		wr := []ibv.SendWR{{ID: id, Opcode: ibv.WRSend, Flags: ibv.SendSignaled}}
		if err := carrier.qp.PostSend(wr); err != nil {
			r.flushList.remove(carrier)
			r.finish(carrier, Failed, fmt.Errorf("posting the drain WR on qpn %#x: %w: %w", carrier.qpn, ErrPostDrain, err), now)
			continue
		}
		n := r.flushList.n
		if r.opts.MaxBatch > 0 && n > r.opts.MaxBatch {
			n = r.opts.MaxBatch
		}
		for range n {
			h := r.flushList.head
			r.flushList.remove(h)
			h.stage = stageDrain
			h.report.Batch = n
			h.step(Step{At: now, Kind: StepDrainPosted, WRID: id, Carrier: carrier.qpn, Count: n})
			r.drainList.push(h)
		}
		r.drainID, r.drainCarrier, r.drainDeadline = id, carrier.qpn, now.Add(r.opts.DrainTimeout)
		r.stats.DrainWRs++
	}
}

// HandleWC takes one completion from the caller's poll loop. It returns
// true when the completion is a drain WR's, which the reaper consumes; the
// caller keeps every other one (the reaper only counts, for the reports,
// those of QPs it drains). Options.Queue, if set, is called under the
// reaper's lock.
func (r *Reaper) HandleWC(wc ibv.WC) (claimed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	claimed = r.handleWC(wc, now)
	r.expire(now)
	return claimed
}

func (r *Reaper) handleWC(wc ibv.WC, now time.Time) bool {
	if IsDrainWRID(wc.ID) {
		r.drainWC(wc, now)
		return true
	}
	// Flushes come in runs of one QP: remember the last one looked up.
	h := r.lastWC
	if h == nil || h.qpn != wc.QPNum {
		if h = r.handles[wc.QPNum]; h == nil {
			return false
		}
		r.lastWC = h
	}
	if h.stage != stageQuarantine {
		r.count(h, wc, now)
	}
	return false
}

// count records a completion of a QP being drained.
func (r *Reaper) count(h *Handle, wc ibv.WC, now time.Time) {
	q := QueueUnknown
	if r.opts.Queue != nil {
		q = r.opts.Queue(wc)
	}
	f := &h.report.Flushed[q]
	if f.Flushed+f.Other == 0 {
		f.First = now
	}
	f.Last = now
	switch wc.Status {
	case ibv.WCWRFlushErr:
		if f.Flushed == 0 {
			h.step(Step{At: now, Kind: StepFlushed, Queue: q})
		}
		f.Flushed++
	case ibv.WCSuccess:
		f.Other++
	default:
		f.Other++
		h.step(Step{At: now, Kind: StepErrorWC, Queue: q, Status: wc.Status, WRID: wc.ID})
	}
}

func (r *Reaper) drainWC(wc ibv.WC, now time.Time) {
	if wc.ID == r.drainID && r.drainID != 0 {
		r.drainID = 0
		for r.drainList.n > 0 {
			h := r.drainList.head
			r.drainList.remove(h)
			h.step(Step{At: now, Kind: StepDrainDone, WRID: wc.ID, Status: wc.Status})
			h.sqDone = true
			r.settle(h, now)
		}
		r.startDrain(now)
		return
	}
	if h := r.recvDrains[wc.ID]; h != nil {
		delete(r.recvDrains, wc.ID)
		h.recvDrainID = 0
		h.step(Step{At: now, Kind: StepRecvDrainDone, WRID: wc.ID, Status: wc.Status})
		h.rqDone = true
		if h.stage == stageRecvWait {
			r.recvWaitList.remove(h)
			r.settle(h, now)
		}
		return
	}
	r.stats.LateDrainWCs++
}

// settle decides a QP whose send barrier has passed.
func (r *Reaper) settle(h *Handle, now time.Time) {
	switch {
	case !h.rqDone:
		h.stage = stageRecvWait
		h.deadline = now.Add(r.opts.DrainTimeout)
		r.recvWaitList.push(h)
	case !h.stalledAt.IsZero():
		h.stage = stageEmptyWait
		r.emptyWaitList.push(h)
	default:
		r.finish(h, Safe, nil, now)
	}
}

// HandleEvent takes one async event from the caller's event loop. It
// returns true when the event concerns a QP being drained (every such
// event is recorded in its report; Last WQE Reached moves it on) or is a
// CQ error on the reaper's CQ, which fails every pending drain with
// ErrCQError. Other events are the caller's.
func (r *Reaper) HandleEvent(ev ibv.AsyncEvent) (claimed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	defer r.expire(now)
	if ev.Type == ibv.EventCQErr && ev.CQ != nil && ev.CQ == r.cq {
		r.cqError(now)
		return true
	}
	if ev.QP == nil {
		return false
	}
	h := r.handles[ev.QP.Num()]
	if h == nil {
		return false
	}
	if h.stage == stageQuarantine {
		r.stats.LateEvents++
		return true
	}
	h.step(Step{At: now, Kind: StepEvent, Event: ev.Type})
	if ev.Type != ibv.EventQPLastWQEReached {
		return true
	}
	if h.lastWQE {
		r.stats.RepeatedLastWQE++
		return true
	}
	h.lastWQE = true
	if h.stage == stageError {
		r.errorList.remove(h)
		r.toFlush(h)
		r.startDrain(now)
	}
	return true
}

func (r *Reaper) cqError(now time.Time) {
	r.cqErr = fmt.Errorf("%w (EventCQErr)", ErrCQError)
	r.drainID = 0
	for _, h := range r.handles {
		if h.stage == stageQuarantine {
			continue
		}
		r.finish(h, Failed, fmt.Errorf("qpn %#x: %w", h.qpn, r.cqErr), now)
	}
}

// CQEmpty tells the reaper that the caller's poll of the CQ, just now,
// found no completion. Under DestroyWhenEmpty that proof releases the QPs
// whose drain stalled before it. Calling it also lets stall timeouts fire
// in a poll loop that nobody Waits on.
func (r *Reaper) CQEmpty() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cqEmpty(time.Now())
}

// cqEmpty releases the stalled QPs that reached emptyWaitList before a
// poll that started at polledAt and found nothing.
func (r *Reaper) cqEmpty(polledAt time.Time) {
	now := time.Now()
	for h := r.emptyWaitList.head; h != nil; {
		next := h.next
		if h.stalledAt.Before(polledAt) {
			r.emptyWaitList.remove(h)
			h.step(Step{At: now, Kind: StepCQEmpty})
			r.finish(h, DestroyedAfterEmptyCQ, nil, now)
		}
		h = next
	}
	r.expire(now)
}

// expire applies the policy to every wait that has run out of time.
func (r *Reaper) expire(now time.Time) {
	for h := r.errorList.head; h != nil && !now.Before(h.deadline); h = r.errorList.head {
		r.errorList.remove(h)
		err := fmt.Errorf("qpn %#x: %w within %v", h.qpn, ErrNoLastWQE, r.opts.LastWQETimeout)
		if r.stall(h, err, now) {
			// The drain WR still orders everything the QP completed so
			// far; only the proof that nothing is left changes.
			r.toFlush(h)
		}
	}
	if r.drainID != 0 && !now.Before(r.drainDeadline) {
		id, carrier := r.drainID, r.drainCarrier
		r.drainID = 0
		for r.drainList.n > 0 {
			h := r.drainList.head
			r.drainList.remove(h)
			err := fmt.Errorf("qpn %#x: %w: WR %#x posted on qpn %#x, no completion within %v",
				h.qpn, ErrDrainNotFlushed, id, carrier, r.opts.DrainTimeout)
			if r.stall(h, err, now) {
				h.sqDone = true
				r.settle(h, now)
			}
		}
	}
	for h := r.recvWaitList.head; h != nil && !now.Before(h.deadline); h = r.recvWaitList.head {
		r.recvWaitList.remove(h)
		err := fmt.Errorf("qpn %#x: %w: receive drain WR %#x, no completion within %v",
			h.qpn, ErrDrainNotFlushed, h.recvDrainID, r.opts.DrainTimeout)
		if r.stall(h, err, now) {
			h.rqDone = true
			r.settle(h, now)
		}
	}
	r.startDrain(now)
}

// stall records that h's current step ran out of time and applies the
// policy. It returns true when the drain goes on (DestroyWhenEmpty); the
// caller, who knows the step, moves h on.
func (r *Reaper) stall(h *Handle, err error, now time.Time) bool {
	h.report.Stall = err
	h.step(Step{At: now, Kind: StepStall, Err: err})
	r.logf(h, "drain stalled: %v (policy %s)", err, r.opts.Policy)
	if r.opts.Policy == DestroyWhenEmpty {
		if h.stalledAt.IsZero() {
			h.stalledAt = now
		}
		return true
	}
	if r.quarantine.n >= r.opts.MaxQuarantine {
		r.finish(h, Failed, fmt.Errorf("%w (%d QPs): %w", ErrQuarantineFull, r.quarantine.n, err), now)
		return false
	}
	if h.recvDrainID != 0 {
		delete(r.recvDrains, h.recvDrainID)
	}
	h.stage = stageQuarantine
	r.quarantine.push(h)
	r.stats.Quarantined++
	r.stats.Pending--
	r.conclude(h, Quarantined, fmt.Errorf("%w: %w", ErrQuarantined, err), now)
	return false
}

// finish gives h its outcome and forgets it.
func (r *Reaper) finish(h *Handle, o Outcome, err error, now time.Time) {
	if h.list != nil {
		h.list.remove(h)
	}
	if h.recvDrainID != 0 {
		delete(r.recvDrains, h.recvDrainID)
	}
	delete(r.handles, h.qpn)
	r.forget(h)
	h.stage = stageDone
	r.stats.Pending--
	switch o {
	case Safe:
		r.stats.Safe++
	case DestroyedAfterEmptyCQ:
		r.stats.AfterEmptyCQ++
	default:
		r.stats.Failed++
	}
	r.conclude(h, o, err, now)
}

// forget drops the reaper's last reference to a handle it let go of.
func (r *Reaper) forget(h *Handle) {
	if r.lastWC == h {
		r.lastWC = nil
	}
}

func (r *Reaper) conclude(h *Handle, o Outcome, err error, now time.Time) {
	h.report.Outcome, h.report.Err = o, err
	h.step(Step{At: now, Kind: StepOutcome, Outcome: o, Err: err})
	if o != Safe {
		r.logf(h, "drain ended: %s: %v", o, err)
	}
	close(h.done)
}

func (r *Reaper) logf(h *Handle, format string, args ...any) {
	if r.opts.Log == nil {
		return
	}
	r.opts.Log.WithFields(logrus.Fields{"lqpn": h.qpn}).Debugf(format, args...)
}

// nextDeadline is the earliest time a wait runs out, or zero if nothing
// waits.
func (r *Reaper) nextDeadline() time.Time {
	var d time.Time
	earlier := func(t time.Time) {
		if d.IsZero() || t.Before(d) {
			d = t
		}
	}
	if h := r.errorList.head; h != nil {
		earlier(h.deadline)
	}
	if r.drainID != 0 {
		earlier(r.drainDeadline)
	}
	if h := r.recvWaitList.head; h != nil {
		earlier(h.deadline)
	}
	return d
}

// Stats returns the reaper's counters.
func (r *Reaper) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// Quarantined returns the QPs held in quarantine. They must not be
// destroyed while the device may still use them; Shutdown hands them back.
func (r *Reaper) Quarantined() []*Handle {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*Handle, 0, r.quarantine.n)
	for h := r.quarantine.head; h != nil; h = h.next {
		out = append(out, h)
	}
	return out
}

// Shutdown waits until every pending drain has an outcome or ctx ends (the
// caller's poll loop, or Run, must keep feeding the reaper meanwhile), then
// fails what is still pending with ErrShutdown, empties the quarantine and
// returns every QP that is not safe to destroy: the failed and the
// quarantined ones. What to do with them is the caller's call; IPoIB-CM,
// at device stop, destroys them after 5 s.
func (r *Reaper) Shutdown(ctx context.Context) []*Handle {
	r.mu.Lock()
	pending := make([]*Handle, 0, len(r.handles))
	for _, h := range r.handles {
		if h.stage != stageQuarantine {
			pending = append(pending, h)
		}
	}
	r.mu.Unlock()
	for _, h := range pending {
		if _, err := h.Wait(ctx); err != nil && ctx.Err() != nil {
			break
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.shut = true
	now := time.Now()
	for _, h := range r.handles {
		if h.stage != stageQuarantine {
			r.finish(h, Failed, fmt.Errorf("qpn %#x: %w", h.qpn, ErrShutdown), now)
		}
	}
	var notSafe []*Handle
	for _, h := range pending {
		if h.report.Outcome == Failed {
			notSafe = append(notSafe, h)
		}
	}
	for r.quarantine.n > 0 {
		h := r.quarantine.head
		r.quarantine.remove(h)
		delete(r.handles, h.qpn)
		r.forget(h)
		r.stats.Quarantined--
		notSafe = append(notSafe, h)
	}
	return notSafe
}

package drain

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/qpdrain/qpdrain/ibv"
)

// Drain WR IDs. Every WR a reaper posts has an ID whose top 16 bits are
// WRIDTag; the low 48 bits are a sequence number shared by every reaper of
// the process, in the order the WRs were posted, so that no two drain WRs
// on one CQ have the same ID even when one reaper replaces another there
// with drain WRs still outstanding. Callers must not use IDs in that range:
// the reaper claims every completion that carries one. User space and
// kernel pointers (top 16 bits all zeros or all ones) and small indexes
// never fall in it.
const (
	WRIDTag  uint64 = 0xd7a1 << 48
	WRIDMask uint64 = 0xffff << 48
)

// IsDrainWRID reports whether id is in the range reserved for drain WRs.
func IsDrainWRID(id uint64) bool { return id&WRIDMask == WRIDTag }

// drainSeq numbers the drain WRs of every reaper of the process.
var drainSeq atomic.Uint64

// stage is where a QP is in its drain; each stage but the transient ones is
// one of the reaper's lists, named after ipoib_cm.c's where they match.
type stage uint8

const (
	stageAdding     stage = iota // being moved to ERROR, on no list yet
	stageProving                 // provingList: counting receives, waiting for the CQ to be past the number's earlier QPs
	stageError                   // errorList: waiting for Last WQE Reached
	stageFlush                   // flushList: ready, a drain WR still to post (headroom, a full queue)
	stageWait                    // waitList: drain WRs posted, or receives counted, awaited
	stageBarrier                 // barrierList: only the SRQ side open, waiting for a barrier completion
	stageEmptyWait               // emptyWaitList: stalled, waiting for an empty poll
	stageQuarantine              // quarantine: stalled, kept
	stageDone                    // outcome reached, forgotten by the reaper
)

// list is an intrusive list of handles ordered by deadline, so moving a QP
// between lists costs no allocation, removal is O(1), and the first entry
// is the next to time out.
type list struct {
	head, tail *Handle
	n          int
}

// push inserts h in deadline order, searching from the tail: QPs usually
// arrive in the order they time out.
func (l *list) push(h *Handle) {
	at := l.tail
	for at != nil && at.deadline > h.deadline {
		at = at.prev
	}
	h.list, h.prev = l, at
	if at == nil {
		h.next, l.head = l.head, h
	} else {
		h.next, at.next = at.next, h
	}
	if h.next != nil {
		h.next.prev = h
	} else {
		l.tail = h
	}
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

// closedChan is the Done channel of a handle that ended before anyone asked.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Handle follows one QP through its drain.
type Handle struct {
	r   *Reaper
	qp  ibv.QP
	qpn uint32

	// Guarded by r.mu.
	done        chan struct{} // made by Done on demand, closed at the outcome
	stage       stage
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
	added        time.Duration // since r.epoch
	deadline     time.Duration // since r.epoch, of the wait the QP's list stands for
	stalledAt    time.Duration
	list         *list
	prev, next   *Handle
	report       Report
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
		case <-done:
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
		case <-done:
		case <-fire:
		case <-ctx.Done():
			r.mu.Lock()
			defer r.mu.Unlock()
			rep := h.snapshot()
			if rep.Outcome != Pending {
				return rep, rep.Err
			}
			return rep, fmt.Errorf("qpn %d: %w: %w", h.qpn, h.waitingFor(), context.Cause(ctx))
		}
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

// Stats count what a reaper did since it was created.
type Stats struct {
	Added        int // QPs handed to Add and accepted
	Pending      int // QPs without an outcome yet
	Safe         int // outcome Safe
	AfterEmptyCQ int // outcome DestroyedAfterEmptyCQ
	Quarantined  int // QPs in quarantine now
	Failed       int // outcome Failed
	DrainWRs     int // drain WRs posted on send queues
	RecvDrainWRs int // receive drain WRs posted on QPs without an SRQ
	// InFlight is the number of drain WRs counted against
	// Options.Headroom now, MaxInFlight the most there ever were.
	InFlight, MaxInFlight int
	// PostRetries counts drain WRs that found their queue full and were
	// posted again after a poll.
	PostRetries int
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

// orphan is a drain WR of a QP given up on, still counted against the
// headroom because its completion may still take a CQ slot.
type orphan struct {
	id uint64
	at time.Duration
}

// Reaper drains QPs that share one CQ, as IPoIB connected mode does, and
// declares a QP safe only once each of its queues is proven finished (see
// the package documentation for the proofs). QPs whose only open queue is
// their SRQ side share one barrier drain WR; every other queue gets its
// own proof. At most Options.Headroom drain WRs are outstanding at once.
//
// A Reaper never polls the CQ unless asked to (Poll, Run): the caller's poll
// loop hands every completion to HandleWC and every async event to
// HandleEvent, and keeps those the reaper does not claim. All methods are
// safe for concurrent use.
type Reaper struct {
	cq    ibv.CQ
	opts  Options
	epoch time.Time

	mu sync.Mutex
	// byNum names, for each QP number on the CQ, the QP it stands for now:
	// pending or quarantined. Completions carry only the number; events
	// carry the QP, which must be the same object.
	byNum         map[uint32]*Handle
	provingList   list // counting receives, the CQ not yet past earlier QPs with the number
	errorList     list // rx_error_list: in ERROR, Last WQE Reached not seen
	flushList     list // rx_flush_list: ready, a drain WR still to post
	waitList      list // rx_drain_list: drain WRs or counted receives outstanding
	barrierList   list // SRQ side only, waiting for a barrier completion
	emptyWaitList list // stalled under DestroyWhenEmpty, waiting for an empty poll
	quarantine    list
	// wrs maps every drain WR counted against the headroom to its QP.
	wrs      map[uint64]*Handle
	orphans  []orphan
	inFlight int
	// newest is the sequence number of the newest drain WR outstanding for
	// a QP still draining, or 0 when unknown (which only costs an extra
	// barrier).
	newest uint64
	// seq is the sequence number of the reaper's last drain WR (drainSeq).
	seq     uint64
	pollGen uint64
	// fed is when the poll loop last called in (HandleWC, CQEmpty): its
	// next poll began after that.
	fed time.Time
	// wake ends Run's wait on the completion channel, nil when it is not
	// waiting, which lasts until wakeAt (zero: no deadline); kicked tells
	// Run not to start one: a QP waits for a poll.
	wake       context.CancelFunc
	wakeAt     time.Time
	kicked     bool
	history    eventHistory
	eventsSeen int
	lastWC     *Handle // the handle of the last completion counted
	cqErr      error
	shut       bool
	stats      Stats
}

// NewReaper returns a reaper for the QPs that complete into cq. Every QP
// handed to it must use cq as both its send and its receive CQ, and cq
// must keep Options.Headroom slots for drain WRs, each QP's send queue one
// slot, and each QP with its own receive queue and no receive count one
// receive slot.
func NewReaper(cq ibv.CQ, opts Options) *Reaper {
	o := opts.withDefaults()
	return &Reaper{
		cq:      cq,
		opts:    o,
		epoch:   time.Now(),
		byNum:   make(map[uint32]*Handle),
		wrs:     make(map[uint64]*Handle),
		history: eventHistory{max: o.EventHistory},
	}
}

func (r *Reaper) at(now time.Time) time.Duration { return now.Sub(r.epoch) }

// Add starts draining qp: it moves qp to ERROR unless it is there already
// (through RTS first with Options.ViaRTS; for a QP counting its receives,
// once a poll begun after Add found the CQ empty, see
// AddOptions.CountRecvs), waits (without blocking the caller) for Last WQE
// Reached if qp is attached to an SRQ, and posts the drain WRs its queues
// need. Add returns an error, and no handle, only
// when qp cannot be taken at all: ErrUnsupportedQP, ibv.ErrBusy for a QP
// already being drained, ibv.ErrInvalidArgument for AddOptions that cannot
// be honoured, ErrShutdown, ErrCQError; every later failure is reported by
// the handle.
func (r *Reaper) Add(qp ibv.QP, o AddOptions) (*Handle, error) {
	qpn := qp.Num()
	if t := qp.Type(); t != ibv.QPTRC && t != ibv.QPTUC {
		return nil, fmt.Errorf("qpn %d is a %s QP: %w", qpn, t, ErrUnsupportedQP)
	}
	if qp.SendCQ() != r.cq || qp.RecvCQ() != r.cq {
		return nil, fmt.Errorf("qpn %d does not complete into the reaper's CQ on both queues: %w", qpn, ErrUnsupportedQP)
	}
	srq := qp.SRQ() != nil
	if o.CountRecvs && !srq && (r.opts.Queue == nil || o.Recvs < 0) {
		return nil, fmt.Errorf("qpn %d: counting %d receives needs a non-negative count and Options.Queue: %w", qpn, o.Recvs, ibv.ErrInvalidArgument)
	}
	now := time.Now()
	h := &Handle{r: r, qp: qp, qpn: qpn, srq: srq, lastWQE: srq && o.LastWQESeen, noSends: o.NoSends, stated: o.LastWQESeen}
	h.report = Report{QPNum: qpn, SRQ: srq, Start: now}
	if o.CountRecvs && !srq {
		h.countRecvs, h.recvsLeft = true, o.Recvs
		if o.Recvs == 0 {
			h.report.Recv.By = ProofRecvCount
		}
	}

	r.mu.Lock()
	switch old := r.byNum[qpn]; {
	case r.shut:
		r.mu.Unlock()
		return nil, fmt.Errorf("adding qpn %d: %w", qpn, ErrShutdown)
	case r.cqErr != nil:
		r.mu.Unlock()
		return nil, fmt.Errorf("adding qpn %d: %w", qpn, r.cqErr)
	case old != nil && old.qp == qp:
		r.mu.Unlock()
		return nil, fmt.Errorf("qpn %d is already being drained: %w", qpn, ibv.ErrBusy)
	case old != nil && old.stage != stageQuarantine:
		r.mu.Unlock()
		return nil, fmt.Errorf("qpn %d names another QP still being drained: %w", qpn, ibv.ErrBusy)
	}
	// A quarantined QP that had this number was destroyed by its owner
	// and the number reused: it keeps its place in the quarantine, and the
	// number now stands for the new QP. The entry is made before the move
	// to ERROR, so that the flushes and events it causes are attributed
	// to this QP even if another goroutine polls them before Add returns.
	r.byNum[qpn] = h
	r.stats.Added++
	r.stats.Pending++
	if h.recvsLeft > 0 {
		// A count goes by QP number, and an earlier QP with this number,
		// destroyed before this one was created, may have left
		// completions in the CQ. They are all there by now, so a poll
		// begun after this moment that finds the CQ empty is past them:
		// until then the QP stays as it is and counts nothing.
		h.stage = stageProving
		h.added = r.at(now)
		h.deadline = h.added + r.opts.DrainTimeout
		r.provingList.push(h)
		// Only a poll moves this QP on: Run must not sleep on its channel.
		r.kicked = true
		if r.wake != nil {
			r.wake()
		}
		r.mu.Unlock()
		return h, nil
	}
	r.mu.Unlock()

	steps, err := r.moveToError(qp, now)

	r.mu.Lock()
	defer r.mu.Unlock()
	// Completions and events that arrived during the modify were caused by
	// it: the transitions go first.
	h.report.Steps = slices.Insert(h.report.Steps, 0, steps...)
	r.started(h, steps, err, time.Now())
	r.wakeForDeadline()
	return h, nil
}

// begin starts the drain of a QP counting its receives: proven, once a
// poll found the CQ past the completions of earlier QPs with its number,
// and none with its number came meanwhile; else at its deadline. A
// completion with its number before the proof may be an earlier QP's or
// its own, which the count cannot tell apart, so then a receive drain WR
// proves the receive queue instead. The move to ERROR is made under r.mu,
// so nothing comes between it and its steps.
func (r *Reaper) begin(h *Handle, proven bool, now time.Time) {
	r.provingList.remove(h)
	if proven && !h.unsure {
		h.step(Step{At: now, Kind: StepCQEmpty})
	} else {
		h.countRecvs, h.recvsLeft = false, 0
		h.step(Step{At: now, Kind: StepCountNotTrusted})
	}
	h.stage = stageAdding
	steps, err := r.moveToError(h.qp, now)
	h.report.Steps = append(h.report.Steps, steps...)
	r.started(h, steps, err, now)
}

// started goes on with h's drain once the move to ERROR (steps, err) is
// done.
func (r *Reaper) started(h *Handle, steps []Step, err error, now time.Time) {
	switch {
	case h.stage != stageAdding:
		// A CQ error or shutdown ended the drain meanwhile.
		return
	case err != nil:
		r.finish(h, Failed, fmt.Errorf("qpn %d: %w: %w", h.qpn, ErrModifyToError, err), now)
		return
	}
	foundInError := len(steps) == 1 && steps[0].From == ibv.QPSErr
	if h.noSends {
		h.report.Send.By = ProofNoSends
	} else {
		h.needSend = true
	}
	switch {
	case h.srq:
		if at, ok := r.history.take(h.qp); ok && foundInError && !h.lastWQE {
			h.lastWQE = true
			h.step(Step{At: at, Kind: StepLastWQEStated, Count: 1})
		} else if h.stated {
			h.step(Step{At: now, Kind: StepLastWQEStated})
		}
		// Every QP its own drain WR: the SRQ side too is proven by it.
		h.needSend = h.needSend || r.opts.MaxBatch == 1
	case h.countRecvs:
	default:
		h.needRecv = true
	}
	if h.srq && !h.lastWQE {
		h.stage = stageError
		h.deadline = r.at(now) + r.opts.LastWQETimeout
		r.errorList.push(h)
	} else {
		r.ready(h, now)
	}
	r.post(now)
}

// moveToError moves qp to ERROR unless it is there, through RTS when
// Options.ViaRTS asks it of a QP in RTR, and returns the transitions.
func (r *Reaper) moveToError(qp ibv.QP, began time.Time) ([]Step, error) {
	attr, _, err := qp.Query(ibv.QPAttrState)
	if err != nil {
		return []Step{{At: began, Kind: StepState, From: ibv.QPSUnknown, To: ibv.QPSErr}}, fmt.Errorf("querying the state: %w", err)
	}
	from := attr.State
	var steps []Step
	if from == ibv.QPSRTR && r.opts.ViaRTS {
		// The attributes RTR -> RTS requires (IBTA Table 91); their values
		// do not matter to a QP about to enter ERROR.
		rts := ibv.QPAttr{State: ibv.QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1}
		mask := ibv.QPAttrState | ibv.QPAttrTimeout | ibv.QPAttrRetryCnt | ibv.QPAttrRNRRetry | ibv.QPAttrSQPSN | ibv.QPAttrMaxQPRdAtomic
		if err := qp.Modify(rts, mask); err != nil {
			return append(steps, Step{At: began, Kind: StepState, From: from, To: ibv.QPSRTS}), fmt.Errorf("modifying RTR -> RTS: %w", err)
		}
		steps = append(steps, Step{At: began, Kind: StepState, From: from, To: ibv.QPSRTS})
		from = ibv.QPSRTS
	}
	steps = append(steps, Step{At: began, Kind: StepState, From: from, To: ibv.QPSErr})
	if from == ibv.QPSErr {
		return steps, nil
	}
	if err := qp.Modify(ibv.QPAttr{State: ibv.QPSErr}, ibv.QPAttrState); err != nil {
		return steps, fmt.Errorf("modifying %s -> ERR: %w", from, err)
	}
	return steps, nil
}

func (r *Reaper) nextID() uint64 {
	r.seq = drainSeq.Add(1)
	return WRIDTag | r.seq&^WRIDMask
}

// ready starts the wait for a QP's proofs: only drain WRs posted from now
// on are barriers for its SRQ side.
func (r *Reaper) ready(h *Handle, now time.Time) {
	h.barrierAfter = r.seq
	h.deadline = r.at(now) + r.opts.DrainTimeout
	r.place(h, now)
}

// place puts h on the list its remaining work calls for, or gives it its
// outcome when nothing is left to wait for.
func (r *Reaper) place(h *Handle, now time.Time) {
	switch {
	case h.needSend || h.needRecv:
		h.stage = stageFlush
		r.flushList.push(h)
	case h.sendID != 0 || h.recvID != 0 || h.countRecvs && h.recvsLeft > 0:
		h.stage = stageWait
		r.waitList.push(h)
	case h.srq && h.report.Recv.By == ProofNone && !h.barrierDone:
		h.stage = stageBarrier
		r.barrierList.push(h)
	case h.report.Proven():
		r.finish(h, Safe, nil, now)
	case h.stalled:
		// DestroyWhenEmpty, after its drain WRs: an empty poll releases it.
		h.stage = stageEmptyWait
		r.emptyWaitList.push(h)
	default:
		// Not reachable: every open queue above has something to wait
		// for. Should it happen, the QP is not safe.
		r.finish(h, Failed, fmt.Errorf("qpn %d: %w: nothing left that could prove it", h.qpn, ErrDrainNotFlushed), now)
	}
}

// track counts a posted drain WR against the headroom.
func (r *Reaper) track(h *Handle, id uint64) {
	r.wrs[id] = h
	r.inFlight++
	r.newest = id &^ WRIDMask
	r.stats.MaxInFlight = max(r.stats.MaxInFlight, r.inFlight)
}

// post posts the drain WRs the flush list waits for, oldest QP first, as
// far as the headroom allows, then a barrier for the SRQ sides waiting on
// one if no drain WR posted after them is outstanding. It posts under r.mu
// so that a WR's completion, which a synchronous provider may produce
// inside the post, cannot be handed to HandleWC before the reaper knows
// the WR.
func (r *Reaper) post(now time.Time) {
	if r.cqErr != nil || r.shut {
		return
	}
	for h := r.flushList.head; h != nil && r.inFlight < r.opts.Headroom; {
		next := h.next
		if !h.full || h.retryGen != r.pollGen {
			r.postFor(h, now)
		}
		h = next
	}
	t := r.barrierList.tail
	if t == nil || r.newest > t.barrierAfter {
		return
	}
	for c := r.barrierList.head; c != nil && r.inFlight < r.opts.Headroom; {
		next := c.next
		id := r.nextID()
		if err := c.qp.PostSend([]ibv.SendWR{{ID: id, Opcode: ibv.WRSend, Flags: ibv.SendSignaled}}); err != nil {
			// Its send queue was stated empty: the QP cannot carry it.
			r.finish(c, Failed, fmt.Errorf("posting a barrier drain WR on qpn %d: %w: %w", c.qpn, ErrPostDrain, err), now)
			c = next
			continue
		}
		c.sendID = id
		r.track(c, id)
		r.stats.DrainWRs++
		c.step(Step{At: now, Kind: StepDrainPosted, WRID: id, Carrier: c.qpn, Count: r.barrierList.n})
		return
	}
}

// postFor posts h's missing drain WRs, receive first: a provider that
// flushes a receive posted in ERROR only when a later post reaches the QP
// (rxe on Linux 6.12, docs/PROVIDERS.md) gets the send drain WR as that
// post.
func (r *Reaper) postFor(h *Handle, now time.Time) {
	if h.needRecv && r.inFlight < r.opts.Headroom {
		id := r.nextID()
		if !r.posted(h, id, h.qp.PostRecv([]ibv.RecvWR{{ID: id}}), "receive drain WR", now) {
			return
		}
		h.needRecv, h.recvID = false, id
		r.track(h, id)
		r.stats.RecvDrainWRs++
		h.step(Step{At: now, Kind: StepRecvDrainPosted, WRID: id})
	}
	if h.needSend && r.inFlight < r.opts.Headroom {
		id := r.nextID()
		if !r.posted(h, id, h.qp.PostSend([]ibv.SendWR{{ID: id, Opcode: ibv.WRSend, Flags: ibv.SendSignaled}}), "drain WR", now) {
			return
		}
		h.needSend, h.sendID = false, id
		r.track(h, id)
		r.stats.DrainWRs++
		h.step(Step{At: now, Kind: StepDrainPosted, WRID: id, Carrier: h.qpn, Count: 1})
	}
	if !h.needSend && !h.needRecv {
		r.flushList.remove(h)
		r.place(h, now)
	}
}

// posted handles a post's error: a full queue waits for the next poll,
// which may free a slot (a provider may return send slots only when their
// completions are polled); anything else fails the drain. It reports
// whether the WR was posted.
func (r *Reaper) posted(h *Handle, id uint64, err error, what string, now time.Time) bool {
	switch {
	case err == nil:
		h.full = false
		return true
	case errors.Is(err, ibv.ErrQueueFull):
		if !h.full {
			r.stats.PostRetries++
			h.step(Step{At: now, Kind: StepPostRetry, WRID: id})
		}
		h.full, h.retryGen = true, r.pollGen
		return false
	}
	r.finish(h, Failed, fmt.Errorf("posting the %s on qpn %d: %w: %w", what, h.qpn, ErrPostDrain, err), now)
	return false
}

// HandleWC takes one completion from the caller's poll loop. It returns
// true when the completion is a drain WR's, which the reaper consumes; the
// caller keeps every other one (the reaper only counts, for the reports
// and AddOptions.CountRecvs, those of QPs it drains). Options.Queue, if
// set, is called under the reaper's lock.
func (r *Reaper) HandleWC(wc ibv.WC) (claimed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	r.fed = now
	claimed = r.handleWC(wc, now)
	r.expire(now)
	return claimed
}

func (r *Reaper) handleWC(wc ibv.WC, now time.Time) bool {
	r.pollGen++
	if IsDrainWRID(wc.ID) {
		r.drainWC(wc, now)
		return true
	}
	// Flushes come in runs of one QP: remember the last one looked up.
	h := r.lastWC
	if h == nil || h.qpn != wc.QPNum {
		if h = r.byNum[wc.QPNum]; h == nil {
			return false
		}
		r.lastWC = h
	}
	switch h.stage {
	case stageQuarantine:
	case stageProving:
		h.unsure = true
	default:
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
	at := now.Sub(h.report.Start)
	if f.Flushed+f.Other == 0 {
		f.First = at
	}
	f.Last = at
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
	if q != QueueRecv || !h.countRecvs || h.recvsLeft == 0 {
		return
	}
	h.recvsLeft--
	h.report.Recv.Count++
	if h.recvsLeft == 0 {
		h.report.Recv.By = ProofRecvCount
		if h.stage == stageWait {
			r.waitList.remove(h)
			r.place(h, now)
		}
	}
}

// drainWC takes a drain WR's completion: the proof of the queue it was
// posted on and, wherever it was posted, a barrier for every SRQ side that
// became ready before it was posted.
func (r *Reaper) drainWC(wc ibv.WC, now time.Time) {
	h, ok := r.wrs[wc.ID]
	if !ok || wc.QPNum != h.qpn {
		// Not a drain WR of this reaper (another reaper's on the same CQ,
		// or one no longer counted), or not from the QP it was posted on:
		// it proves nothing.
		r.stats.LateDrainWCs++
		return
	}
	r.untrack(wc.ID)
	if live := h.stage == stageFlush || h.stage == stageWait || h.stage == stageBarrier || h.stage == stageEmptyWait; !live {
		// Its QP was given up: the caller may have destroyed it, so its
		// drain WR orders nothing the reaper still relies on.
		r.stats.LateDrainWCs++
		return
	}
	seq := wc.ID &^ WRIDMask
	riders := 0
	for b := r.barrierList.head; b != nil && b.barrierAfter < seq && (r.opts.MaxBatch == 0 || riders < r.opts.MaxBatch); b = b.next {
		riders++
	}
	batch := riders
	if h.stage != stageBarrier {
		batch++
	}
	switch wc.ID {
	case h.recvID:
		h.recvID = 0
		h.step(Step{At: now, Kind: StepRecvDrainDone, WRID: wc.ID, Status: wc.Status})
		h.report.Recv = QueueProof{By: ProofRecvDrainWR, Carrier: h.qpn, WRID: wc.ID}
	case h.sendID:
		h.sendID = 0
		if h.stage != stageBarrier {
			h.step(Step{At: now, Kind: StepDrainDone, WRID: wc.ID, Status: wc.Status, Carrier: h.qpn})
			h.report.Batch = batch
			if h.report.Send.By == ProofNone {
				h.report.Send = QueueProof{By: ProofSendDrainWR, Carrier: h.qpn, WRID: wc.ID}
			}
			if h.srq && h.barrierAfter < seq {
				r.barrier(h, wc.ID, h.qpn)
			}
		}
	}
	switch h.stage {
	case stageWait:
		r.waitList.remove(h)
		r.place(h, now)
	case stageEmptyWait:
		if h.report.Proven() {
			r.emptyWaitList.remove(h)
			r.finish(h, Safe, nil, now)
		}
	}
	for range riders {
		b := r.barrierList.head
		r.barrierList.remove(b)
		b.step(Step{At: now, Kind: StepDrainDone, WRID: wc.ID, Status: wc.Status, Carrier: h.qpn})
		b.report.Batch = batch
		r.barrier(b, wc.ID, h.qpn)
		r.place(b, now)
	}
}

// barrier records that a drain WR posted after h became ready completed:
// with Last WQE Reached before it, that proves h's SRQ side.
func (r *Reaper) barrier(h *Handle, id uint64, carrier uint32) {
	h.barrierDone = true
	if h.lastWQE && h.report.Recv.By == ProofNone {
		h.report.Recv = QueueProof{By: ProofBarrier, Carrier: carrier, WRID: id, Stated: h.statedLastWQE()}
	}
}

func (h *Handle) statedLastWQE() bool {
	for _, s := range h.report.Steps {
		if s.Kind == StepEvent && s.Event == ibv.EventQPLastWQEReached {
			return false
		}
	}
	return true
}

// HandleEvent takes one async event from the caller's event loop. It
// returns true when the event concerns a QP being drained (the very QP
// object, not just its number; every such event is recorded in its
// report, and Last WQE Reached moves it on) or is a CQ error on the
// reaper's CQ, which fails every pending drain with ErrCQError. Other
// events are the caller's; the reaper remembers the Last WQE Reached
// among them of QPs in ERROR (Options.EventHistory) in case their QP is
// added later in the same error episode.
func (r *Reaper) HandleEvent(ev ibv.AsyncEvent) (claimed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	defer r.expire(now)
	r.eventsSeen++
	if ev.Type == ibv.EventCQErr && ev.CQ != nil && ev.CQ == r.cq {
		r.cqError(now)
		return true
	}
	if ev.QP == nil {
		return false
	}
	h := r.byNum[ev.QP.Num()]
	if h == nil || h.qp != ev.QP {
		if ev.Type == ibv.EventQPLastWQEReached && inError(ev.QP) {
			r.history.add(ev.QP, now)
		}
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
	switch h.stage {
	case stageAdding:
		h.lastWQE = true
	case stageError:
		h.lastWQE = true
		r.errorList.remove(h)
		r.ready(h, now)
		r.post(now)
	}
	// Later, the wait has stalled and the barriers already posted may
	// predate the event: it proves nothing any more.
	return true
}

// inError reports whether qp is in ERROR now. A Last WQE Reached handed
// over when its QP has left ERROR belongs to an episode that ended.
func inError(qp ibv.QP) bool {
	attr, _, err := qp.Query(ibv.QPAttrState)
	return err == nil && attr.State == ibv.QPSErr
}

// Forget drops the Last WQE Reached the reaper remembers of qp
// (Options.EventHistory). A remembered event belongs to the error episode
// it was raised in, and a move out of ERROR ends that episode; no verb
// tells the reaper of the move, so a caller that takes a QP out of ERROR
// (to RESET, to reuse it) while the reaper may remember its event calls
// Forget once the QP has left ERROR. Otherwise the next Add of that QP,
// found in ERROR, could take the old event as proof for the new episode,
// whose WQEs taken from the SRQ may still be flushing. An event handed to
// HandleEvent after the QP left ERROR is not remembered. Forget does
// nothing to a QP being drained.
func (r *Reaper) Forget(qp ibv.QP) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.history.take(qp)
}

func (r *Reaper) cqError(now time.Time) {
	r.cqErr = fmt.Errorf("%w (EventCQErr)", ErrCQError)
	for _, h := range r.byNum {
		if h.stage == stageQuarantine {
			continue
		}
		r.finish(h, Failed, fmt.Errorf("qpn %d: %w", h.qpn, r.cqErr), now)
	}
	// Nothing more will be polled from the CQ.
	clear(r.wrs)
	r.orphans, r.inFlight, r.newest = nil, 0, 0
}

// CQEmpty tells the reaper that the caller's poll of the CQ, just now,
// found no completion. Under DestroyWhenEmpty that proof releases the QPs
// whose drain stalled before the poll began; it also returns to the
// headroom the drain WRs of QPs given up before it, and lets QPs counting
// their receives added before it go on (AddOptions.CountRecvs). The poll
// counts as begun when the poll loop last called in (its previous
// HandleWC or CQEmpty), so that a poll begun before an Add or a stall on
// another goroutine never passes for a later one: a poll loop makes these
// calls from one goroutine, in order. Calling it also lets stall timeouts
// fire in a poll loop that nobody Waits on.
func (r *Reaper) CQEmpty() {
	r.mu.Lock()
	defer r.mu.Unlock()
	began := r.fed
	r.fed = time.Now()
	r.cqEmpty(began)
}

// cqEmpty applies a poll that started at polledAt and found nothing.
func (r *Reaper) cqEmpty(polledAt time.Time) {
	now := time.Now()
	r.pollGen++
	t := r.at(polledAt)
	for h := r.provingList.head; h != nil; {
		next := h.next
		if h.added < t {
			r.begin(h, true, now)
		}
		h = next
	}
	for h := r.emptyWaitList.head; h != nil; {
		next := h.next
		if h.stalledAt < t {
			r.emptyWaitList.remove(h)
			h.step(Step{At: now, Kind: StepCQEmpty})
			r.finish(h, DestroyedAfterEmptyCQ, nil, now)
		}
		h = next
	}
	i := 0
	for ; i < len(r.orphans) && r.orphans[i].at < t; i++ {
		r.untrack(r.orphans[i].id)
	}
	r.orphans = r.orphans[i:]
	r.expire(now)
}

// untrack stops counting a drain WR against the headroom.
func (r *Reaper) untrack(id uint64) {
	if _, ok := r.wrs[id]; ok {
		delete(r.wrs, id)
		r.inFlight--
		if id&^WRIDMask == r.newest {
			r.newest = 0
		}
	}
}

// expire applies the policy to every wait that has run out of time.
func (r *Reaper) expire(now time.Time) {
	t := r.at(now)
	for h := r.provingList.head; h != nil && h.deadline <= t; h = r.provingList.head {
		r.begin(h, false, now)
	}
	for h := r.errorList.head; h != nil && h.deadline <= t; h = r.errorList.head {
		r.errorList.remove(h)
		err := fmt.Errorf("qpn %d: %w within %v", h.qpn, ErrNoLastWQE, r.opts.LastWQETimeout)
		if r.eventsSeen == 0 && r.opts.Events == nil {
			err = fmt.Errorf("%w: no async event was delivered to the reaper (Options.Events unset, HandleEvent never called)", err)
		}
		if r.stall(h, err, now) {
			// The drain WR still orders everything the QP completed so
			// far; only the proof that nothing is left is missing.
			r.ready(h, now)
		}
	}
	for _, l := range [...]*list{&r.flushList, &r.waitList, &r.barrierList} {
		for h := l.head; h != nil && h.deadline <= t; h = l.head {
			l.remove(h)
			if r.stall(h, r.stallErr(h), now) {
				h.needSend, h.needRecv = false, false
				h.stage = stageEmptyWait
				r.emptyWaitList.push(h)
			}
		}
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
	case (h.needSend || h.needRecv) && h.full:
		return fmt.Errorf("qpn %d: %w: %w after every poll for %v", h.qpn, ErrPostDrain, ibv.ErrQueueFull, d)
	case h.needSend || h.needRecv:
		return fmt.Errorf("qpn %d: %w within %v: %d drain WRs outstanding, headroom %d", h.qpn, ErrNoHeadroom, d, r.inFlight, r.opts.Headroom)
	case h.countRecvs && h.recvsLeft > 0:
		return fmt.Errorf("qpn %d: %w: %d of %d back within %v", h.qpn, ErrRecvsMissing, h.report.Recv.Count, h.report.Recv.Count+h.recvsLeft, d)
	}
	return fmt.Errorf("qpn %d: %w: no barrier drain WR posted after Last WQE Reached completed within %v", h.qpn, ErrDrainNotFlushed, d)
}

// stall records that h's current step ran out of time and applies the
// policy. It returns true when the drain goes on (DestroyWhenEmpty); the
// caller, who knows the step, moves h on.
func (r *Reaper) stall(h *Handle, err error, now time.Time) bool {
	h.report.Stall = err
	h.step(Step{At: now, Kind: StepStall, Err: err})
	r.logf(h, "drain stalled: %v (policy %s)", err, r.opts.Policy)
	if r.opts.Policy == DestroyWhenEmpty {
		if !h.stalled {
			h.stalled, h.stalledAt = true, r.at(now)
		}
		return true
	}
	if r.quarantine.n >= r.opts.MaxQuarantine {
		r.finish(h, Failed, fmt.Errorf("%w (%d QPs): %w", ErrQuarantineFull, r.quarantine.n, err), now)
		return false
	}
	// A quarantined QP is kept, not given up: its drain WRs may still
	// complete, so they keep counting against the headroom until they do.
	// They are no barrier one can count on any more.
	if h.sendID&^WRIDMask == r.newest || h.recvID&^WRIDMask == r.newest {
		r.newest = 0
	}
	h.stage = stageQuarantine
	r.quarantine.push(h)
	r.stats.Quarantined++
	r.stats.Pending--
	r.conclude(h, Quarantined, fmt.Errorf("%w: %w", ErrQuarantined, err), now)
	return false
}

// giveUp hands h's drain WRs over with h to the caller, who may destroy
// it: they count against the headroom until they complete or a poll after
// now finds the CQ empty, after which no completion of theirs can sit in
// it or come from a destroyed QP.
func (r *Reaper) giveUp(h *Handle, now time.Time) {
	for _, id := range [...]uint64{h.sendID, h.recvID} {
		if id != 0 {
			if id&^WRIDMask == r.newest {
				r.newest = 0
			}
			r.orphans = append(r.orphans, orphan{id: id, at: r.at(now)})
		}
	}
	h.sendID, h.recvID = 0, 0
}

// finish gives h its outcome and forgets it.
func (r *Reaper) finish(h *Handle, o Outcome, err error, now time.Time) {
	if h.list != nil {
		h.list.remove(h)
	}
	// Its drain WRs keep their headroom until a poll after this one finds
	// the CQ empty: also under DestroyWhenEmpty, whose empty poll released
	// the QP but came before the caller could destroy it.
	r.giveUp(h, now)
	if r.byNum[h.qpn] == h {
		delete(r.byNum, h.qpn)
	}
	r.forget(h)
	h.stage = stageDone
	r.stats.Pending--
	r.conclude(h, o, err, now)
	switch h.report.Outcome {
	case Safe:
		r.stats.Safe++
	case DestroyedAfterEmptyCQ:
		r.stats.AfterEmptyCQ++
	default:
		r.stats.Failed++
	}
}

// forget drops the reaper's last reference to a handle it let go of.
func (r *Reaper) forget(h *Handle) {
	if r.lastWC == h {
		r.lastWC = nil
	}
}

// conclude records the outcome. It is the only place that sets one, and
// it turns a Safe without a proof for every queue into Failed: a safe
// report without proof cannot be produced.
func (r *Reaper) conclude(h *Handle, o Outcome, err error, now time.Time) {
	rep := &h.report
	if o == Safe && !rep.Proven() {
		o, err = Failed, fmt.Errorf("qpn %d: %w: a queue has no proof", h.qpn, ErrDrainNotFlushed)
	}
	if rep.Recv.By == ProofNone {
		switch {
		case h.srq && !h.lastWQE:
			rep.Recv.Missing = MissingLastWQE
		case h.srq:
			rep.Recv.Missing = MissingBarrier
		case h.countRecvs:
			rep.Recv.Missing = MissingRecvs
		default:
			rep.Recv.Missing = MissingRecvDrainWR
		}
	}
	if rep.Send.By == ProofNone {
		rep.Send.Missing = MissingSendDrainWR
	}
	rep.Outcome, rep.Err = o, err
	h.step(Step{At: now, Kind: StepOutcome, Outcome: o, Err: err})
	if o != Safe {
		r.logf(h, "drain ended: %s: %v", o, err)
	}
	h.ended = true
	if h.done != nil {
		close(h.done)
	}
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
	d := time.Duration(-1)
	for _, l := range [...]*list{&r.provingList, &r.errorList, &r.flushList, &r.waitList, &r.barrierList} {
		if h := l.head; h != nil && (d < 0 || h.deadline < d) {
			d = h.deadline
		}
	}
	if d < 0 {
		return time.Time{}
	}
	return r.epoch.Add(d)
}

// Stats returns the reaper's counters.
func (r *Reaper) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.stats
	st.InFlight = r.inFlight
	return st
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
	pending := make([]*Handle, 0, len(r.byNum))
	for _, h := range r.byNum {
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
	for _, h := range r.byNum {
		if h.stage != stageQuarantine {
			r.finish(h, Failed, fmt.Errorf("qpn %d: %w", h.qpn, ErrShutdown), now)
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
		if r.byNum[h.qpn] == h {
			delete(r.byNum, h.qpn)
		}
		r.forget(h)
		r.giveUp(h, now)
		r.stats.Quarantined--
		notSafe = append(notSafe, h)
	}
	return notSafe
}

// eventHistory remembers the Last WQE Reached of QPs not being drained,
// by QP object, the oldest dropped first once max are held.
type eventHistory struct {
	max  int
	at   map[ibv.QP]time.Time
	ring []ibv.QP
	next int
}

func (e *eventHistory) add(qp ibv.QP, at time.Time) {
	if e.max <= 0 {
		return
	}
	if e.at == nil {
		e.at = make(map[ibv.QP]time.Time)
	}
	if _, ok := e.at[qp]; ok {
		return
	}
	if len(e.ring) < e.max {
		e.ring = append(e.ring, qp)
	} else {
		delete(e.at, e.ring[e.next])
		e.ring[e.next] = qp
		e.next = (e.next + 1) % e.max
	}
	e.at[qp] = at
}

// take returns and forgets when qp's Last WQE Reached was seen.
func (e *eventHistory) take(qp ibv.QP) (time.Time, bool) {
	at, ok := e.at[qp]
	if ok {
		delete(e.at, qp)
	}
	return at, ok
}

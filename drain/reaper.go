package drain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/qpdrain/qpdrain/drain/report"
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
	// LateEvents counts events of quarantined QPs and of a drained QP's
	// earlier error episodes; LateDrainWCs, completions of drain WRs
	// given up on.
	LateEvents   int
	LateDrainWCs int
	// ForeignWCs counts completions Poll found that were not the reaper's
	// and that no Feed.OnWC took.
	ForeignWCs int
}

// orphan is a drain WR of a QP handed back and destroyed through its
// handle at at: counted against the headroom until a poll begun after at
// finds the CQ empty, since a completion generated before the destroy may
// still take a CQ slot, and none can be generated after.
type orphan struct {
	id uint64
	at time.Duration
}

// Reaper drains QPs that share one CQ, as IPoIB connected mode does, and
// declares a QP safe only once each of its queues is proven finished (see
// the package documentation for the proofs). QPs whose only open queue is
// their SRQ side share barrier drain WRs, one on each carrier at most;
// every other queue gets its own proof. At most Options.Headroom drain WRs
// are outstanding at once.
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
	byNum qpTable
	// lists holds the QPs of each stage that has a list, by stage (see
	// stage): lists[stageAdding] and lists[stageDone] stay empty.
	lists [numStages]list
	// Every drain WR counted against the headroom is either the sendID or
	// recvID of the handle byNum names for the QP it was posted on, or in
	// lost (with that QP's number): those of QPs handed back, of
	// quarantined QPs whose number now stands for another QP, and those
	// adopted from the ledger (NewReaper). orphans are those of lost whose
	// QP was destroyed through its handle, oldest first.
	lost     map[uint64]uint32
	orphans  []orphan
	inFlight int
	// adopted counts the drain WRs of lost that r adopted (NewReaper)
	// and that are still in the ledger, where Handle.Destroy marks them.
	adopted int
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
	wake       func()
	wakeAt     time.Time
	kicked     bool
	untilIdle  bool          // run returns once every QP added has an outcome (DrainAll)
	spinFor    time.Duration // a test's budget for Run's spin (spinFor), 0 for the default
	history    eventHistory
	eventsSeen int
	// lastWC is the handle of the last completion looked up, nil or
	// byNum[lastWC.qpn]; nextWC was the one after it on its list then.
	// Completions come in runs of one QP, often QP after QP in the order
	// they were added: the two hints save most lookups by number.
	lastWC, nextWC *Handle
	cqErr          error
	// shutting is set when Shutdown begins (Add refuses from then on),
	// shut when it ends (nothing is posted any more).
	shutting, shut bool
	stats          Stats
	cqOK           bool // cq can be compared (identifiable)
	// sole is the QP stated the only one ever on the CQ
	// (AddOptions.SoleQP), nil if none was; wcQPN is the number of the
	// first completion handed over that is no drain WR's, and wcMixed
	// says one of another number came too: what the reaper can check of
	// the statement.
	sole    ibv.QP
	wcQPN   uint32
	wcSeen  bool
	wcMixed bool
	// destroyMu serializes Handle.Destroy, whose verbs call runs without mu.
	destroyMu sync.Mutex
	// sendWR and recvWR are the one-WR lists of every drain WR post, kept
	// here so that a post allocates nothing (a provider copies the WRs it
	// takes). A WR list names one QP (ibv_post_send(3)) and every QP's
	// drain WR goes on its own queue, so there is nothing to chain.
	sendWR [1]ibv.SendWR
	recvWR [1]ibv.RecvWR
}

// NewReaper returns a reaper for the QPs that complete into cq. Every QP
// handed to it must use cq as both its send and its receive CQ, and cq
// must keep Options.Headroom slots for drain WRs, each QP's send queue one
// slot, and each QP with its own receive queue and no receive count one
// receive slot.
//
// A reaper made on a CQ value that reapers shut down before used counts
// the drain WRs they left outstanding (see Shutdown) against its own
// Options.Headroom, until they complete, or their QPs are destroyed through
// the handles Shutdown returned (Handle.Destroy) and a poll begun after
// that finds the CQ empty: the CQ keeps within Headroom across the
// replacement. It adopts what was left when it is made, so make it after
// its predecessor's Shutdown.
//
// The reaper tells QPs and CQs apart by identity (==): a QP's SendCQ and
// RecvCQ must return the very value cq is, and an async event must carry
// the very QP value handed to Add, so a wrapper must return the same
// value every time (a pointer, or a comparable struct around one). Add
// refuses, with ErrUnsupportedQP, a QP whose value cannot be compared.
//
// NewReaper fails with ErrUnsupportedQP when cq's value cannot be compared,
// and with ibv.ErrInvalidArgument, naming the option, for a nil cq, an
// unknown Policy, a negative bound, or a Headroom the CQ cannot hold.
func NewReaper(cq ibv.CQ, opts Options) (*Reaper, error) {
	if err := opts.check(cq); err != nil {
		return nil, fmt.Errorf("making a reaper: %w", err)
	}
	return newReaper(cq, opts), nil
}

// newReaper is NewReaper without its checks.
func newReaper(cq ibv.CQ, opts Options) *Reaper {
	o := opts.withDefaults()
	r := &Reaper{
		cq:      cq,
		opts:    o,
		epoch:   o.Clock.Now(),
		history: eventHistory{max: o.EventHistory},
		cqOK:    identifiable(cq),
	}
	for s := range r.lists {
		r.lists[s].of = stage(s)
	}
	r.adopt()
	return r
}

func (r *Reaper) at(now time.Time) time.Duration { return now.Sub(r.epoch) }

// Add starts draining qp: it moves qp to ERROR unless it is there already
// (through RTS first with Options.ViaRTS; for a QP counting its receives
// or sends and not stated the only one on the CQ, once a poll begun after
// Add found the CQ empty, see AddOptions.CountRecvs), waits (without blocking the caller) for Last WQE
// Reached if qp is attached to an SRQ, and posts the drain WRs its queues
// need. Add returns an error, and no handle, only
// when qp cannot be taken at all: ErrUnsupportedQP, ibv.ErrBusy for a QP
// already being drained, ibv.ErrInvalidArgument for AddOptions that cannot
// be honoured, ErrShutdown once Shutdown has begun, ErrCQError; every
// later failure is reported by the handle. A QP whose state is stated in
// ERROR (AddOptions.StateKnown) takes one lock round trip and no verbs
// call but its drain WRs' posts.
func (r *Reaper) Add(qp ibv.QP, o AddOptions) (*Handle, error) {
	var h *Handle
	var err error
	r.addAll([]ibv.QP{qp}, o, func(_ int, nh *Handle, e error) { h, err = nh, e })
	return h, err
}

// AddAll is Add of every QP of qps with the same AddOptions, in one pass,
// 64 QPs at a time: for each 64 the reaper's lock is taken once for the
// QPs stated in ERROR and twice for the others (before and after their
// moves to ERROR, which are made without it) and their drain WRs are
// posted; its table of QPs is sized for the batch, and a barrier drain WR
// for the SRQ sides that need one is posted once every QP is in. The
// handles of each 64 are one allocation, freed once none is referenced.
// hs[i] is qps[i]'s handle, nil when Add would have refused it; err joins
// the refusals, each naming its QP.
func (r *Reaper) AddAll(qps []ibv.QP, o AddOptions) (hs []*Handle, err error) {
	hs = make([]*Handle, len(qps))
	var errs []error
	r.addAll(qps, o, func(i int, h *Handle, e error) {
		hs[i] = h
		if e != nil {
			errs = append(errs, e)
		}
	})
	return hs, errors.Join(errs...)
}

// addChunk is how many QPs addAll takes in at a time, their drain WRs
// posted before the next ones come: their handles and QPs are still in
// the cache then, where a batch of thousands would have left it.
const addChunk = 64

// addAll adds qps and tells done each one's handle or refusal, addChunk
// QPs at a time.
func (r *Reaper) addAll(qps []ibv.QP, o AddOptions, done func(i int, h *Handle, err error)) {
	var hs [addChunk]*Handle
	var ms [addChunk]move
	for first := 0; first < len(qps); first += addChunk {
		n := min(addChunk, len(qps)-first)
		r.addSome(qps, first, o, hs[:n], ms[:n], done)
	}
}

// move is a QP's move to ERROR made without the reaper's lock (moveAll):
// whether it is to be made, and its steps, whether it found the QP in
// ERROR, and its error once made.
type move struct {
	do    bool
	found bool
	steps report.Log
	err   error
}

// addSome adds the len(hs) QPs of qps from first on; hs and ms are its
// room. It posts their drain WRs, and, once the last of qps is in, the
// barrier their SRQ sides may wait for, so that a batch shares one. Their
// handles are one allocation, and so are the steps of those that go on at
// once.
func (r *Reaper) addSome(qps []ibv.QP, first int, o AddOptions, hs []*Handle, ms []move, done func(i int, h *Handle, err error)) {
	now := r.opts.Clock.Now()
	// The numbers and error episodes first, in a loop of their own: they
	// are the first reads of their QP, often cache misses (on a soft QP
	// one each, as they are far apart), and the misses of a loop that
	// does nothing else overlap, where the checks and fills between them
	// would wait for each in turn.
	var nums [addChunk]uint32
	var resets [addChunk]uint64
	for i := range hs {
		if qp := qps[first+i]; qp != nil {
			nums[i], resets[i] = qp.Num(), qp.Resets()
		}
	}
	slab := make([]Handle, len(hs))
	for i := range hs {
		hs[i], ms[i] = &slab[i], move{}
		if err := r.newHandle(hs[i], qps[first+i], nums[i], resets[i], o, now); err != nil {
			hs[i] = nil
			done(first+i, nil, err)
		}
	}
	var room []byte
	toMove := 0
	r.mu.Lock()
	if first == 0 {
		r.byNum.reserve(len(qps), nums[:len(hs)])
	}
	for i, h := range hs {
		if h == nil {
			continue
		}
		if err := r.admit(h, now); err != nil {
			hs[i] = nil
			done(first+i, nil, err)
			continue
		}
		steps := h.firstSteps(&room, len(hs)-i)
		if h.stage != stageAdding {
			// Proving: only a poll moves it on, and its steps go in its
			// room then, with no log grown step by step.
			h.steps = steps
			continue
		}
		if ibv.QPState(h.given) == ibv.QPSErr {
			var found bool
			var err error
			found, err = r.moveToError(h, now, &steps) // the first: nothing came before
			h.steps = steps
			r.started(h, found, err, now)
			continue
		}
		ms[i] = move{do: true, steps: steps}
		toMove++
	}
	if toMove > 0 {
		now = r.moveAll(hs, ms, now)
	}
	if first+len(hs) == len(qps) {
		r.post(now)
	} else {
		r.postFlush(now)
	}
	r.wakeForDeadline()
	r.mu.Unlock()
	for i, h := range hs {
		if h != nil {
			done(first+i, h, nil)
		}
	}
}

// moveAll makes the moves to ERROR of hs that ms says to make (their steps
// dated began) without r.mu, which the caller holds, then goes on with
// their drains under it and returns the time it took it back.
func (r *Reaper) moveAll(hs []*Handle, ms []move, began time.Time) time.Time {
	r.mu.Unlock()
	for i, h := range hs {
		if ms[i].do {
			ms[i].found, ms[i].err = r.moveToError(h, began, &ms[i].steps)
		}
	}
	r.mu.Lock()
	now := r.opts.Clock.Now()
	for i, h := range hs {
		if !ms[i].do {
			continue
		}
		// Completions and events that arrived during the modify were
		// caused by it: the transitions go first.
		h.steps.Insert(ms[i].steps)
		r.started(h, ms[i].found, ms[i].err, now)
	}
	return now
}

// newHandle checks what Add can check of qp (its number qpn, its error
// episode resets) and o without the lock and makes h, zero, qp's handle.
func (r *Reaper) newHandle(h *Handle, qp ibv.QP, qpn uint32, resets uint64, o AddOptions, now time.Time) error {
	if qp == nil {
		return fmt.Errorf("adding a nil QP: %w", ibv.ErrInvalidArgument)
	}
	switch {
	case !r.cqOK:
		return fmt.Errorf("qpn %d: the reaper's CQ, a %T, cannot be compared, and the reaper tells CQs apart by identity: %w", qpn, r.cq, ErrUnsupportedQP)
	case !identifiable(qp):
		return fmt.Errorf("qpn %d: a %T cannot be compared, and the reaper tells QPs apart by identity: %w", qpn, qp, ErrUnsupportedQP)
	}
	if t := qp.Type(); t != ibv.QPTRC && t != ibv.QPTUC {
		return fmt.Errorf("qpn %d is a %s QP: %w", qpn, t, ErrUnsupportedQP)
	}
	if qp.SendCQ() != r.cq || qp.RecvCQ() != r.cq {
		return fmt.Errorf("qpn %d does not complete into the reaper's CQ on both queues: %w", qpn, ErrUnsupportedQP)
	}
	srq := qp.SRQ() != nil
	for _, c := range [...]struct {
		on   bool
		n    int
		what string
	}{{o.CountRecvs && !srq, o.Recvs, "receives"}, {o.CountSends, o.Sends, "sends"}} {
		if c.on && (r.opts.Queue == nil || c.n < 0 || uint64(c.n) > math.MaxUint32) {
			return fmt.Errorf("qpn %d: counting %d %s needs a count a queue can hold (0 to 2^32-1) and Options.Queue: %w", qpn, c.n, c.what, ibv.ErrInvalidArgument)
		}
	}
	if o.StateKnown && o.State > ibv.QPSErr {
		return fmt.Errorf("qpn %d: stated state %s is not a QP state: %w", qpn, o.State, ibv.ErrInvalidArgument)
	}
	// Field by field: h is zero, and a struct assigned whole would be
	// cleared again first.
	h.r, h.qp, h.qpn, h.given = r, qp, qpn, uint8(ibv.QPSUnknown)
	if resets != 0 {
		h.ext().resets = resets // not yet shared: no lock needed
	}
	h.srq, h.lastWQE, h.stated = srq, srq && o.LastWQESeen, o.LastWQESeen
	// Sends 0 counted is the statement NoSends makes: one proof for it.
	h.noSends = o.NoSends || o.CountSends && o.Sends == 0
	if o.StateKnown {
		h.given = uint8(o.State)
	}
	h.report.start = r.at(now)
	// Not yet shared: the handleExt needs no lock.
	if o.CountRecvs && !srq {
		h.countRecvs, h.recvsLeft = true, uint32(o.Recvs)
		if o.Recvs == 0 {
			h.report.recv.by = report.ProofRecvCount
		}
	}
	if o.CountSends && !h.noSends {
		on, left, _ := h.counter(countSend)
		*on, *left = true, uint32(o.Sends)
	}
	if o.SoleQP {
		h.ext().sole = true
	}
	return nil
}

// admit enters h under r.mu: its QP number names it from now on, so that
// the flushes and events its move to ERROR causes are attributed to it
// even if another goroutine polls them before Add returns. A QP counting
// its receives or sends is left proving, unless it is stated the only QP
// on the CQ (AddOptions.SoleQP); every other one is left adding.
func (r *Reaper) admit(h *Handle, now time.Time) error {
	qpn := h.qpn
	slot, old := r.byNum.slot(qpn) // one probe finds the old entry and the new one's slot
	switch {
	case r.shutting:
		return fmt.Errorf("adding qpn %d: %w", qpn, ErrShutdown)
	case r.cqErr != nil:
		return fmt.Errorf("adding qpn %d: %w", qpn, r.cqErr)
	case old != nil && old.qp == h.qp:
		return fmt.Errorf("qpn %d is already being drained: %w", qpn, ibv.ErrBusy)
	case old != nil && old.stage != stageQuarantine:
		return fmt.Errorf("qpn %d names another QP still being drained: %w", qpn, ibv.ErrBusy)
	case r.sole != nil && r.sole != h.qp:
		return fmt.Errorf("adding qpn %d: qpn %d was stated the only QP on the CQ (AddOptions.SoleQP): %w", qpn, r.sole.Num(), ErrNotSoleQP)
	case h.sole() && r.sole == nil && (r.stats.Added > 0 || r.wcMixed || r.wcSeen && r.wcQPN != qpn):
		return fmt.Errorf("qpn %d stated the only QP on the CQ (AddOptions.SoleQP), but the reaper has seen another QP on it: %w", qpn, ErrNotSoleQP)
	}
	if h.sole() {
		r.sole = h.qp
	}
	// A quarantined QP that had this number was destroyed by its owner
	// and the number reused: it keeps its place in the quarantine (and its
	// drain WRs their headroom), and the number now stands for the new QP.
	if old != nil {
		r.displace(old)
	}
	r.byNum.put(slot, old, h)
	r.stats.Added++
	r.stats.Pending++
	if h.countsLeft() && !h.sole() {
		// A count goes by QP number, and an earlier QP with this number,
		// destroyed before this one was created, may have left
		// completions in the CQ. They are all there by now, so a poll
		// begun after this moment that finds the CQ empty is past them:
		// until then the QP stays as it is and counts nothing. A QP
		// stated the only one ever on the CQ had no such predecessor.
		h.stage = stageProving
		h.deadline = r.at(now) + r.opts.DrainTimeout // added(): the deadline gives when
		r.lists[stageProving].push(h)
		// Only a poll moves this QP on: Run must not sleep on its channel.
		// One wake ends the wait: none more for the rest of the batch.
		r.kicked = true
		if r.wake != nil {
			r.wake()
			r.wake = nil
		}
	}
	return nil
}

// begin starts the drain of a QP counting its receives or sends: proven,
// once a poll found the CQ past the completions of earlier QPs with its
// number, and none with its number came meanwhile; else at its deadline.
// A completion with its number before the proof may be an earlier QP's or
// its own, which the count cannot tell apart, so then drain WRs prove the
// counted queues instead (a count of none stays: no completion can make it
// pass falsely). The move to ERROR is made under r.mu, so nothing comes
// between it and its steps.
func (r *Reaper) begin(h *Handle, proven bool, now time.Time) {
	r.lists[stageProving].remove(h)
	if proven && !h.unsure {
		h.step(now, &report.Step{Kind: report.StepCQEmpty})
	} else {
		for c := range numCounters {
			if on, left, _ := h.counter(c); *left > 0 {
				*on, *left = false, 0
			}
		}
		h.step(now, &report.Step{Kind: report.StepCountNotTrusted})
	}
	h.stage = stageAdding
	var found bool
	var err error
	found, err = r.moveToError(h, now, &h.steps)
	r.started(h, found, err, now)
}

// started goes on with h's drain once the move to ERROR is done: err is
// its error, found says it found the QP in ERROR.
func (r *Reaper) started(h *Handle, found bool, err error, now time.Time) {
	switch {
	case h.stage != stageAdding:
		// A CQ error or shutdown ended the drain meanwhile.
		return
	case err != nil:
		r.finish(h, report.Failed, fmt.Errorf("qpn %d: %w: %w", h.qpn, ErrModifyToError, err), now)
		return
	}
	switch {
	case h.noSends:
		h.report.send.by = report.ProofNoSends
	case !h.counting(countSend):
		h.needSend = true
	}
	if h.sole() && h.counted() {
		h.step(now, &report.Step{Kind: report.StepSoleQPStated})
	}
	switch {
	case h.srq:
		if at, ok := r.history.take(h.qp, h.resets()); ok && found && !h.lastWQE {
			h.lastWQE = true
			h.step(at, &report.Step{Kind: report.StepLastWQEStated, Count: 1})
		} else if h.stated {
			h.step(now, &report.Step{Kind: report.StepLastWQEStated})
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
		r.lists[stageError].push(h)
	} else {
		r.ready(h, now)
	}
}

// moveToError moves h's QP to ERROR unless it is there, through RTS when
// Options.ViaRTS asks it of a QP in RTR, and returns steps with the
// transitions appended (Handle.firstSteps) and whether it found the QP in
// ERROR; h's own steps it leaves alone, as moveAll calls it without r.mu.
// It queries the state only when AddOptions did not state it.
func (r *Reaper) moveToError(h *Handle, began time.Time, steps *report.Log) (bool, error) {
	qp, from := h.qp, ibv.QPState(h.given)
	if from == ibv.QPSUnknown {
		attr, _, err := qp.Query(ibv.QPAttrState)
		if err != nil {
			h.transition(steps, began, ibv.QPSUnknown, ibv.QPSErr)
			return false, fmt.Errorf("querying the state: %w", err)
		}
		from = attr.State
	}
	if from == ibv.QPSErr {
		h.transition(steps, began, from, ibv.QPSErr)
		return true, nil
	}
	if from == ibv.QPSRTR && r.opts.ViaRTS {
		// The attributes RTR -> RTS requires (IBTA Table 91); their values
		// do not matter to a QP about to enter ERROR.
		rts := ibv.QPAttr{State: ibv.QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1}
		mask := ibv.QPAttrState | ibv.QPAttrTimeout | ibv.QPAttrRetryCnt | ibv.QPAttrRNRRetry | ibv.QPAttrSQPSN | ibv.QPAttrMaxQPRdAtomic
		h.transition(steps, began, from, ibv.QPSRTS)
		if err := qp.Modify(rts, mask); err != nil {
			return false, fmt.Errorf("modifying RTR -> RTS: %w", err)
		}
		from = ibv.QPSRTS
	}
	h.transition(steps, began, from, ibv.QPSErr)
	if err := qp.Modify(ibv.QPAttr{State: ibv.QPSErr}, ibv.QPAttrState); err != nil {
		return false, fmt.Errorf("modifying %s -> ERR: %w", from, err)
	}
	return false, nil
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
		r.lists[stageFlush].push(h)
	case h.sendID != 0 || h.recvID != 0 || h.countsLeft():
		h.stage = stageWait
		r.lists[stageWait].push(h)
	case h.srq && h.report.recv.by == report.ProofNone && !h.barrierDone:
		h.stage = stageBarrier
		r.lists[stageBarrier].push(h)
	case h.report.proven():
		r.finish(h, report.Safe, nil, now)
	case h.stalled():
		// DestroyWhenEmpty, after its drain WRs: an empty poll releases it.
		r.waitEmpty(h, now)
	default:
		// Not reachable: every open queue above has something to wait
		// for. Should it happen, the QP is not safe.
		r.finish(h, report.Failed, fmt.Errorf("qpn %d: %w: nothing left that could prove it", h.qpn, ErrDrainNotFlushed), now)
	}
}

// HandleWC takes one completion from the caller's poll loop. It returns
// true when the completion is a drain WR's, which the reaper consumes; the
// caller keeps every other one (the reaper only counts, for the reports
// and AddOptions.CountRecvs and CountSends, those of QPs it drains).
// Options.Queue, if set, is called under the reaper's lock.
func (r *Reaper) HandleWC(wc ibv.WC) (claimed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.opts.Clock.Now()
	r.fed = now
	claimed, _ = r.handleWC([]ibv.WC{wc}, now)
	r.expire(now)
	return claimed
}

// handleWC takes the first completion of wcs, not empty, and those after
// it in a run of the same QP's that it counts with it: a poll finds a QP's
// flushes together, and one lookup serves them all. It returns whether
// they are a drain WR's (only ever one) and how many it took.
func (r *Reaper) handleWC(wcs []ibv.WC, now time.Time) (claimed bool, n int) {
	r.pollGen++
	wc := &wcs[0]
	if IsDrainWRID(wc.ID) {
		r.drainWC(*wc, now)
		return true, 1
	}
	r.sawWC(wc.QPNum, now)
	h := r.lookup(wc.QPNum)
	if h == nil {
		return false, 1
	}
	switch h.stage {
	case stageQuarantine:
		return false, 1
	case stageProving:
		h.unsure = true
		return false, 1
	}
	return false, r.count(h, wcs, now)
}

// sawWC notes a completion of QP number qpn that is no drain WR's. One of
// another number than a QP stated the only one on the CQ
// (AddOptions.SoleQP) proves the statement false: that QP's counts prove
// nothing, and its drain fails if it has not ended (an earlier QP's
// completions come before a later one's, so a stale one usually shows
// before the count is met, unless its QP had the same number, which
// nothing can tell).
func (r *Reaper) sawWC(qpn uint32, now time.Time) {
	switch {
	case !r.wcSeen:
		r.wcSeen, r.wcQPN = true, qpn
	case qpn != r.wcQPN:
		r.wcMixed = true
	}
	if r.sole == nil || qpn == r.sole.Num() {
		return
	}
	if h := r.byNum.get(r.sole.Num()); h != nil && h.qp == r.sole && h.stage != stageQuarantine && h.counted() {
		r.finish(h, report.Failed, fmt.Errorf("qpn %d: %w: a completion of qpn %d came", h.qpn, ErrNotSoleQP, qpn), now)
	}
}

// lookup returns the handle the QP number qpn stands for, nil if none.
// The hints go first (lastWC, nextWC). A handle that was on a list is
// byNum's until it is finished or quarantined (a quarantined QP's number
// may stand for another QP now).
func (r *Reaper) lookup(qpn uint32) *Handle {
	if h := r.lastWC; h != nil && h.qpn == qpn {
		return h
	}
	h := r.nextWC
	if h == nil || h.qpn != qpn || h.stage == stageDone || h.stage == stageQuarantine {
		if h = r.byNum.get(qpn); h == nil {
			return nil
		}
	}
	r.lastWC, r.nextWC = h, h.links.Next()
	return h
}

// count records the completions of h, a QP being drained, at the front of
// wcs, up to the first of another QP or a drain WR's, and returns how many
// it took: it stops after one that moved h on (the last of a count) or
// ended its drain (one more than counted).
func (r *Reaper) count(h *Handle, wcs []ibv.WC, now time.Time) int {
	at := r.at(now) - h.report.start
	if r.opts.Queue == nil {
		// One queue for all, and nothing counted (AddOptions.CountRecvs
		// and CountSends need Options.Queue): the run at once.
		return h.tally(report.QueueUnknown, wcs, at, now)
	}
	for i := range wcs {
		if i > 0 && (wcs[i].QPNum != h.qpn || IsDrainWRID(wcs[i].ID)) {
			return i
		}
		q := r.opts.Queue(wcs[i])
		h.tally(q, wcs[i:i+1], at, now)
		c, ok := counter(q)
		if !ok || !h.counting(c) {
			continue
		}
		_, left, back := h.counter(c)
		if *left == 0 {
			// The queue completes more than the caller said it would:
			// the count, and any proof it gave, is wrong.
			*h.report.counted(c) = proof{missing: report.MissingCountExceeded}
			*back++
			r.finish(h, report.Failed, fmt.Errorf("qpn %d: %w: %d %s counted, %d back", h.qpn, ErrCountExceeded,
				*back-1, countWhat[c], *back), now)
			return i + 1
		}
		*left--
		*back++
		if *left == 0 {
			*h.report.counted(c) = proof{by: countProof[c], stated: h.sole()}
			if h.stage == stageWait {
				r.lists[stageWait].remove(h)
				r.place(h, now)
				return i + 1
			}
		}
	}
	return len(wcs)
}

// drainWC takes a drain WR's completion: the proof of the queue it was
// posted on and, wherever it was posted, a barrier for every SRQ side that
// became ready before it was posted.
func (r *Reaper) drainWC(wc ibv.WC, now time.Time) {
	h := r.lookup(wc.QPNum)
	if h == nil || wc.ID != h.sendID && wc.ID != h.recvID {
		// Not a drain WR of this reaper (another reaper's on the same CQ,
		// or one no longer counted), one of a QP given up, or not from
		// the QP it was posted on: it proves nothing.
		if qpn, ok := r.lost[wc.ID]; ok && qpn == wc.QPNum {
			r.untrack(wc.ID)
		} else if r.cqOK {
			// One a reaper left at Shutdown that none adopted: it takes
			// no slot any more, whichever reaper was handed it.
			r.dropLeft(wc.ID, wc.QPNum, nil)
		}
		r.stats.LateDrainWCs++
		return
	}
	r.release(wc.ID)
	if live := h.stage == stageFlush || h.stage == stageWait || h.stage == stageBarrier || h.stage == stageEmptyWait; !live {
		// Its QP is quarantined: the caller may destroy it, so its drain
		// WR orders nothing the reaper still relies on.
		if wc.ID == h.sendID {
			h.sendID = 0
		} else {
			h.recvID = 0
		}
		r.stats.LateDrainWCs++
		return
	}
	seq := wc.ID &^ WRIDMask
	riders := 0
	for b := r.lists[stageBarrier].Front(); b != nil && b.barrierAfter < seq && (r.opts.MaxBatch == 0 || riders < r.opts.MaxBatch); b = b.links.Next() {
		riders++
	}
	batch := riders
	if h.stage != stageBarrier {
		batch++
	}
	switch wc.ID {
	case h.recvID:
		h.recvID = 0
		h.step(now, &report.Step{Kind: report.StepRecvDrainDone, WRID: wc.ID, Status: wc.Status})
		h.report.recv = proof{by: report.ProofRecvDrainWR, carrier: h.qpn, wrid: wc.ID}
	case h.sendID:
		h.sendID = 0
		if h.stage != stageBarrier {
			h.step(now, &report.Step{Kind: report.StepDrainDone, WRID: wc.ID, Status: wc.Status, Carrier: h.qpn})
			h.report.batch = uint32(batch)
			if h.report.send.by == report.ProofNone {
				h.report.send = proof{by: report.ProofSendDrainWR, carrier: h.qpn, wrid: wc.ID}
			}
			if h.srq && h.barrierAfter < seq {
				r.barrier(h, wc.ID, h.qpn)
			}
		}
	}
	switch h.stage {
	case stageWait:
		r.lists[stageWait].remove(h)
		r.place(h, now)
	case stageEmptyWait:
		if h.report.proven() {
			r.lists[stageEmptyWait].remove(h)
			r.finish(h, report.Safe, nil, now)
		}
	}
	for range riders {
		b := r.lists[stageBarrier].Front()
		r.lists[stageBarrier].remove(b)
		b.step(now, &report.Step{Kind: report.StepDrainDone, WRID: wc.ID, Status: wc.Status, Carrier: h.qpn})
		b.report.batch = uint32(batch)
		r.barrier(b, wc.ID, h.qpn)
		r.place(b, now)
	}
}

// barrier records that a drain WR posted after h became ready completed:
// with Last WQE Reached before it, that proves h's SRQ side.
func (r *Reaper) barrier(h *Handle, id uint64, carrier uint32) {
	h.barrierDone = true
	if h.lastWQE && h.report.recv.by == report.ProofNone {
		h.report.recv = proof{by: report.ProofBarrier, carrier: carrier, wrid: id, stated: !h.sawLastWQE}
	}
}

// HandleEvent takes one async event from the caller's event loop. It
// returns true when the event concerns a QP being drained (the very QP
// object, not just its number) or is a CQ error on the reaper's CQ, which
// fails every pending drain with ErrCQError. An event of the drained QP's
// error episode (ibv.AsyncEvent.QPResets) is recorded in its report, and
// Last WQE Reached moves it on; one raised in an earlier episode, however
// late the loop hands it over, is counted (Stats.LateEvents) and proves
// nothing. Other events are the caller's; the reaper remembers the Last
// WQE Reached among them (Options.EventHistory) in case their QP is added
// later in the same error episode.
func (r *Reaper) HandleEvent(ev ibv.AsyncEvent) (claimed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.opts.Clock.Now()
	defer r.expire(now)
	r.eventsSeen++
	if ev.Type == ibv.EventCQErr && ev.CQ != nil && r.cqOK && identifiable(ev.CQ) && ev.CQ == r.cq {
		r.cqError(now)
		return true
	}
	if ev.QP == nil || !identifiable(ev.QP) {
		// Add refused every QP whose value cannot be compared.
		return false
	}
	h := r.byNum.get(ev.QP.Num())
	if h == nil || h.qp != ev.QP {
		if ev.Type == ibv.EventQPLastWQEReached {
			r.history.add(ev.QP, ev.QPResets, now)
		}
		return false
	}
	if h.stage == stageQuarantine || ev.QPResets != h.resets() {
		// A quarantined QP's, or one raised in an earlier error episode
		// of the QP and handed over only now (an event loop that lags).
		r.stats.LateEvents++
		return true
	}
	h.step(now, &report.Step{Kind: report.StepEvent, Event: ev.Type})
	if ev.Type != ibv.EventQPLastWQEReached {
		return true
	}
	h.sawLastWQE = true
	if h.lastWQE {
		r.stats.RepeatedLastWQE++
		return true
	}
	switch h.stage {
	case stageAdding:
		h.lastWQE = true
	case stageError:
		h.lastWQE = true
		r.lists[stageError].remove(h)
		r.ready(h, now)
		r.post(now)
	}
	// Later, the wait has stalled and the barriers already posted may
	// predate the event: it proves nothing any more.
	return true
}

func (r *Reaper) cqError(now time.Time) {
	r.cqErr = fmt.Errorf("%w (EventCQErr)", ErrCQError)
	for _, h := range r.byNum.all() {
		if h.stage == stageQuarantine {
			continue
		}
		r.finish(h, report.Failed, fmt.Errorf("qpn %d: %w", h.qpn, r.cqErr), now)
	}
	// Nothing more will be polled from the CQ.
	for h := r.lists[stageQuarantine].Front(); h != nil; h = h.links.Next() {
		h.sendID, h.recvID = 0, 0
	}
	for id := range r.lost {
		r.untrack(id)
	}
	r.orphans, r.inFlight, r.newest = nil, 0, 0
}

// CQEmpty tells the reaper that the caller's poll of the CQ, just now,
// found no completion. Under DestroyWhenEmpty that proof releases the QPs
// whose drain stalled before the poll began; it also returns to the
// headroom the drain WRs of QPs destroyed through their handles before it
// began, and lets QPs counting their receives or sends added before it go
// on (AddOptions.CountRecvs). The poll counts as begun when the poll loop
// last called in (its previous HandleWC or CQEmpty), so that a poll begun
// before an Add, a stall or a destroy on another goroutine never passes
// for a later one: a poll loop makes these calls from one goroutine, in
// order. Calling it also lets stall timeouts fire in a poll loop that
// nobody Waits on.
func (r *Reaper) CQEmpty() {
	r.mu.Lock()
	defer r.mu.Unlock()
	began := r.fed
	r.fed = r.opts.Clock.Now()
	r.cqEmpty(began)
}

// cqEmpty applies a poll that started at polledAt and found nothing.
func (r *Reaper) cqEmpty(polledAt time.Time) {
	now := r.opts.Clock.Now()
	r.pollGen++
	t := r.at(polledAt)
	for h := r.lists[stageProving].Front(); h != nil; {
		next := h.links.Next()
		if h.added() < t {
			r.begin(h, true, now)
		}
		h = next
	}
	for h := r.lists[stageEmptyWait].Front(); h != nil; {
		next := h.links.Next()
		if h.x.stalledAt < t {
			r.lists[stageEmptyWait].remove(h)
			h.step(now, &report.Step{Kind: report.StepCQEmpty})
			r.finish(h, report.DestroyedAfterEmptyCQ, nil, now)
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

// finish gives h its outcome and forgets it.
func (r *Reaper) finish(h *Handle, o report.Outcome, err error, now time.Time) {
	if l := r.listOf(h.on); l != nil {
		l.remove(h)
	}
	// Its drain WRs keep their headroom until the caller destroys the QP
	// and a poll after that finds the CQ empty: also under
	// DestroyWhenEmpty, whose empty poll released the QP but came before
	// the caller could destroy it.
	r.giveUp(h)
	// Only a quarantined QP's number can stand for another QP, and a
	// quarantined QP is not finished.
	r.byNum.del(h.qpn)
	r.forget(h)
	h.stage = stageDone
	r.stats.Pending--
	r.conclude(h, o, err, now)
	switch h.outcome {
	case report.Safe:
		r.stats.Safe++
	case report.DestroyedAfterEmptyCQ:
		r.stats.AfterEmptyCQ++
	default:
		r.stats.Failed++
	}
}

// forget drops the hint to a handle whose number no longer stands for it.
func (r *Reaper) forget(h *Handle) {
	if r.lastWC == h {
		r.lastWC = nil
	}
}

// displace lets go of a quarantined QP whose number now stands for
// another QP: its drain WRs still outstanding are counted in r.lost.
func (r *Reaper) displace(q *Handle) {
	for _, id := range [...]uint64{q.sendID, q.recvID} {
		if id != 0 {
			r.loseWR(id, q.qpn)
		}
	}
	q.sendID, q.recvID = 0, 0
	r.forget(q)
}

// conclude records the outcome. It is the only place that sets one, and
// it turns a Safe without a proof for every queue into Failed: a safe
// report without proof cannot be produced.
func (r *Reaper) conclude(h *Handle, o report.Outcome, err error, now time.Time) {
	rep := &h.report
	if o == report.Safe && !rep.proven() {
		o, err = report.Failed, fmt.Errorf("qpn %d: %w: a queue has no proof", h.qpn, ErrDrainNotFlushed)
	}
	if rep.recv.by == report.ProofNone && rep.recv.missing == report.MissingNothing {
		switch {
		case h.srq && !h.lastWQE:
			rep.recv.missing = report.MissingLastWQE
		case h.srq:
			rep.recv.missing = report.MissingBarrier
		case h.countRecvs:
			rep.recv.missing = report.MissingRecvs
		default:
			rep.recv.missing = report.MissingRecvDrainWR
		}
	}
	if rep.send.by == report.ProofNone && rep.send.missing == report.MissingNothing {
		rep.send.missing = report.MissingSendDrainWR
		if h.counting(countSend) {
			rep.send.missing = report.MissingSends
		}
	}
	h.outcome = o
	if err != nil || h.x != nil {
		h.ext().err = err
	}
	h.step(now, &report.Step{Kind: report.StepOutcome, Outcome: o, Err: err})
	if o != report.Safe {
		r.debug(h, "drain ended", slog.Any("outcome", o), slog.Any("error", err))
	}
	h.ended = true
	if h.x != nil && h.x.done != nil {
		close(h.x.done)
	}
	if r.idle() && r.wake != nil {
		// The last outcome came from another goroutine (an async event's)
		// while run slept: it has nothing more to do.
		r.wake()
		r.wake = nil
	}
}

// debug logs msg about h's QP at debug level, its number first, named as
// rdma(8) names it. The record is built only when Log takes debug records,
// so that a reaper without a logger allocates nothing for it.
func (r *Reaper) debug(h *Handle, msg string, attrs ...slog.Attr) {
	l := r.opts.Log
	if l == nil || !l.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	l.LogAttrs(context.Background(), slog.LevelDebug, msg, append([]slog.Attr{slog.Uint64("lqpn", uint64(h.qpn))}, attrs...)...)
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
	out := make([]*Handle, 0, r.lists[stageQuarantine].Len())
	for h := r.lists[stageQuarantine].Front(); h != nil; h = h.links.Next() {
		out = append(out, h)
	}
	return out
}

// Shutdown ends the reaper. From the moment it begins Add refuses every
// QP with ErrShutdown, so that none can come in behind the list it
// returns. It waits until every pending drain has an outcome or ctx ends
// (the caller's poll loop, or Run, must keep feeding the reaper
// meanwhile), then fails what is still pending with ErrShutdown, empties
// the quarantine and returns every QP that is not safe to destroy and that
// no outcome handed back before: each QP pending or quarantined when
// Shutdown began that did not end Safe or DestroyedAfterEmptyCQ (it was
// failed during the wait or by the shutdown, or quarantined). A QP whose
// drain failed before Shutdown began was handed back by its outcome and is
// not listed. What to do with them is the caller's call (IPoIB-CM, at
// device stop, destroys them after 5 s); a QP is destroyed through its
// handle (Handle.Destroy). The drain WRs the reaper still counts, of the
// QPs it hands back and of those handed back before and not yet past an
// empty poll after their destroy, it leaves to the next reaper made on its
// CQ (NewReaper), which counts them against its headroom; Stats.InFlight
// drops to 0.
func (r *Reaper) Shutdown(ctx context.Context) []*Handle {
	r.mu.Lock()
	r.shutting = true
	pending := slices.DeleteFunc(r.byNum.all(), func(h *Handle) bool { return h.stage == stageQuarantine })
	r.mu.Unlock()
	for _, h := range pending {
		if _, err := h.Wait(ctx); err != nil && ctx.Err() != nil {
			break
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.shut = true
	now := r.opts.Clock.Now()
	for _, h := range r.byNum.all() {
		if h.stage != stageQuarantine {
			r.finish(h, report.Failed, fmt.Errorf("qpn %d: %w", h.qpn, ErrShutdown), now)
		}
	}
	var notSafe []*Handle
	for _, h := range pending {
		if h.outcome == report.Failed {
			notSafe = append(notSafe, h)
		}
	}
	for r.lists[stageQuarantine].Len() > 0 {
		h := r.lists[stageQuarantine].Front()
		r.lists[stageQuarantine].remove(h)
		if r.byNum.get(h.qpn) == h {
			r.byNum.del(h.qpn)
		}
		r.forget(h)
		r.giveUp(h)
		h.stage = stageDone // handed back: Destroy may destroy it
		r.stats.Quarantined--
		notSafe = append(notSafe, h)
	}
	r.leave()
	return notSafe
}

// identifiable reports whether v can be compared with ==, which the
// reaper's identity rules and its maps keyed by QP need: a comparison of
// two values of one type that cannot be compared panics.
func identifiable(v any) bool {
	if v == nil {
		return false
	}
	// A pointer always can, and needs no look at the value: every QP of
	// a batch is asked.
	return reflect.TypeOf(v).Kind() == reflect.Pointer || reflect.ValueOf(v).Comparable()
}

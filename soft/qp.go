package soft

import (
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/ibv/objtrace"
)

// QP is an RC queue pair of a soft device.
type QP struct {
	dev    *Device
	pd     *PD
	num    uint32
	seq    uint64 // creation order on the device
	sendCQ *CQ
	recvCQ *CQ
	srq    *SRQ
	cap    ibv.QPCap
	sigAll bool
	rec    *objtrace.Record

	// Guarded by dev.fab.mu.
	closed bool
	state  ibv.QPState
	attr   ibv.QPAttr // attributes set by Modify
	// resets counts the moves to RESET (Resets), read without the lock.
	resets atomic.Uint64
	// epoch changes whenever the send queue is dropped (ERROR, RESET,
	// Close), invalidating the fabric's queued entries for this QP.
	epoch      uint32
	sq         ring[sendWQE] // posted, not yet completed
	rq         ring[recvWQE] // own receive queue (no SRQ)
	taken      ring[recvWQE] // WQEs taken ahead from the SRQ (Config.SRQPrefetch)
	inBlocked  bool          // listed in fab.blocked
	reachedRTS bool          // was in RTS since the last RESET (quirk DrainNeedsRTS)
	// lastWQE: Last WQE Reached was raised in this ERROR episode (or
	// withheld by quirk NoLastWQEReached), not just due (lwrDue).
	lastWQE bool
	// flushPending: in ERROR, the flush not yet run (Quirks.FlushDeferred).
	flushPending bool
	peer         *QP // cached responder, valid while peerGen == fab.gen
	peerGen      uint64
	// Slots in use: a WR holds one from its post until its completion, or
	// the later completion that covers it (unsignaled sends), is polled.
	sqUsed, rqUsed uint32
	sqUnsig        uint32 // sends completed silently since the last send completion
	// Adversarial schedule: how many WQEs at the head of the send queue
	// and of the receive side (taken, then own) are due for a flush not
	// yet generated, and whether Last WQE Reached waits for them.
	flushS, flushR int
	lwrDue         bool
	// The head send in flight: started and not completed (waiting for a
	// receive at the responder, or for a timer), with its retries left.
	inFlight            bool
	timerWait, timerDue bool // a timer is armed for it / has fired
	retrying            bool // rnrLeft and ackLeft count for it
	rnrLeft, ackLeft    uint8
	sqdNotify           bool // SQ_DRAINED is due once the head completes in SQD
}

var _ ibv.QP = (*QP)(nil)

// CreateQP creates an RC QP in RESET. The CQs and SRQ must belong to the
// PD's device. The QP is granted exactly the Cap asked for (Query reports
// it); a capacity above its limit (MaxQPWR, MaxSGE, MaxInlineData) fails
// with ErrInvalidArgument, the EINVAL rxe returns (rxe_qp_chk_cap), and a
// QP beyond MaxQP with ErrResourceLimit.
func (p *PD) CreateQP(attr ibv.QPInitAttr) (ibv.QP, error) {
	d := p.dev
	scq, ok := attr.SendCQ.(*CQ)
	if !ok || scq == nil || scq.dev != d {
		return nil, fmt.Errorf("creating a QP on %s: send CQ missing or not a CQ of this device: %w", d.name, ibv.ErrInvalidArgument)
	}
	rcq, ok := attr.RecvCQ.(*CQ)
	if !ok || rcq == nil || rcq.dev != d {
		return nil, fmt.Errorf("creating a QP on %s: receive CQ missing or not a CQ of this device: %w", d.name, ibv.ErrInvalidArgument)
	}
	var srq *SRQ
	if attr.SRQ != nil {
		s, ok := attr.SRQ.(*SRQ)
		if !ok || s == nil || s.dev != d {
			return nil, fmt.Errorf("creating a QP on %s: not an SRQ of this device: %w", d.name, ibv.ErrInvalidArgument)
		}
		srq = s
		attr.Cap.MaxRecvWR, attr.Cap.MaxRecvSGE = 0, 0
	}
	if attr.Type != ibv.QPTRC {
		return nil, fmt.Errorf("creating a %s QP on %s: only RC: %w", attr.Type, d.name, ibv.ErrNotSupported)
	}
	l := d.limits
	c := attr.Cap
	d.fab.mu.Lock()
	defer d.fab.mu.Unlock()
	switch {
	case p.closed || scq.closed || rcq.closed || srq != nil && srq.closed:
		return nil, fmt.Errorf("creating a QP on %s: %w", d.name, ibv.ErrClosed)
	case srq != nil && srq.errored:
		return nil, fmt.Errorf("creating a QP on %s: SRQ %d is in error: %w", d.name, srq.id, ibv.ErrInvalidState)
	case int(c.MaxSendWR) > l.MaxQPWR || int(c.MaxRecvWR) > l.MaxQPWR ||
		int(c.MaxSendSGE) > l.MaxSGE || int(c.MaxRecvSGE) > l.MaxSGE:
		return nil, fmt.Errorf("creating a QP on %s with %+v (max %d WRs, %d SGEs): %w",
			d.name, c, l.MaxQPWR, l.MaxSGE, ibv.ErrInvalidArgument)
	case uint64(c.MaxInlineData) > uint64(l.MaxInlineData):
		return nil, fmt.Errorf("creating a QP on %s with %d bytes of inline data (max %d): %w",
			d.name, c.MaxInlineData, l.MaxInlineData, ibv.ErrInvalidArgument)
	case len(d.qps) >= l.MaxQP:
		return nil, fmt.Errorf("creating a QP on %s (max %d): %w", d.name, l.MaxQP, ibv.ErrResourceLimit)
	}
	d.nextSeq++
	q := &QP{dev: d, pd: p, num: d.allocQPN(), seq: d.nextSeq, sendCQ: scq, recvCQ: rcq, srq: srq, cap: c, sigAll: attr.SigAll}
	q.rec = objtrace.Track("soft QP %d on %s", q.num, d.name)
	d.qps[q.num] = q
	p.nQP++
	scq.qps[q] = struct{}{}
	rcq.qps[q] = struct{}{}
	if srq != nil {
		srq.qps = append(srq.qps, q)
	}
	return q, nil
}

// Num is the QP number.
func (q *QP) Num() uint32 { return q.num }

// Type is always RC.
func (q *QP) Type() ibv.QPType { return ibv.QPTRC }

// SendCQ is the CQ send completions go to.
func (q *QP) SendCQ() ibv.CQ { return q.sendCQ }

// RecvCQ is the CQ receive completions go to.
func (q *QP) RecvCQ() ibv.CQ { return q.recvCQ }

// SRQ is the SRQ the QP receives from, or nil.
func (q *QP) SRQ() ibv.SRQ {
	if q.srq == nil {
		return nil
	}
	return q.srq
}

// Resets is how many times Modify has moved the QP to RESET: the events
// the device raises for the QP carry it (ibv.AsyncEvent.QPResets).
func (q *QP) Resets() uint64 { return q.resets.Load() }

// Outstanding is how many WRs of the QP the device holds whose completions
// it has not generated yet: queued and in-flight sends, receives of the
// QP's own queue, WQEs it took from its SRQ. At 0 no completion of the QP
// can still arrive until something is posted to it: the soft-only evidence
// a test checks a drain's "safe" against (hardware cannot be asked).
func (q *QP) Outstanding() int {
	q.dev.fab.mu.Lock()
	defer q.dev.fab.mu.Unlock()
	return q.sq.len() + q.rq.len() + q.taken.len()
}

// Query returns all of the QP's attributes, whatever mask says, and the
// attributes it was created with.
func (q *QP) Query(mask ibv.QPAttrMask) (ibv.QPAttr, ibv.QPInitAttr, error) {
	q.dev.fab.mu.Lock()
	defer q.dev.fab.mu.Unlock()
	if q.closed {
		return ibv.QPAttr{}, ibv.QPInitAttr{}, fmt.Errorf("querying QP %d: %w", q.num, ibv.ErrClosed)
	}
	a := q.attr
	a.State, a.CurState, a.Cap = q.state, q.state, q.cap
	init := ibv.QPInitAttr{SendCQ: q.sendCQ, RecvCQ: q.recvCQ, SRQ: q.SRQ(), Cap: q.cap, Type: ibv.QPTRC, SigAll: q.sigAll}
	return a, init, nil
}

// Close destroys the QP, in any state. WRs still queued are dropped without
// completions; WQEs it took from its SRQ are lost to the SRQ: the "WQE
// leakage" IBTA §10.3.1 warns of when an SRQ-attached QP is destroyed
// before Last WQE Reached.
func (q *QP) Close() error {
	d := q.dev
	return d.fab.closeObject(&q.closed, q.rec, func() error {
		d.fab.gen++
		q.dropQueues()
		delete(d.qps, q.num)
		delete(q.sendCQ.qps, q)
		delete(q.recvCQ.qps, q)
		if q.srq != nil {
			// From the end: QPs are mostly closed newest first (teardown),
			// and a scan from the front made closing an SRQ's n QPs O(n²),
			// seconds at 65,536.
			for i := len(q.srq.qps) - 1; i >= 0; i-- {
				if q.srq.qps[i] == q {
					q.srq.qps = slices.Delete(q.srq.qps, i, i+1)
					break
				}
			}
		}
		q.pd.nQP--
		if d.adv != nil {
			d.adv.freeQPN = append(d.adv.freeQPN, q.num)
		}
		return nil
	})
}

// dropQueues empties every queue of the QP without completions.
func (q *QP) dropQueues() {
	q.epoch++
	q.dev.fab.unblock(q)
	q.sq.reset()
	q.rq.reset()
	if q.srq != nil {
		// WQEs taken and dropped without completions never come back to
		// the SRQ's consumer (IBTA §10.3.1's leakage), but their slots do,
		// or the SRQ would shrink with every such QP.
		q.srq.used -= uint32(q.taken.len())
	}
	q.taken.reset()
	q.flushS, q.flushR, q.lwrDue = 0, 0, false
	q.headDone()
}

// headDone forgets the head send's flight: it completed or was dropped.
func (q *QP) headDone() {
	q.inFlight, q.timerWait, q.timerDue, q.retrying, q.sqdNotify = false, false, false, false, false
}

// sendDone is the slot accounting of a send completion being generated:
// polling it frees its WR's slot and those of the sends that completed
// silently before it.
func (q *QP) sendDone() wcMeta {
	m := wcMeta{qp: q, sq: 1 + q.sqUnsig}
	q.sqUnsig = 0
	return m
}

// recvDone is the slot accounting of a receive completion: one slot of the
// QP's own receive queue or of its SRQ.
func (q *QP) recvDone() wcMeta { return wcMeta{qp: q, rq: 1} }

// holdsPostsInError reports whether WRs posted now, in ERROR, stay queued
// instead of completing with a flush, by quirk.
func (q *QP) holdsPostsInError(send bool) bool {
	k := q.dev.quirks
	return k.DrainNeedsRTS && !q.reachedRTS || send && k.SendInErrorNotFlushed || !send && k.RecvInErrorNotFlushed
}

// flushDeferred flushes the receives that quirk RecvInErrorFlushDeferred
// held back, now that something else happens on the QP.
func (q *QP) flushDeferred() {
	if q.flushPending {
		q.flushPending = false
		q.flush()
	}
	if q.state == ibv.QPSErr && q.dev.quirks.RecvInErrorFlushDeferred && !q.holdsPostsInError(false) {
		if q.dev.adv != nil {
			q.scheduleFlush(q.flushS, q.taken.len()+q.rq.len())
			return
		}
		q.flushRecvs(&q.rq)
	}
}

// lastWQEAgain raises Last WQE Reached once more for quirk
// LastWQEReachedAgain, on a QP that has raised it in this ERROR.
func (q *QP) lastWQEAgain() {
	if k := q.dev.quirks; k.LastWQEReachedAgain && !k.NoLastWQEReached && q.lastWQE {
		q.dev.raise(ibv.AsyncEvent{Type: ibv.EventQPLastWQEReached, QP: q})
	}
}

// PostSend posts send WRs. A send needs the QP in RTS, SQD or ERR (in ERR
// it completes at once with WR_FLUSH_ERR); with auto-progress on, it
// executes before PostSend returns. On failure it returns a *ibv.PostError
// whose Index is the first WR not posted; the WRs before it were posted.
func (q *QP) PostSend(wrs []ibv.SendWR) error {
	f := q.dev.fab.lockTick()
	defer f.mu.Unlock()
	q.flushDeferred()
	err := q.postSend(wrs)
	if q.state == ibv.QPSErr && len(wrs) > 0 {
		q.lastWQEAgain()
	}
	if !f.manual {
		q.drive()
	}
	return err
}

func (q *QP) postSend(wrs []ibv.SendWR) error {
	for i := range wrs {
		wr := &wrs[i]
		if err := q.checkSend(wr); err != nil {
			return &ibv.PostError{Index: i, Err: err}
		}
		if wr.Flags&ibv.SendInline == 0 && q.state != ibv.QPSErr {
			// The common case, filled where it is queued.
			q.sqUsed++
			q.sq.alloc().fill(wr)
			if q.dev.fab.manual {
				q.dev.fab.pending.push(pendingSend{q, q.epoch})
			}
			continue
		}
		var w sendWQE
		if wr.Flags&ibv.SendInline == 0 {
			w = newSendWQE(wr)
		} else {
			data, err := q.inlineData(wr)
			if err != nil {
				return &ibv.PostError{Index: i, Err: err}
			}
			w = newInlineWQE(wr, data)
		}
		q.sqUsed++
		switch {
		case q.state != ibv.QPSErr:
			q.sq.push(w)
			if q.dev.fab.manual {
				q.dev.fab.pending.push(pendingSend{q, q.epoch})
			}
		case q.holdsPostsInError(true):
			q.sq.push(w)
		case q.dev.adv != nil:
			q.sq.push(w)
			q.scheduleFlush(q.flushS+1, q.flushR)
		default:
			q.sendCQ.push(&ibv.WC{ID: w.id, Status: ibv.WCWRFlushErr, QPNum: q.num}, false, q.sendDone())
		}
	}
	return nil
}

func (q *QP) checkSend(wr *ibv.SendWR) error {
	switch {
	case q.closed:
		return ibv.ErrClosed
	case q.state != ibv.QPSRTS && q.state != ibv.QPSSQD && q.state != ibv.QPSErr:
		// ErrInvalidArgument: the EINVAL rxe_post_send returns below RTS.
		return fmt.Errorf("QP %d is in %s: %w", q.num, q.state, ibv.ErrInvalidArgument)
	case wr.Opcode == ibv.WRLocalInv || wr.Opcode == ibv.WRBindMW || wr.Opcode == ibv.WRTSO:
		return fmt.Errorf("opcode %s: %w", wr.Opcode, ibv.ErrNotSupported)
	case wr.Opcode > ibv.WRTSO:
		return fmt.Errorf("opcode %s: %w", wr.Opcode, ibv.ErrInvalidArgument)
	case len(wr.SGL) > int(q.cap.MaxSendSGE):
		return fmt.Errorf("%d SGEs, QP %d takes %d: %w", len(wr.SGL), q.num, q.cap.MaxSendSGE, ibv.ErrInvalidArgument)
	case wr.Flags&ibv.SendInline != 0 && !inlineOpcode(wr.Opcode):
		return fmt.Errorf("inline data with opcode %s: %w", wr.Opcode, ibv.ErrInvalidArgument)
	case q.sqUsed >= q.cap.MaxSendWR:
		return fmt.Errorf("send queue of QP %d holds %d WRs not yet completed and polled: %w", q.num, q.cap.MaxSendWR, ibv.ErrQueueFull)
	}
	return nil
}

// inlineData copies the data of inline send wr: the bytes its SGEs name,
// in order, which must total at most the QP's MaxInlineData (else EINVAL,
// as librxe's validate_send_wr has it). No lkey is checked; the bytes are
// read from whichever MR of the device holds them (the soft device can see
// no other memory), and an SGE outside every MR fails the post with
// ErrInvalidArgument.
func (q *QP) inlineData(wr *ibv.SendWR) ([]byte, error) {
	var total uint64
	for _, s := range wr.SGL {
		total += uint64(s.Length)
	}
	if total > uint64(q.cap.MaxInlineData) {
		return nil, fmt.Errorf("%d bytes of inline data, QP %d takes %d: %w", total, q.num, q.cap.MaxInlineData, ibv.ErrInvalidArgument)
	}
	data := make([]byte, 0, total)
	for i, s := range wr.SGL {
		b, ok := q.dev.registered(s.Addr, s.Length)
		if !ok {
			return nil, fmt.Errorf("inline SGE %d (%#x, %d bytes) is in no MR of %s, the only memory the soft device reads: %w",
				i, s.Addr, s.Length, q.dev.name, ibv.ErrInvalidArgument)
		}
		data = append(data, b...)
	}
	return data, nil
}

// PostRecv posts receive WRs to the QP's own receive queue; it fails for a
// QP attached to an SRQ and for a QP in RESET. In ERR the receives complete
// at once with WR_FLUSH_ERR.
func (q *QP) PostRecv(wrs []ibv.RecvWR) error {
	f := q.dev.fab.lockTick()
	defer f.mu.Unlock()
	q.flushDeferred()
	err := q.postRecv(wrs)
	f.receivesPosted()
	return err
}

func (q *QP) postRecv(wrs []ibv.RecvWR) error {
	k := q.dev.quirks
	for i := range wrs {
		wr := &wrs[i]
		var err error
		switch {
		case q.closed:
			err = ibv.ErrClosed
		case q.srq != nil:
			err = fmt.Errorf("QP %d receives from SRQ %d: %w", q.num, q.srq.id, ibv.ErrInvalidArgument)
		case q.state == ibv.QPSReset:
			err = fmt.Errorf("QP %d is in RESET: %w", q.num, ibv.ErrInvalidArgument) // rxe's EINVAL
		case q.state == ibv.QPSSQD && q.dev.iwarp:
			// siw's SQD is its CLOSING, where siw_post_receive takes
			// receives no more (-EINVAL) until the QP is in ERROR.
			err = fmt.Errorf("iWARP QP %d is in SQD: %w", q.num, ibv.ErrInvalidArgument)
		case len(wr.SGL) > int(q.cap.MaxRecvSGE):
			err = fmt.Errorf("%d SGEs, QP %d takes %d: %w", len(wr.SGL), q.num, q.cap.MaxRecvSGE, ibv.ErrInvalidArgument)
		case q.rqUsed >= q.cap.MaxRecvWR:
			err = fmt.Errorf("receive queue of QP %d holds %d WRs not yet completed and polled: %w", q.num, q.cap.MaxRecvWR, ibv.ErrQueueFull)
		}
		if err != nil {
			return &ibv.PostError{Index: i, Err: err}
		}
		w := newRecvWQE(wr)
		q.rqUsed++
		if q.state == ibv.QPSErr && !q.holdsPostsInError(false) && !k.RecvInErrorFlushDeferred {
			if q.dev.adv != nil {
				q.rq.push(w)
				q.scheduleFlush(q.flushS, q.flushR+1)
				continue
			}
			q.recvCQ.push(&ibv.WC{ID: w.id, Status: ibv.WCWRFlushErr, QPNum: q.num}, false, q.recvDone())
			continue
		}
		q.rq.push(w)
	}
	return nil
}

// transition is one valid RC state transition: the attributes it requires
// and those it accepts besides STATE.
type transition struct{ req, opt ibv.QPAttrMask }

// rcTransitions is the RC column of the Linux kernel's qp_state_table
// (ib_modify_qp_is_ok, drivers/infiniband/core/verbs.c), which encodes the
// IBTA QP state machine. RC never enters SQE (a send error on RC is a QP
// error), but SQE's exits are kept for completeness.
var rcTransitions = map[[2]ibv.QPState]transition{
	{ibv.QPSReset, ibv.QPSReset}: {},
	{ibv.QPSReset, ibv.QPSInit}:  {req: ibv.QPAttrPKeyIndex | ibv.QPAttrPort | ibv.QPAttrAccessFlags},
	{ibv.QPSReset, ibv.QPSErr}:   {},
	{ibv.QPSInit, ibv.QPSReset}:  {},
	{ibv.QPSInit, ibv.QPSErr}:    {},
	{ibv.QPSInit, ibv.QPSInit}:   {opt: ibv.QPAttrPKeyIndex | ibv.QPAttrPort | ibv.QPAttrAccessFlags},
	{ibv.QPSInit, ibv.QPSRTR}: {
		req: ibv.QPAttrAV | ibv.QPAttrPathMTU | ibv.QPAttrDestQPN | ibv.QPAttrRQPSN | ibv.QPAttrMaxDestRdAtomic | ibv.QPAttrMinRNRTimer,
		opt: ibv.QPAttrAltPath | ibv.QPAttrAccessFlags | ibv.QPAttrPKeyIndex,
	},
	{ibv.QPSRTR, ibv.QPSReset}: {},
	{ibv.QPSRTR, ibv.QPSErr}:   {},
	{ibv.QPSRTR, ibv.QPSRTS}: {
		req: ibv.QPAttrTimeout | ibv.QPAttrRetryCnt | ibv.QPAttrRNRRetry | ibv.QPAttrSQPSN | ibv.QPAttrMaxQPRdAtomic,
		opt: ibv.QPAttrCurState | ibv.QPAttrAltPath | ibv.QPAttrAccessFlags | ibv.QPAttrMinRNRTimer | ibv.QPAttrPathMigState,
	},
	{ibv.QPSRTS, ibv.QPSReset}: {},
	{ibv.QPSRTS, ibv.QPSErr}:   {},
	{ibv.QPSRTS, ibv.QPSRTS}: {
		opt: ibv.QPAttrCurState | ibv.QPAttrAccessFlags | ibv.QPAttrAltPath | ibv.QPAttrPathMigState | ibv.QPAttrMinRNRTimer,
	},
	{ibv.QPSRTS, ibv.QPSSQD}:   {opt: ibv.QPAttrEnSQDAsyncNotify},
	{ibv.QPSSQD, ibv.QPSReset}: {},
	{ibv.QPSSQD, ibv.QPSErr}:   {},
	{ibv.QPSSQD, ibv.QPSRTS}: {
		opt: ibv.QPAttrCurState | ibv.QPAttrAltPath | ibv.QPAttrAccessFlags | ibv.QPAttrMinRNRTimer | ibv.QPAttrPathMigState,
	},
	{ibv.QPSSQD, ibv.QPSSQD}: {
		opt: ibv.QPAttrPort | ibv.QPAttrAV | ibv.QPAttrTimeout | ibv.QPAttrRetryCnt | ibv.QPAttrRNRRetry |
			ibv.QPAttrMaxQPRdAtomic | ibv.QPAttrMaxDestRdAtomic | ibv.QPAttrAltPath | ibv.QPAttrAccessFlags |
			ibv.QPAttrPKeyIndex | ibv.QPAttrMinRNRTimer | ibv.QPAttrPathMigState,
	},
	{ibv.QPSSQE, ibv.QPSReset}: {},
	{ibv.QPSSQE, ibv.QPSErr}:   {},
	{ibv.QPSSQE, ibv.QPSRTS}:   {},
	{ibv.QPSErr, ibv.QPSReset}: {},
	{ibv.QPSErr, ibv.QPSErr}:   {},
}

// checkTransition says why moving from cur to next with mask is invalid,
// or returns nil, following ib_modify_qp_is_ok. The error is
// ErrInvalidArgument (EINVAL): what libibverbs returns for an invalid
// transition (rxe_qp_chk_attr), and all an errno can say.
func checkTransition(cur, next ibv.QPState, mask ibv.QPAttrMask) error {
	if mask&ibv.QPAttrCurState != 0 && cur != ibv.QPSRTR && cur != ibv.QPSRTS && cur != ibv.QPSSQD && cur != ibv.QPSSQE {
		return fmt.Errorf("CUR_STATE given in %s: %w", cur, ibv.ErrInvalidArgument)
	}
	t, ok := rcTransitions[[2]ibv.QPState{cur, next}]
	if !ok {
		return fmt.Errorf("no such transition: %w", ibv.ErrInvalidArgument)
	}
	if missing := t.req &^ mask; missing != 0 {
		return fmt.Errorf("missing attributes %s: %w", missing, ibv.ErrInvalidArgument)
	}
	if extra := mask &^ (t.req | t.opt | ibv.QPAttrState); extra != 0 {
		return fmt.Errorf("attributes %s not allowed: %w", extra, ibv.ErrInvalidArgument)
	}
	return nil
}

// checkValues checks the attribute values mask selects.
func (q *QP) checkValues(a *ibv.QPAttr, mask ibv.QPAttrMask) error {
	max := q.dev.limits.MaxQPRdAtom
	switch {
	case mask&ibv.QPAttrCurState != 0 && a.CurState != q.state:
		return fmt.Errorf("CUR_STATE %s, QP is in %s: %w", a.CurState, q.state, ibv.ErrInvalidArgument)
	case mask&ibv.QPAttrPort != 0 && a.PortNum != 1:
		return fmt.Errorf("port %d, the device has port 1: %w", a.PortNum, ibv.ErrInvalidArgument)
	case mask&ibv.QPAttrPKeyIndex != 0 && a.PKeyIndex != 0:
		return fmt.Errorf("P_Key index %d, the table has index 0: %w", a.PKeyIndex, ibv.ErrInvalidArgument)
	case mask&ibv.QPAttrAccessFlags != 0 && a.AccessFlags&^validMRAccess != 0:
		return fmt.Errorf("access flags %#x: %w", uint32(a.AccessFlags), ibv.ErrInvalidArgument)
	case mask&ibv.QPAttrPathMTU != 0 && a.PathMTU.Bytes() == 0:
		return fmt.Errorf("path MTU %s: %w", a.PathMTU, ibv.ErrInvalidArgument)
	case mask&ibv.QPAttrMaxQPRdAtomic != 0 && int(a.MaxRdAtomic) > max,
		mask&ibv.QPAttrMaxDestRdAtomic != 0 && int(a.MaxDestRdAtomic) > max:
		return fmt.Errorf("RDMA READ/atomic depth %d/%d (max %d): %w", a.MaxRdAtomic, a.MaxDestRdAtomic, max, ibv.ErrInvalidArgument)
	}
	return nil
}

// Modify changes the QP's state and attributes. The transition and the
// attributes given must be valid for RC, as in ib_modify_qp_is_ok; an
// invalid transition returns an error wrapping ibv.ErrInvalidArgument and
// changes nothing. Moving to RESET empties every queue without completions;
// moving to ERR flushes them (see the package documentation).
//
// On an iWARP device (Config.Transport) a QP reaches RTS only through the
// connection manager (ModifyByCM), as on siw, whose siw_qp_modify takes a
// QP from IDLE (RESET and INIT) to RTS only with the connection's socket
// (SIW_QP_ATTR_LLP_HANDLE), which ibv_modify_qp cannot pass: Modify to RTS
// from another state fails with ibv.ErrInvalidArgument (siw's -EINVAL),
// and Modify to RTR returns nil and changes nothing (siw has no transition
// from IDLE to RTR: siw_qp_nextstate_from_idle leaves the QP as it is).
func (q *QP) Modify(attr ibv.QPAttr, mask ibv.QPAttrMask) error {
	return q.modify(attr, mask, false)
}

// ModifyByCM is Modify as the connection manager calls it (softcm): on an
// iWARP device, the one way to RTR and RTS. On an InfiniBand device it is
// Modify.
func (q *QP) ModifyByCM(attr ibv.QPAttr, mask ibv.QPAttrMask) error {
	return q.modify(attr, mask, true)
}

func (q *QP) modify(attr ibv.QPAttr, mask ibv.QPAttrMask, byCM bool) error {
	q.dev.fab.mu.Lock()
	defer q.dev.fab.mu.Unlock()
	if q.closed {
		return fmt.Errorf("modifying QP %d: %w", q.num, ibv.ErrClosed)
	}
	q.dev.fab.tick()
	cur, next := q.state, q.state
	if mask&ibv.QPAttrState != 0 {
		next = attr.State
	}
	if q.dev.iwarp && !byCM && next != cur {
		switch next {
		case ibv.QPSRTR:
			return nil
		case ibv.QPSRTS:
			return fmt.Errorf("modifying QP %d from %s to RTS: an iWARP QP is connected only through the connection manager: %w", q.num, cur, ibv.ErrInvalidArgument)
		}
	}
	if err := checkTransition(cur, next, mask); err != nil {
		return fmt.Errorf("modifying QP %d from %s to %s: %w", q.num, cur, next, err)
	}
	if err := q.checkValues(&attr, mask); err != nil {
		return fmt.Errorf("modifying QP %d from %s to %s: %w", q.num, cur, next, err)
	}
	q.flushDeferred()
	if cur == ibv.QPSErr && next == ibv.QPSErr {
		q.lastWQEAgain()
	}
	q.setAttrs(&attr, mask)
	q.dev.fab.gen++
	switch next {
	case ibv.QPSReset:
		q.reset()
		q.resets.Add(1)
	case ibv.QPSErr:
		if q.dev.quirks.FlushDeferred && cur != ibv.QPSErr {
			q.toErr(eventNone)
			q.flushPending = true
			break
		}
		q.moveToError(eventNone)
	default:
		q.setState(next)
	}
	switch {
	case next == ibv.QPSRTR:
		q.prefetch()
	case next == ibv.QPSRTS:
		q.reachedRTS = true
		if !q.dev.fab.manual {
			q.drive()
		}
	case next == ibv.QPSSQD && cur == ibv.QPSRTS && mask&ibv.QPAttrEnSQDAsyncNotify != 0 && attr.EnSQDAsyncNotify:
		// The send queue is drained once no WR is in flight: at once, or
		// when the head WR that had started completes (execHead).
		if q.inFlight && q.dev.quirks.SQDrainedEarly && (q.retrying || !q.timerWait) {
			// rxe's retry rewinds the head to not started, which its SQD
			// drain check takes for drained (Quirks.SQDrainedEarly). rxe
			// retries an RNR wait (also with rnr_retry 7) and a timed
			// one, never a wait for an ACK with timeout 0.
			q.headDone()
			q.dev.fab.unblock(q)
		}
		if q.inFlight {
			q.sqdNotify = true
		} else {
			q.dev.raise(ibv.AsyncEvent{Type: ibv.EventSQDrained, QP: q})
		}
	}
	return nil
}

// setAttrs copies the attributes mask selects.
func (q *QP) setAttrs(a *ibv.QPAttr, mask ibv.QPAttrMask) {
	t := &q.attr
	set := func(bit ibv.QPAttrMask, apply func()) {
		if mask&bit != 0 {
			apply()
		}
	}
	set(ibv.QPAttrAccessFlags, func() { t.AccessFlags = a.AccessFlags })
	set(ibv.QPAttrPKeyIndex, func() { t.PKeyIndex = a.PKeyIndex })
	set(ibv.QPAttrPort, func() { t.PortNum = a.PortNum })
	set(ibv.QPAttrAV, func() { t.AH = a.AH })
	set(ibv.QPAttrPathMTU, func() { t.PathMTU = a.PathMTU })
	set(ibv.QPAttrTimeout, func() { t.Timeout = a.Timeout })
	set(ibv.QPAttrRetryCnt, func() { t.RetryCnt = a.RetryCnt })
	set(ibv.QPAttrRNRRetry, func() { t.RNRRetry = a.RNRRetry })
	set(ibv.QPAttrRQPSN, func() { t.RQPSN = a.RQPSN })
	set(ibv.QPAttrSQPSN, func() { t.SQPSN = a.SQPSN })
	set(ibv.QPAttrMaxQPRdAtomic, func() { t.MaxRdAtomic = a.MaxRdAtomic })
	set(ibv.QPAttrMaxDestRdAtomic, func() { t.MaxDestRdAtomic = a.MaxDestRdAtomic })
	set(ibv.QPAttrMinRNRTimer, func() { t.MinRNRTimer = a.MinRNRTimer })
	set(ibv.QPAttrDestQPN, func() { t.DestQPNum = a.DestQPNum })
	set(ibv.QPAttrEnSQDAsyncNotify, func() { t.EnSQDAsyncNotify = a.EnSQDAsyncNotify })
}

// setState records a state change. Called with fab.mu held.
func (q *QP) setState(next ibv.QPState) {
	if q.state == next {
		return
	}
	q.dev.emit(TraceEntry{Kind: TraceState, QPNum: q.num, From: q.state, To: next})
	q.state = next
	q.dev.fab.gen++
}

// reset moves the QP to RESET: queues emptied without completions, its
// completions still in its CQs discarded (as mlx4 and mlx5 do), attributes
// cleared, ready for reuse.
func (q *QP) reset() {
	q.dropQueues()
	q.sendCQ.discard(q)
	if q.recvCQ != q.sendCQ {
		q.recvCQ.discard(q)
	}
	q.sqUsed, q.rqUsed, q.sqUnsig = 0, 0, 0
	q.setState(ibv.QPSReset)
	q.attr = ibv.QPAttr{}
	q.reachedRTS = false
	q.lastWQE = false
	q.flushPending = false
}

package soft

import (
	"encoding/binary"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
)

// eventNone marks a move to ERROR that raises no async event: a Modify to
// ERR, or a requester error, which only its completion reports.
const eventNone ibv.EventType = ^ibv.EventType(0)

// rnrRetryInfinite is the rnr_retry value meaning "retry forever".
const rnrRetryInfinite = 7

type execResult uint8

const (
	execIdle execResult = iota // nothing to execute
	execDone                   // the head WR completed (or was flushed)
	execWait                   // the head WR cannot start now (SQD, or RNR)
)

// drive executes the QP's send queue as far as it can (auto-progress).
func (q *QP) drive() {
	for q.sq.len() > 0 {
		if q.execHead() != execDone {
			return
		}
	}
}

// execHead executes the oldest WR of the send queue, end to end: requester
// checks, the responder's work and completions, the requester's completion.
// In SQD only a WR already in flight when SQD began goes on, to completion.
func (q *QP) execHead() execResult {
	if q.state == ibv.QPSSQD && q.sq.len() > 0 && !q.inFlight || q.timerWait {
		return execWait
	}
	if q.state != ibv.QPSRTS && q.state != ibv.QPSSQD || q.sq.len() == 0 {
		return execIdle
	}
	w := q.sq.at(0)
	f := q.dev.fab
	state := q.state
	status, n, wait := q.execute(w)
	if wait {
		q.inFlight = true
		if !q.timerWait {
			f.block(q)
		}
		return execWait
	}
	if q.state != state {
		// The responder's completions overflowed a CQ this QP shares and
		// moved it to ERROR: the WR was flushed with the rest.
		f.pushHeld()
		return execDone
	}
	drained := q.sqdNotify
	q.headDone()
	id, op, signaled := w.id, ibv.WROpcode(w.opcode), q.sigAll || ibv.SendFlags(w.flags)&ibv.SendSignaled != 0
	q.sq.drop()
	if status != ibv.WCSuccess {
		q.toErr(eventNone)
		q.sendCQ.push(&ibv.WC{ID: id, Status: status, QPNum: q.num}, false, q.sendDone())
		q.flush()
		return execDone
	}
	if signaled {
		q.sendCQ.push(&ibv.WC{ID: id, Status: ibv.WCSuccess, Opcode: wcOpcode(op), ByteLen: n, QPNum: q.num}, false, q.sendDone())
	} else {
		q.sqUnsig++
	}
	f.pushHeld()
	if drained {
		// The WR in flight when SQD began has completed: SQD is drained.
		q.dev.raise(ibv.AsyncEvent{Type: ibv.EventSQDrained, QP: q})
	}
	return execDone
}

// execute performs w against the responder and returns the requester's
// status and byte count, or wait when the responder has no receive WQE and
// rnr_retry is infinite. Responder errors (IBTA Table 58, class C) move the
// responder to ERROR here, with the async event ibv_get_async_event(3) names
// for it (QP_REQ_ERR or QP_ACCESS_ERR); the
// requester status is the NAK's, as rxe reports it.
func (q *QP) execute(w *sendWQE) (status ibv.WCStatus, n uint32, wait bool) {
	op := ibv.WROpcode(w.opcode)
	need := ibv.AccessFlags(0)
	if isRdAtomic(op) {
		need = ibv.AccessLocalWrite
	}
	var lbuf [2][]byte
	var local [][]byte
	var total uint64
	var ok bool
	if ibv.SendFlags(w.flags)&ibv.SendInline == 0 {
		if local, total, ok = q.dev.resolve(q.pd, &w.wqeSGL, need, lbuf[:0]); !ok {
			return ibv.WCLocProtErr, 0, false
		}
	} else {
		// Inline data was copied at post time: no lkey to check.
		lbuf[0] = w.ext.inline
		local, total = lbuf[:1], uint64(len(w.ext.inline))
	}
	if isAtomic(op) && (total != 8 || len(local) != 1) {
		return ibv.WCLocLenErr, 0, false
	}
	if total > 1<<31 {
		return ibv.WCLocLenErr, 0, false
	}
	n = uint32(total)
	p := q.responder()
	if p == nil {
		return q.noAck()
	}
	if need := remoteAccess(op); p.attr.AccessFlags&need != need {
		// The responder QP does not enable the operation: rxe answers it
		// as an unsupported request (invalid request NAK).
		p.responderError(ibv.EventQPReqErr, nil, 0)
		return ibv.WCRemInvReqErr, 0, false
	}
	switch op {
	case ibv.WRSendWithInv:
		// The soft device implements no memory windows or invalidation:
		// the responder sees an opcode it does not support.
		p.responderError(ibv.EventQPReqErr, nil, 0)
		return ibv.WCRemInvReqErr, 0, false

	case ibv.WRSend, ibv.WRSendWithImm:
		r, ok := p.takeRecv()
		if !ok {
			return q.rnr(p)
		}
		var rbuf [2][]byte
		dst, room, ok := p.dev.resolve(p.pd, &r.wqeSGL, ibv.AccessLocalWrite, rbuf[:0])
		if !ok {
			p.responderError(eventNone, &r, ibv.WCLocProtErr)
			return ibv.WCRemOpErr, 0, false
		}
		if total > room {
			p.responderError(ibv.EventQPAccessErr, &r, ibv.WCLocLenErr)
			return ibv.WCRemInvReqErr, 0, false
		}
		scatter(dst, local)
		wc := ibv.WC{ID: r.id, Opcode: ibv.WCRecv, ByteLen: n, QPNum: p.num, SrcQP: q.num, SLID: q.dev.lid}
		if op == ibv.WRSendWithImm {
			wc.Flags, wc.ImmData = ibv.WCFlagWithImm, w.imm
		}
		p.received(&wc, ibv.SendFlags(w.flags)&ibv.SendSolicited != 0)
		return ibv.WCSuccess, n, false

	case ibv.WRRDMAWrite, ibv.WRRDMAWriteWithImm:
		var dst []byte
		if n > 0 {
			// A zero-length RDMA operation checks no R_Key (IBTA C9-88).
			if dst, ok = p.remote(w, n, ibv.AccessRemoteWrite); !ok {
				p.responderError(ibv.EventQPAccessErr, nil, 0)
				return ibv.WCRemAccessErr, 0, false
			}
		}
		var r recvWQE
		if op == ibv.WRRDMAWriteWithImm {
			if r, ok = p.takeRecv(); !ok {
				return q.rnr(p)
			}
		}
		scatter([][]byte{dst}, local)
		if op == ibv.WRRDMAWriteWithImm {
			wc := ibv.WC{ID: r.id, Opcode: ibv.WCRecvRDMAWithImm, ByteLen: n, ImmData: w.imm, Flags: ibv.WCFlagWithImm, QPNum: p.num, SrcQP: q.num, SLID: q.dev.lid}
			p.received(&wc, ibv.SendFlags(w.flags)&ibv.SendSolicited != 0)
		}
		return ibv.WCSuccess, n, false

	case ibv.WRRDMARead:
		if q.rdAtomicInFlight() > int(p.attr.MaxDestRdAtomic) {
			p.responderError(ibv.EventQPAccessErr, nil, 0)
			return ibv.WCRemInvReqErr, 0, false
		}
		if n > 0 {
			src, ok := p.remote(w, n, ibv.AccessRemoteRead)
			if !ok {
				p.responderError(ibv.EventQPAccessErr, nil, 0)
				return ibv.WCRemAccessErr, 0, false
			}
			scatter(local, [][]byte{src})
		}
		return ibv.WCSuccess, n, false

	default: // atomics; postSend admits nothing else
		if q.rdAtomicInFlight() > int(p.attr.MaxDestRdAtomic) || w.remoteAddr%8 != 0 {
			p.responderError(ibv.EventQPAccessErr, nil, 0)
			return ibv.WCRemInvReqErr, 0, false
		}
		b, ok := p.remote(w, 8, ibv.AccessRemoteAtomic)
		if !ok {
			p.responderError(ibv.EventQPAccessErr, nil, 0)
			return ibv.WCRemAccessErr, 0, false
		}
		// Atomics act on host-order words, like an HCA on the host's memory.
		old := binary.NativeEndian.Uint64(b)
		switch {
		case op == ibv.WRAtomicFetchAndAdd:
			binary.NativeEndian.PutUint64(b, old+w.ext.compareAdd)
		case old == w.ext.compareAdd:
			binary.NativeEndian.PutUint64(b, w.ext.swap)
		}
		binary.NativeEndian.PutUint64(local[0], old)
		return ibv.WCSuccess, 8, false
	}
}

// rnr handles an RNR NAK, a responder p without a receive WQE. With
// rnr_retry 7 the WR waits until a receive is posted; otherwise the
// requester retries after p's min_rnr_timer, rnr_retry times, and the NAK
// of the last retry fails the WR with RNR_RETRY_EXC_ERR.
func (q *QP) rnr(p *QP) (ibv.WCStatus, uint32, bool) {
	if q.attr.RNRRetry == rnrRetryInfinite {
		return 0, 0, true
	}
	q.startRetry()
	if q.rnrLeft == 0 {
		return ibv.WCRNRRetryExcErr, 0, false
	}
	q.rnrLeft--
	q.armTimer(rnrDelay(p.attr.MinRNRTimer))
	return 0, 0, true
}

// noAck handles a request nobody answers: the requester waits its local
// ACK timeout for each of 1 + retry_cnt attempts, then fails the WR with
// RETRY_EXC_ERR; with timeout 0 it waits forever.
func (q *QP) noAck() (ibv.WCStatus, uint32, bool) {
	d, finite := ackTimeout(q.attr.Timeout)
	if !finite {
		q.armTimer(-1)
		return 0, 0, true
	}
	fired := q.timerDue
	q.startRetry()
	if fired {
		if q.ackLeft == 0 {
			return ibv.WCRetryExcErr, 0, false
		}
		q.ackLeft--
	}
	q.armTimer(d)
	return 0, 0, true
}

// startRetry starts the retry counters when the head WR first needs them.
func (q *QP) startRetry() {
	q.timerDue = false
	if !q.retrying {
		q.retrying, q.rnrLeft, q.ackLeft = true, q.attr.RNRRetry, q.attr.RetryCnt
	}
}

// armTimer makes the head WR wait for a device timer d from now; a
// negative d waits for none (only ERROR or RESET end the wait).
func (q *QP) armTimer(d time.Duration) {
	q.timerWait = true
	if d >= 0 {
		q.dev.fab.startTimer(q, d)
	}
}

// responder returns the QP this QP's requests reach, or nil when none
// would answer: no such QP, not in a receiving state, or not connected
// back to this QP.
func (q *QP) responder() *QP {
	f := q.dev.fab
	if q.peerGen == f.gen {
		return q.peer
	}
	q.peer, q.peerGen = nil, f.gen
	d := f.route(&q.attr.AH)
	if d == nil {
		return nil
	}
	p := d.qps[q.attr.DestQPNum]
	if p == nil {
		return nil
	}
	switch p.state {
	case ibv.QPSRTR, ibv.QPSRTS, ibv.QPSSQD, ibv.QPSSQE:
	default:
		return nil
	}
	if p.attr.DestQPNum != q.num || f.route(&p.attr.AH) != q.dev {
		return nil
	}
	q.peer = p
	return p
}

// remote returns the n bytes at w's remote address, if w's rkey names an
// MR of responder p's PD that grants access and holds them.
func (p *QP) remote(w *sendWQE, n uint32, access ibv.AccessFlags) ([]byte, bool) {
	return p.dev.slice(p.pd, w.rkey, w.remoteAddr, n, access)
}

// remoteAccess is the QP access flag a responder needs for op.
func remoteAccess(op ibv.WROpcode) ibv.AccessFlags {
	switch op {
	case ibv.WRRDMAWrite, ibv.WRRDMAWriteWithImm:
		return ibv.AccessRemoteWrite
	case ibv.WRRDMARead:
		return ibv.AccessRemoteRead
	case ibv.WRAtomicCmpAndSwp, ibv.WRAtomicFetchAndAdd:
		return ibv.AccessRemoteAtomic
	}
	return 0
}

// rdAtomicInFlight is how many RDMA READ/atomic requests the requester has
// issued when its oldest WR reaches the responder: a requester pipelines
// the READ/atomic WRs queued behind it, up to its own max_rd_atomic.
func (q *QP) rdAtomicInFlight() int {
	limit := max(int(q.attr.MaxRdAtomic), 1)
	k := 0
	for i := 0; i < q.sq.len() && k < limit; i++ {
		if isRdAtomic(ibv.WROpcode(q.sq.at(i).opcode)) {
			k++
		}
	}
	return k
}

// takeRecv takes the receive WQE the next message consumes: one taken
// ahead from the SRQ, else the SRQ's oldest, else the QP's own oldest.
func (p *QP) takeRecv() (recvWQE, bool) {
	if p.srq == nil {
		if p.rq.len() == 0 {
			return recvWQE{}, false
		}
		return p.rq.pop(), true
	}
	if p.taken.len() > 0 {
		return p.taken.pop(), true
	}
	return p.srq.take()
}

// received completes a consumed receive WQE and takes the next one ahead.
// The adversarial schedule may hold the completion back until the
// requester's is written (execHead): the two land in their CQs in either
// order.
func (p *QP) received(wc *ibv.WC, solicited bool) {
	m := p.recvDone()
	if a := p.dev.adv; a != nil && a.coin() {
		p.dev.fab.held = heldWC{cq: p.recvCQ, wc: *wc, meta: m, solicited: solicited}
	} else {
		p.recvCQ.push(wc, solicited, m)
	}
	p.prefetch()
}

// prefetch tops up the WQEs the QP holds taken from its SRQ to
// Config.SRQPrefetch, in RTR and later states short of ERROR.
func (q *QP) prefetch() {
	if q.srq == nil || q.state == ibv.QPSReset || q.state == ibv.QPSInit || q.state == ibv.QPSErr {
		return
	}
	for q.taken.len() < q.dev.pref {
		w, ok := q.srq.take()
		if !ok {
			return
		}
		q.taken.push(w)
		q.dev.emit(TraceEntry{Kind: TraceSRQTake, QPNum: q.num, SRQ: q.srq.id, WRID: w.id})
	}
}

// responderError moves responder p to ERROR after a request it cannot
// honour: ev is raised, the receive WQE r the request consumed (if any)
// completes with status st, and everything else flushes.
func (p *QP) responderError(ev ibv.EventType, r *recvWQE, st ibv.WCStatus) {
	if p.dev.quirks.NoResponderErrorEvent {
		ev = eventNone
	}
	p.toErr(ev)
	if r != nil {
		p.recvCQ.push(&ibv.WC{ID: r.id, Status: st, QPNum: p.num}, false, p.recvDone())
	}
	p.flush()
}

// moveToError moves the QP to ERROR, raising ev unless it is eventNone,
// and flushes it. A QP already in ERROR is left alone.
func (q *QP) moveToError(ev ibv.EventType) {
	if q.state == ibv.QPSErr || q.closed {
		return
	}
	q.toErr(ev)
	q.flush()
}

// toErr switches the state to ERROR and raises ev.
func (q *QP) toErr(ev ibv.EventType) {
	q.epoch++
	q.headDone()
	q.dev.fab.unblock(q)
	q.setState(ibv.QPSErr)
	if ev != eventNone {
		q.dev.raise(ibv.AsyncEvent{Type: ev, QP: q})
	}
}

// flushRecvs completes every receive WQE of r with WR_FLUSH_ERR, in order.
func (q *QP) flushRecvs(r *ring[recvWQE]) {
	for r.len() > 0 {
		w := r.pop()
		q.recvCQ.push(&ibv.WC{ID: w.id, Status: ibv.WCWRFlushErr, QPNum: q.num}, false, q.recvDone())
	}
}

// flush completes every outstanding WR with WR_FLUSH_ERR, in order: the
// send queue, then the receive WQEs taken from the SRQ, then the own
// receive queue. An SRQ-attached QP then raises Last WQE Reached: it will
// take no more WQEs (o11-5.2.5), so it raises it exactly once per ERROR.
// The adversarial schedule generates the same completions over later
// device calls instead, and raises Last WQE Reached once the last receive
// flush is generated.
func (q *QP) flush() {
	if q.srq != nil && !q.lastWQE {
		q.lwrDue = true
	}
	if q.dev.adv != nil {
		q.scheduleFlush(q.sq.len(), q.taken.len()+q.rq.len())
		if q.flushR == 0 {
			q.lastWQEReached()
		}
		return
	}
	for q.sq.len() > 0 {
		w := q.sq.pop()
		q.sendCQ.push(&ibv.WC{ID: w.id, Status: ibv.WCWRFlushErr, QPNum: q.num}, false, q.sendDone())
	}
	q.flushRecvs(&q.taken)
	q.flushRecvs(&q.rq)
	q.lastWQEReached()
}

// lastWQEReached raises Last WQE Reached if it is due: the QP is in ERROR
// and the completions of every receive WQE it took are generated. Only
// from then on is it raised (q.lastWQE), and may be repeated
// (lastWQEAgain): while it is due, a repeat would come first.
func (q *QP) lastWQEReached() {
	if !q.lwrDue {
		return
	}
	q.lwrDue, q.lastWQE = false, true
	k := q.dev.quirks
	if k.NoLastWQEReached {
		return
	}
	q.dev.raise(ibv.AsyncEvent{Type: ibv.EventQPLastWQEReached, QP: q})
	if k.LastWQEReachedTwice {
		q.dev.raise(ibv.AsyncEvent{Type: ibv.EventQPLastWQEReached, QP: q})
	}
}

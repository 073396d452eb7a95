package flushcheck

import (
	"errors"
	"fmt"
	"strings"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/rcsetup"
)

// The probes' wr_ids: sends and receives in two ranges, so a flushed
// completion (whose opcode is not valid) still tells its queue.
const (
	sendBase uint64 = 0x100
	recvBase uint64 = 0x200
)

func ids(base uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = base + uint64(i)
	}
	return out
}

func sends(base uint64, n int) []ibv.SendWR {
	wrs := make([]ibv.SendWR, n)
	for i, id := range ids(base, n) {
		wrs[i] = ibv.SendWR{ID: id, Opcode: ibv.WRSend, Flags: ibv.SendSignaled}
	}
	return wrs
}

// recvs are n receives with wr_ids from base, without an SGE.
func recvs(base uint64, n int) []ibv.RecvWR {
	wrs := make([]ibv.RecvWR, n)
	for i, id := range ids(base, n) {
		wrs[i] = ibv.RecvWR{ID: id}
	}
	return wrs
}

// recvs are the probe's receives: recvs with the probe's receive SGE
// (env.recvSGE; none on InfiniBand).
func (e *env) recvs(base uint64, n int) []ibv.RecvWR {
	wrs := recvs(base, n)
	for i := range wrs {
		wrs[i].SGL = e.recvSGE
	}
	return wrs
}

// The probes' names, as Probes returns them, Result.Name carries them and
// Settings keys its decisions by them.
const (
	ProbeFlushOutstanding     = "flush-outstanding"
	ProbeSendInError          = "send-in-error"
	ProbeRecvInError          = "recv-in-error"
	ProbeFlushBeforeRTS       = "flush-before-rts"
	ProbeLastWQEReached       = "last-wqe-reached"
	ProbeLastWQERepeat        = "last-wqe-repeat"
	ProbeDrainWR              = "drain-wr"
	ProbeResponderAccessError = "responder-access-error"
	ProbeCQOverrun            = "cq-overrun"
	ProbePeerGone             = "peer-gone"
	ProbeRNRExhausted         = "rnr-exhausted"
	ProbeDestroyOutstanding   = "destroy-outstanding"
	ProbeResetReuse           = "reset-reuse"
	ProbeFlushOrder           = "flush-order"
	ProbeSQD                  = "sqd"
)

var probes = []Probe{
	{
		Name: ProbeFlushOutstanding,
		Rule: "IBTA vol. 1 §10.3.1 (QP error state): WRs outstanding when a QP enters ERROR complete in order, each queue, with WR_FLUSH_ERR",
		run:  flushOutstanding,
	},
	{
		Name: ProbeSendInError,
		Rule: "IBTA vol. 1 §10.3.1 (QP error state; Roland Dreier on the ofa-general thread about IBM eHCA and IPoIB-CM's Last WQE handling): a send posted in ERROR completes with WR_FLUSH_ERR",
		run:  sendInError,
	},
	{
		Name: ProbeRecvInError,
		Rule: "IBTA vol. 1 C10-42, C10-97.2.1: a receive posted in ERROR completes with WR_FLUSH_ERR",
		run:  recvInError,
	},
	{
		Name: ProbeFlushBeforeRTS,
		Rule: "IBTA vol. 1 §10.3.1 (QP error state): a send posted in ERROR completes with WR_FLUSH_ERR also on a QP that never reached RTS (ipoib_cm.c goes to RTS first for firmware that did not)",
		run:  flushBeforeRTS,
	},
	{
		Name: ProbeLastWQEReached,
		Rule: "IBTA vol. 1 o11-5.2.5: an SRQ-attached QP entering ERROR raises IBV_EVENT_QP_LAST_WQE_REACHED once, and only that QP does",
		run:  lastWQEReached,
	},
	{
		Name: ProbeLastWQERepeat,
		Rule: "IBTA vol. 1 o11-5.2.5: Last WQE Reached is raised once per entry to ERROR; a second modify to ERROR, a send posted in ERROR or a receive posted to the SRQ meanwhile raise it again only on a provider that repeats it (which ib_drain_qp and drain must tolerate)",
		run:  lastWQERepeat,
	},
	{
		Name: ProbeDrainWR,
		Rule: "IBTA vol. 1 §10.3.1 (drain package, one QP): the drain WR posted in ERROR completes behind the QP's flushes, so the QP is safe to destroy",
		run:  drainWR,
	},
	{
		Name: ProbeResponderAccessError,
		Rule: "IBTA vol. 1 Table 58, class C: an access violation at the responder (RDMA WRITE, bad rkey) raises IBV_EVENT_QP_ACCESS_ERR there and moves it to ERROR",
		run:  responderAccessError,
	},
	{
		Name: ProbeCQOverrun,
		Rule: "ibv_get_async_event(3) (IBV_EVENT_CQ_ERR: \"CQ is in error (CQ overrun)\"): more completions than the CQ holds raise IBV_EVENT_CQ_ERR; what happens to the QPs and the completions is the provider's, and observed",
		run:  cqOverrun,
	},
	{
		Name:       ProbePeerGone,
		Rule:       "IBTA vol. 1 ch. 9.7 (transport timer, retry_cnt; ibv_modify_qp(3) timeout and retry_cnt): a send no one answers completes RETRY_EXC_ERR after retry_cnt + 1 local ACK timeouts of 4.096 µs × 2^timeout, the sends behind it WR_FLUSH_ERR, the QP in ERROR",
		run:        peerGone,
		NotOnIWARP: "retry_cnt and the local ACK timeout are InfiniBand transport attributes; iWARP's RDMAP (RFC 5040) and DDP (RFC 5041) run over MPA on TCP (RFC 5044), whose retransmission replaces them, and siw takes only the state and access flags of ibv_modify_qp (siw_verbs_modify_qp in the kernel's drivers/infiniband/sw/siw/siw_verbs.c)",
	},
	{
		Name:       ProbeRNRExhausted,
		Rule:       "IBTA vol. 1 ch. 9.7 (RNR NAK, rnr_retry; ibv_modify_qp(3)): a send the responder has no receive for completes RNR_RETRY_EXC_ERR after rnr_retry RNR NAK timers when rnr_retry is finite, the sends behind it WR_FLUSH_ERR, the QP in ERROR",
		run:        rnrExhausted,
		NotOnIWARP: "iWARP has no RNR NAK and no rnr_retry: a SEND that finds no receive posted is a DDP error, Untagged Buffer \"Invalid MSN - no buffer available\" (RFC 5041), which terminates the connection (siw_proc_send in the kernel's drivers/infiniband/sw/siw/siw_qp_rx.c: DDP_ECODE_UT_INVALID_MSN_NOBUF)",
	},
	{
		Name: ProbeDestroyOutstanding,
		Rule: "ibv_destroy_qp(3), ibv_get_async_event(3): a QP destroyed with WRs outstanding releases them without completions, and destroying a QP or SRQ waits only for its unacknowledged events (the ibv package acknowledges each event as it reads it, so the destroy returns)",
		run:  destroyOutstanding,
	},
	{
		Name:        ProbeResetReuse,
		Rule:        "IBTA vol. 1 §10.3.1 (RESET empties the work queues without completions; a QP in RESET can be taken through INIT, RTR, RTS again): no completion of the QP's old life after RESET, and the reused QP works",
		run:         resetReuse,
		NeedsManual: "the QP is connected again by hand after RESET, and a QP the RDMA CM created connects once, through its own CM ID (rdma_create_qp, rdma_connect)",
		NotOnIWARP:  "the QP is connected again by hand after RESET, and an iWARP QP reaches RTS only through the connection manager (siw_qp_nextstate_from_idle in the kernel's drivers/infiniband/sw/siw/siw_qp.c refuses RTS without the connection's socket)",
	},
	{
		Name: ProbeFlushOrder,
		Rule: "IBTA vol. 1 ch. 10 (completions are ordered within a work queue, not between work queues sharing a CQ): whether one QP's flushes reach a shared CQ after another QP's later completion, the assumption a drain barrier batched across QPs would rest on",
		run:  flushOrder,
	},
	{
		Name:       ProbeSQD,
		Rule:       "ibv_get_async_event(3) (IBV_EVENT_SQ_DRAINED: the send queue was drained of outstanding messages in progress), IBTA vol. 1 §10.3.1 (SQD): SQ_DRAINED is raised only once no message is in progress",
		run:        sqd,
		NotOnIWARP: "siw maps SQD to its CLOSING state (ib_qp_state_to_siw_qp_state in the kernel's drivers/infiniband/sw/siw/siw_verbs.c), which closes the connection (siw_qp_nextstate_from_rts in siw_qp.c), and raises SQ_DRAINED from siw_sq_flush, when it flushed WRs; the probe's RNR-waiting sends do not exist on iWARP either (rnr-exhausted)",
	},
}

// flushOutstanding: three receives posted and three sends stuck behind an
// RNR (the peer has no receives, rnr_retry is infinite) when the QP enters
// ERROR.
func flushOutstanding(e *env) (verdict, error) {
	const n = 3
	nSend := n
	if e.iwarp {
		nSend = 0 // no RNR holds a send outstanding (rnr-exhausted)
	}
	_, a, _, err := e.outstanding(n, nSend)
	if err != nil {
		return verdict{}, err
	}
	early, err := e.poll(a.SendCQ(), n+nSend, 0)
	if err != nil {
		return verdict{}, err
	}
	if err := e.toError(a); err != nil {
		return verdict{}, err
	}
	wcs, err := e.poll(a.SendCQ(), n+nSend-len(early), e.o.Timeout)
	if err != nil {
		return verdict{}, err
	}
	wcs = append(early, wcs...)
	var sent, recvd []ibv.WC
	for _, wc := range wcs {
		if wc.ID >= recvBase {
			recvd = append(recvd, wc)
		} else {
			sent = append(sent, wc)
		}
	}
	okS, whyS := checkFlushed("sends", ids(sendBase, nSend), sent, a.Num())
	okR, whyR := checkFlushed("receives", ids(recvBase, n), recvd, a.Num())
	if okS && okR {
		return pass("%d outstanding sends and %d receives completed with WR_FLUSH_ERR in post order within %v of ERROR", nSend, n, e.since()), nil
	}
	var why []string
	for _, w := range []string{whyS, whyR} {
		if w != "" {
			why = append(why, w)
		}
	}
	return deviation("within %v of ERROR: %s", e.o.Timeout, strings.Join(why, "; ")), nil
}

// postInError moves a connected QP to ERROR, posts one send or receive and
// waits for its completion.
func postInError(e *env, send bool) (verdict, error) {
	_, a, _, err := e.connected(rcsetup.DefaultRetry)
	if err != nil {
		return verdict{}, err
	}
	if err := e.toError(a); err != nil {
		return verdict{}, err
	}
	return postOneInError(e, a, send)
}

func postOneInError(e *env, qp ibv.QP, send bool) (verdict, error) {
	// Let the device finish what entering ERROR started before posting,
	// as a drain does: a post that races the provider's own flush of the
	// QP can be flushed by it and hide a provider that never flushes
	// later posts by itself (rxe on Linux 6.12 does both, by timing).
	if err := e.sleep(e.o.settle()); err != nil {
		return verdict{}, err
	}
	what, id := "receive", recvBase
	e.mark()
	if send {
		what, id = "send", sendBase
		if err := e.postSend(qp, sends(id, 1)); err != nil {
			return verdict{}, fmt.Errorf("posting a send in ERROR: %w", err)
		}
	} else if err := e.postRecv(qp, e.recvs(id, 1)); err != nil {
		return verdict{}, fmt.Errorf("posting a receive in ERROR: %w", err)
	}
	wcs, err := e.poll(qp.SendCQ(), 1, e.o.Timeout)
	if err != nil {
		return verdict{}, err
	}
	if len(wcs) == 0 {
		if !send {
			return kickReceive(e, qp)
		}
		return deviation("the %s posted in ERROR never completed (waited %v)", what, e.o.Timeout), nil
	}
	if ok, why := checkFlushed(what, []uint64{id}, wcs, qp.Num()); !ok {
		return deviation("%s", why), nil
	}
	return pass("the %s posted in ERROR completed with WR_FLUSH_ERR %v after the post", what, e.since()), nil
}

// deferredFlush marks the observation of a receive posted in ERROR that
// completed only once a later post kicked the QP.
const deferredFlush = "flushed only after a later post"

// kickReceive tells a receive posted in ERROR that is never flushed from
// one whose flush waits for something else to happen on the QP (soft's
// RecvInErrorFlushDeferred): it posts a send behind it and waits again.
// Either way the receive did not complete by itself: a deviation.
func kickReceive(e *env, qp ibv.QP) (verdict, error) {
	e.mark()
	if err := e.postSend(qp, sends(sendBase, 1)); err != nil {
		return verdict{}, fmt.Errorf("posting a send behind the receive: %w", err)
	}
	wcs, err := e.poll(qp.SendCQ(), 1, e.o.Timeout)
	if err != nil {
		return verdict{}, err
	}
	if len(wcs) == 1 {
		// Once the send's flush is in, the device has acted on the QP in
		// ERROR after the receive was posted: a receive flushed by that
		// comes with it, so it gets Quiet more; a receive that came first
		// leaves the send a Timeout.
		wait := e.o.Timeout
		if wcs[0].ID != recvBase {
			wait = e.o.Quiet
		}
		more, err := e.poll(qp.SendCQ(), 1, wait)
		if err != nil {
			return verdict{}, err
		}
		wcs = append(wcs, more...)
	}
	after := e.since()
	recv, send := "never", "never"
	for _, wc := range wcs {
		if wc.ID == recvBase {
			recv = wc.Status.String()
		} else {
			send = wc.Status.String()
		}
	}
	if recv == ibv.WCWRFlushErr.String() {
		return deviation("the receive posted in ERROR did not complete within %v; a send posted behind it completed (%s) and the receive with it (WR_FLUSH_ERR): %s",
			e.o.Timeout, send, deferredFlush), nil
	}
	return deviation("the receive posted in ERROR never completed (waited %v, then %v more after posting a send behind it; receive: %s, send: %s)",
		e.o.Timeout, after, recv, send), nil
}

func sendInError(e *env) (verdict, error) { return postInError(e, true) }

func recvInError(e *env) (verdict, error) { return postInError(e, false) }

// flushBeforeRTS: a QP goes RESET -> INIT -> RTR -> ERROR, then a send is
// posted.
func flushBeforeRTS(e *env) (verdict, error) {
	pd, err := e.pd()
	if err != nil {
		return verdict{}, err
	}
	a, err := e.rc(pd)
	if err != nil {
		return verdict{}, err
	}
	b, err := e.rc(pd)
	if err != nil {
		return verdict{}, err
	}
	r, err := e.loopback()
	if err != nil {
		return verdict{}, err
	}
	// An iWARP QP goes no further than INIT by hand: siw leaves a QP
	// moved to RTR in IDLE (siw_qp_nextstate_from_idle in the kernel's
	// drivers/infiniband/sw/siw/siw_qp.c), so it is taken from INIT.
	from := ibv.QPSRTR
	if e.iwarp {
		from = ibv.QPSInit
	}
	if err := e.verb(fmt.Sprintf("ibv_modify_qp on QP %d to %s (rcsetup)", a.Num(), from), func() error { return r.Bring(a, b.Num(), from) }); err != nil {
		return verdict{}, err
	}
	if err := e.toError(a); err != nil {
		return verdict{}, err
	}
	v, err := postOneInError(e, a, true)
	v.observed = fmt.Sprintf("QP moved %s -> ERROR, never in RTS: %s", from, v.observed)
	return v, err
}

// lastWQEReached: two QPs on one SRQ with receives posted; one enters
// ERROR.
func lastWQEReached(e *env) (verdict, error) {
	srq, qps, err := e.onSRQ(2)
	if err != nil {
		return verdict{}, err
	}
	a, sibling := qps[0], qps[1]
	if err := e.postSRQRecv(srq, e.recvs(recvBase, 4)); err != nil {
		return verdict{}, fmt.Errorf("posting receives to the SRQ: %w", err)
	}
	if err := e.toError(a); err != nil {
		return verdict{}, err
	}
	isLast := isLastWQE(a)
	evs, err := e.eventsThrough(isLast)
	if err != nil {
		return verdict{}, err
	}
	var onQP, onSibling int
	var first event
	var other []string
	for _, ev := range evs {
		switch {
		case isLast(ev.AsyncEvent):
			if onQP == 0 {
				first = ev
			}
			onQP++
		case ev.Type == ibv.EventQPLastWQEReached && ev.QP == sibling:
			onSibling++
		default:
			other = append(other, fmt.Sprintf("%s at +%v", ev.AsyncEvent, ev.at))
		}
	}
	var b strings.Builder
	switch onQP {
	case 0:
		fmt.Fprintf(&b, "no Last WQE Reached within %v of ERROR", e.o.Timeout)
	case 1:
		fmt.Fprintf(&b, "Last WQE Reached on the QP %v after ERROR, once", first.at)
	default:
		fmt.Fprintf(&b, "Last WQE Reached on the QP %d times (first %v after ERROR)", onQP, first.at)
	}
	if onSibling > 0 {
		fmt.Fprintf(&b, "; %d on the sibling QP of the SRQ, which stayed in RTS", onSibling)
	} else if onQP > 0 {
		b.WriteString("; none on the sibling QP of the SRQ")
	}
	if len(other) > 0 {
		fmt.Fprintf(&b, "; other events: %s", strings.Join(other, ", "))
	}
	if onQP == 1 && onSibling == 0 {
		return pass("%s", b.String()), nil
	}
	return deviation("%s", b.String()), nil
}

// lastWQERepeat: an SRQ QP in ERROR, once its Last WQE Reached has come,
// is moved to ERROR again, gets a send posted, and its SRQ a receive.
func lastWQERepeat(e *env) (verdict, error) {
	srq, qps, err := e.onSRQ(1)
	if err != nil {
		return verdict{}, err
	}
	a := qps[0]
	if err := e.postSRQRecv(srq, e.recvs(recvBase, 2)); err != nil {
		return verdict{}, fmt.Errorf("posting receives to the SRQ: %w", err)
	}
	if err := e.toError(a); err != nil {
		return verdict{}, err
	}
	isLast := isLastWQE(a)
	first, err := e.events(e.o.Timeout, isLast)
	if err != nil {
		return verdict{}, err
	}
	if !hasEvent(first, isLast) {
		return deviation("no Last WQE Reached within %v of ERROR, so no repeat can be observed", e.o.Timeout), nil
	}
	at := first[len(first)-1].at
	steps := []struct {
		what string
		do   func() error
	}{
		{"by itself", func() error { return nil }},
		{"after a second modify to ERROR", func() error { return e.modify(a, ibv.QPAttr{State: ibv.QPSErr}, ibv.QPAttrState) }},
		{"after a send posted in ERROR", func() error { return e.postSend(a, sends(sendBase, 1)) }},
		{"after a receive posted to the SRQ", func() error { return e.postSRQRecv(srq, e.recvs(recvBase+2, 1)) }},
	}
	repeats := 0
	parts := []string{fmt.Sprintf("Last WQE Reached %v after ERROR", at)}
	for _, s := range steps {
		if err := s.do(); err != nil {
			return verdict{}, fmt.Errorf("QP %d in ERROR %s: %w", a.Num(), s.what, err)
		}
		e.mark()
		evs, err := e.events(e.o.Quiet, nil)
		if err != nil {
			return verdict{}, err
		}
		k := 0
		for _, ev := range evs {
			if isLast(ev.AsyncEvent) {
				k++
			}
		}
		repeats += k
		if k > 0 {
			parts = append(parts, fmt.Sprintf("again %s (%d, first +%v)", s.what, k, evs[0].at))
		} else {
			parts = append(parts, fmt.Sprintf("not again %s", s.what))
		}
	}
	obs := strings.Join(parts, "; ") + fmt.Sprintf(" (each watched %v)", e.o.Quiet)
	if repeats > 0 {
		return deviation("%s", obs), nil
	}
	return pass("%s", obs), nil
}

// drainWR: a drain.Reaper drains a connected QP with two receives
// outstanding.
func drainWR(e *env) (verdict, error) {
	_, a, _, err := e.outstanding(2, 0)
	if err != nil {
		return verdict{}, err
	}
	rep, err := e.drain(a)
	if rep == nil {
		return verdict{}, err
	}
	flushed := rep.Flushed[report.QueueRecv].Flushed
	switch {
	case err == nil && rep.Outcome == report.Safe:
		return pass("drain WR completed, QP safe to destroy after %v (%d of 2 receives flushed before it)", roundDur(rep.Duration()), flushed), nil
	case errors.Is(err, drain.ErrDrainNotFlushed):
		return deviation("drain WR never completed (waited %v); the drain ended %s (%d of 2 receives flushed)", e.o.Timeout, rep.Outcome, flushed), nil
	case err == nil:
		return verdict{}, fmt.Errorf("draining QP %d: outcome %s, want safe", a.Num(), rep.Outcome)
	}
	return verdict{}, fmt.Errorf("draining QP %d: %w", a.Num(), err)
}

// drain drains qp, whose two receives are outstanding, on the probe's
// clock (DrainAll feeds its reaper, then lets simulated time pass). It
// returns qp's report and the error that says qp is not safe to destroy; a
// nil report means the drain could not start.
func (e *env) drain(qp ibv.QP) (*report.Report, error) {
	// The two receives are counted back: the probe is about the send drain
	// WR, and a receive drain WR needs a receive posted in ERROR flushed,
	// which is the recv-in-error probe's finding.
	reps, err := drain.DrainAll(e.ctx, []ibv.QP{qp}, drain.AddOptions{CountRecvs: true, Recvs: 2}, drain.Options{
		LastWQETimeout: e.o.Timeout,
		DrainTimeout:   e.o.Timeout,
		Queue:          drain.QueueByIDPrefix(8, recvBase, sendBase),
		Clock:          e.clk,
	}, drain.Feed{})
	if len(reps) == 0 {
		return nil, fmt.Errorf("draining QP %d: %w", qp.Num(), err)
	}
	return reps[0], err
}

// responderAccessError: an RDMA WRITE to memory registered without remote
// write access, with two receives posted at the responder.
func responderAccessError(e *env) (verdict, error) {
	pd, a, b, err := e.connected(rcsetup.DefaultRetry)
	if err != nil {
		return verdict{}, err
	}
	local, err := e.buffer(pd, 4096, ibv.AccessLocalWrite)
	if err != nil {
		return verdict{}, err
	}
	closed, err := e.buffer(pd, 4096, ibv.AccessLocalWrite)
	if err != nil {
		return verdict{}, err
	}
	if err := e.postRecv(b, e.recvs(recvBase, 2)); err != nil {
		return verdict{}, fmt.Errorf("posting receives at the responder: %w", err)
	}
	write := ibv.SendWR{ID: sendBase, Opcode: ibv.WRRDMAWrite, Flags: ibv.SendSignaled,
		SGL:        []ibv.SGE{{Addr: local.Addr(), Length: 8, LKey: local.LKey()}},
		RemoteAddr: closed.Addr(), RKey: closed.RKey()}
	unread, err := e.stateUnread(b)
	if err != nil {
		return verdict{}, err
	}
	e.mark()
	if err := e.postSend(a, []ibv.SendWR{write}); err != nil {
		return verdict{}, fmt.Errorf("posting the RDMA WRITE: %w", err)
	}
	var b2 strings.Builder
	req, err := e.poll(a.SendCQ(), 1, e.o.Timeout)
	if err != nil {
		return verdict{}, err
	}
	if len(req) == 0 {
		fmt.Fprintf(&b2, "requester: no completion within %v", e.o.Timeout)
	} else {
		fmt.Fprintf(&b2, "requester: %s", req[0].Status)
	}
	// A requester's completion says the responder has already found the
	// access violation: it answers the WRITE with a Remote Access Error
	// NAK (IBTA vol. 1 Table 58, class C; rxe_resp.c, do_class_ac_error)
	// as it finds it, and its event owes nothing to a timer, so it gets
	// Quiet from then. Without that completion it gets Timeout.
	evWait := e.o.Timeout
	if len(req) > 0 {
		evWait = e.o.Quiet
	}
	onResponder := func(ev ibv.AsyncEvent) bool { return ev.QP == b }
	evs, err := e.events(evWait, onResponder)
	if err != nil {
		return verdict{}, err
	}
	var got *event
	var other []string
	for i, ev := range evs {
		if onResponder(ev.AsyncEvent) {
			got = &evs[i]
		} else {
			other = append(other, fmt.Sprintf("%s at +%v", ev.AsyncEvent, ev.at))
		}
	}
	// The state is read once the receives' flushes are in: siw raises the
	// event before it moves the QP to ERROR (read right after the event,
	// siw0 on Linux 6.12 and 7.3 was still in RTS), and the flushes come
	// with that move.
	flushed, err := e.poll(b.RecvCQ(), 2, e.o.Timeout)
	if err != nil {
		return verdict{}, err
	}
	st, stName, err := e.stateOrUnread(b, unread)
	if err != nil {
		return verdict{}, err
	}
	b2.WriteString("; responder: ")
	if got == nil {
		fmt.Fprintf(&b2, "no async event within %v", evWait)
	} else {
		fmt.Fprintf(&b2, "%s %v after the WRITE", got.Type, got.at)
	}
	nFlushed := withStatus(flushed, ibv.WCWRFlushErr)
	fmt.Fprintf(&b2, ", state %s, %d of 2 receives flushed", stName, nFlushed)
	if len(other) > 0 {
		fmt.Fprintf(&b2, "; other events: %s", strings.Join(other, ", "))
	}
	inError := st == ibv.QPSErr
	if unread != "" {
		// Only a QP in ERROR flushes its receives (IBTA vol. 1 §10.3.1).
		inError = nFlushed == 2
		fmt.Fprintf(&b2, "; %s: ERROR judged from the flushed receives", unread)
	}
	if got != nil && got.Type == ibv.EventQPAccessErr && inError {
		return pass("%s", b2.String()), nil
	}
	return deviation("%s", b2.String()), nil
}

package flushcheck

import (
	"fmt"
	"strings"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/rcsetup"
)

// reuseBase tags the WRs of a QP's second life in reset-reuse.
const reuseBase uint64 = 0x300

// destroyOutstanding: QP a is destroyed in RTS with three sends waiting on
// an RNR (its peer has no receive; rnr_retry is infinite); QP s, on an SRQ
// whose limit event was raised, is destroyed in ERROR (Last WQE Reached,
// where the provider raises it) before the probe has read any event.
func destroyOutstanding(e *env) (verdict, error) {
	pd, a, _, err := e.connected(rcsetup.DefaultRetry)
	if err != nil {
		return verdict{}, err
	}
	srq, err := e.srq(pd)
	if err != nil {
		return verdict{}, err
	}
	s, peer, err := e.pair(pd, srq)
	if err != nil {
		return verdict{}, err
	}
	if err := e.postSRQRecv(srq, e.recvs(recvBase, 2)); err != nil {
		return verdict{}, fmt.Errorf("posting receives to the SRQ: %w", err)
	}
	if err := e.verb("ibv_modify_srq", func() error { return srq.Modify(ibv.SRQAttr{SRQLimit: 2}, ibv.SRQAttrLimit) }); err != nil {
		return verdict{}, fmt.Errorf("arming the SRQ limit: %w", err)
	}
	// One SEND takes an SRQ WQE, which leaves fewer than the limit.
	if err := e.postSend(peer, sends(sendBase+8, 1)); err != nil {
		return verdict{}, fmt.Errorf("posting a send to the SRQ QP: %w", err)
	}
	if got, err := e.poll(s.RecvCQ(), 1, e.o.Timeout); err != nil || len(got) == 0 {
		if err == nil {
			err = fmt.Errorf("the SRQ QP received nothing within %v", e.o.Timeout)
		}
		return verdict{}, err
	}
	// On iWARP no RNR holds a send outstanding (rnr-exhausted): a holds
	// three receives instead.
	what := "sends"
	if e.iwarp {
		what = "receives"
		err = e.postRecv(a, e.recvs(sendBase, 3))
	} else {
		err = e.postSend(a, sends(sendBase, 3))
	}
	if err != nil {
		return verdict{}, fmt.Errorf("posting %s: %w", what, err)
	}
	if err := e.toError(s); err != nil {
		return verdict{}, err
	}
	// Let the events reach the context's event reader, unread by the probe.
	if err := e.sleep(e.o.Quiet); err != nil {
		return verdict{}, err
	}
	early, err := e.poll(a.SendCQ(), 3, 0)
	if err != nil {
		return verdict{}, err
	}
	aNum, sNum := a.Num(), s.Num()
	var obs []string
	tookA, err := e.destroy(fmt.Sprintf("ibv_destroy_qp on QP %d", aNum), a)
	if err != nil {
		return verdict{}, err
	}
	tookS, err := e.destroy(fmt.Sprintf("ibv_destroy_qp on QP %d", sNum), s)
	if err != nil {
		return verdict{}, err
	}
	tookSRQ, err := e.destroy("ibv_destroy_srq", srq)
	if err != nil {
		return verdict{}, err
	}
	obs = append(obs, fmt.Sprintf("qpn %d destroyed in RTS with %d of 3 %s completed before (%s) in %v",
		aNum, len(early), what, wcList(early, aNum), tookA))
	e.mark()
	late, err := e.poll(a.SendCQ(), 3, e.o.Quiet)
	if err != nil {
		return verdict{}, err
	}
	evs, err := e.events(e.o.Quiet, nil)
	if err != nil {
		return verdict{}, err
	}
	var names []string
	for _, ev := range evs {
		names = append(names, ev.Type.String())
	}
	unread := "no event of theirs was raised, so the acknowledgement rule was not exercised"
	if len(names) > 0 {
		unread = fmt.Sprintf("their events read after the destroy: %s", strings.Join(names, ", "))
	}
	obs = append(obs, fmt.Sprintf("SRQ qpn %d destroyed in ERR in %v and its SRQ in %v before the probe read any event (%s)", sNum, tookS, tookSRQ, unread))
	bound := e.o.Timeout
	switch {
	case len(late) > 0:
		return deviation("%s; after the destroy its CQ returned %s within %v", strings.Join(obs, "; "), wcList(late, aNum), e.o.Quiet), nil
	case tookS > bound || tookSRQ > bound || tookA > bound:
		return deviation("%s; a destroy took longer than %v", strings.Join(obs, "; "), bound), nil
	}
	return pass("%s; nothing of qpn %d on its CQ within %v after", strings.Join(obs, "; "), aNum, e.o.Quiet), nil
}

// resetReuse: a QP with two receives and two RNR-waiting sends enters
// ERROR; once their flushes are polled it goes to RESET and is connected
// again, to a new peer, and used.
func resetReuse(e *env) (verdict, error) {
	pd, a, _, err := e.outstanding(2, 2)
	if err != nil {
		return verdict{}, err
	}
	if err := e.toError(a); err != nil {
		return verdict{}, err
	}
	old, err := e.poll(a.SendCQ(), 4, e.o.Timeout)
	if err != nil {
		return verdict{}, err
	}
	tookOld := e.since()
	if err := e.modify(a, ibv.QPAttr{State: ibv.QPSReset}, ibv.QPAttrState); err != nil {
		return verdict{}, fmt.Errorf("moving QP %d to RESET: %w", a.Num(), err)
	}
	e.mark()
	afterReset, err := e.poll(a.SendCQ(), 4, e.o.Quiet)
	if err != nil {
		return verdict{}, err
	}
	c, err := e.rc(pd)
	if err != nil {
		return verdict{}, err
	}
	if err := e.connect(a, c, rcsetup.DefaultRetry); err != nil {
		return verdict{}, fmt.Errorf("reusing the QP after RESET: %w", err)
	}
	if err := e.postRecv(c, e.recvs(reuseBase, 1)); err != nil {
		return verdict{}, fmt.Errorf("posting a receive at the new peer: %w", err)
	}
	if err := e.postSend(a, sends(reuseBase, 1)); err != nil {
		return verdict{}, fmt.Errorf("posting a send on the reused QP: %w", err)
	}
	used, err := e.poll(a.SendCQ(), 1, e.o.Timeout)
	if err != nil {
		return verdict{}, err
	}
	more, err := e.poll(a.SendCQ(), 4, e.o.Quiet)
	if err != nil {
		return verdict{}, err
	}
	used = append(used, more...)
	var fresh, stale []ibv.WC
	for _, wc := range used {
		if wc.ID == reuseBase {
			fresh = append(fresh, wc)
		} else {
			stale = append(stale, wc)
		}
	}
	stale = append(afterReset, stale...)
	obs := fmt.Sprintf("in ERR %d of 4 WRs flushed (%v); after RESET: %s; reused (RTS to a new peer), a send completed %s",
		len(old), tookOld, wcList(stale, a.Num()), wcList(fresh, a.Num()))
	switch {
	case len(stale) > 0:
		return deviation("%s: completions of the QP's old life after RESET", obs), nil
	case len(fresh) != 1 || fresh[0].Status != ibv.WCSuccess:
		return deviation("%s: want one SUCCESS", obs), nil
	}
	return pass("%s", obs), nil
}

// sqd: two sends wait on an RNR (the peer has no receive, rnr_retry is
// infinite) when the QP moves RTS -> SQD asking for SQ_DRAINED; then the
// peer posts receives.
func sqd(e *env) (verdict, error) {
	_, a, b, err := e.outstanding(0, 2)
	if err != nil {
		return verdict{}, err
	}
	if err := e.sleep(e.o.settle()); err != nil {
		return verdict{}, err
	}
	e.mark()
	if err := e.modify(a, ibv.QPAttr{State: ibv.QPSSQD, EnSQDAsyncNotify: true}, ibv.QPAttrState|ibv.QPAttrEnSQDAsyncNotify); err != nil {
		return verdict{}, fmt.Errorf("moving QP %d to SQD: %w", a.Num(), err)
	}
	isDrained := func(ev ibv.AsyncEvent) bool { return ev.Type == ibv.EventSQDrained && ev.QP == a }
	early, err := e.events(e.o.Quiet, isDrained)
	if err != nil {
		return verdict{}, err
	}
	st, err := e.state(a)
	if err != nil {
		return verdict{}, err
	}
	// The sends wait for the requester's next RNR retry, one RNR NAK timer
	// of the peer's min_rnr_timer away (IBTA vol. 1 ch. 9.7; rxe_comp.c
	// arms rnr_nak_timer with it): with the receives posted, a send in
	// progress completes one timer and a round trip later, so the wait is
	// the timer and Quiet, not a Timeout of its own.
	resp, err := e.queryRetry(b, ibv.QPAttrMinRNRTimer)
	if err != nil {
		return verdict{}, err
	}
	e.mark()
	if err := e.postRecv(b, e.recvs(recvBase, 2)); err != nil {
		return verdict{}, fmt.Errorf("posting receives at the peer: %w", err)
	}
	wcs, err := e.poll(a.SendCQ(), 2, rnrTimer(resp.MinRNRTimer)+e.o.Quiet)
	if err != nil {
		return verdict{}, err
	}
	done := e.since()
	var late []event
	if !hasEvent(early, isDrained) {
		if late, err = e.events(e.o.Timeout, isDrained); err != nil {
			return verdict{}, err
		}
	}
	obs := fmt.Sprintf("in %s with 2 sends RNR-waiting: %s within %v; once the peer posted receives: sends %s by %v, ",
		st, eventList(early), e.o.Quiet, wcList(wcs, a.Num()), done)
	switch {
	case hasEvent(early, isDrained):
		return deviation("%sSQ_DRAINED already raised while a send was in progress", obs), nil
	case !hasEvent(late, isDrained):
		return deviation("%sno SQ_DRAINED within %v", obs, e.o.Timeout), nil
	}
	return pass("%sSQ_DRAINED +%v after the receives", obs, late[len(late)-1].at), nil
}

func hasEvent(evs []event, match func(ibv.AsyncEvent) bool) bool {
	for _, ev := range evs {
		if match(ev.AsyncEvent) {
			return true
		}
	}
	return false
}

// eventList formats events as "[SQ_DRAINED qpn=5 at +1ms], as ibv.AsyncEvent prints them".
func eventList(evs []event) string {
	if len(evs) == 0 {
		return "no event"
	}
	parts := make([]string, len(evs))
	for i, ev := range evs {
		parts[i] = fmt.Sprintf("%s at +%v", ev.AsyncEvent, ev.at)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

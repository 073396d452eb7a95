package flushcheck

import (
	"fmt"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/rcsetup"
)

// ackTimeout is the local ACK timeout a QP's timeout attribute encodes:
// 4.096 µs × 2^timeout (IBTA vol. 1 ch. 9.7, the transport timer; the
// timeout attribute of ibv_modify_qp(3)).
func ackTimeout(code uint8) time.Duration { return 4096 * time.Nanosecond << code }

// rnrTimers are the RNR NAK timer values min_rnr_timer encodes, in µs
// (the AETH RNR timer encoding of IBTA vol. 1 ch. 9.7, as rnrnak_usec in
// the kernel's drivers/infiniband/sw/rxe/rxe_comp.c; code 0 is the longest,
// 655.36 ms).
var rnrTimers = [32]int64{655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
	2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520}

func rnrTimer(code uint8) time.Duration { return time.Duration(rnrTimers[code&31]) * time.Microsecond }

// The retry attributes peer-gone and rnr-exhausted set, for budgets of
// 12.6 ms and 15.4 ms: short, so that the probes stay quick, and long
// enough (several jiffies) that a provider that does not wait them out
// shows it. The probes judge by what the device reports it holds.
var (
	peerGoneRetry = rcsetup.Retry{Timeout: 10, RetryCnt: 2, RNRRetry: 7, MinRNRTimer: 12}
	rnrRetry      = rcsetup.Retry{Timeout: 14, RetryCnt: 7, RNRRetry: 3, MinRNRTimer: 18}
)

// retrySeries is how a requester fails a send no one takes, as the device
// reports the QP attributes that set it: timers retry timers of timer each
// (IBTA vol. 1 ch. 9.7), then the error completion.
type retrySeries struct {
	timers int
	timer  time.Duration
	why    string // the attributes, for the observation
}

// budget is the time the series takes: the error completion may come no
// sooner.
func (r retrySeries) budget() time.Duration { return roundDur(time.Duration(r.timers) * r.timer) }

// wait bounds the wait for the error completion: the series, then one
// Timeout of margin per timer, and never less than retryLateness. Each
// timer fires late by the machine's scheduling delay and the lateness adds
// up over the series (the soft device on real time on a loaded machine:
// 66 ms for rnr-exhausted's 15.4 ms, more than 300 ms for peer-gone's
// 12.6 ms, with -race tests and a VM sharing two cores), so a short Timeout
// alone would report a slow machine as a missing completion. The wait
// costs nothing on a provider that ends the series: it ends at the
// completion.
func (r retrySeries) wait(timeout time.Duration) time.Duration {
	return r.budget() + max(time.Duration(r.timers)*timeout, retryLateness)
}

// retryLateness is the least margin a retry series gets past its budget.
const retryLateness = 2 * time.Second

// queryRetry returns qp's attributes in mask, as the device holds them.
func (e *env) queryRetry(qp ibv.QP, mask ibv.QPAttrMask) (ibv.QPAttr, error) {
	attr, err := e.query(qp, mask)
	if err != nil {
		return attr, fmt.Errorf("querying QP %d's retry attributes: %w", qp.Num(), err)
	}
	return attr, nil
}

// requesterError posts three sends on a connected QP whose peer will not
// take them and judges what completes: the first with status want, no
// sooner than the series' budget after the post and within its wait, the
// other two flushed behind it, and the QP in ERROR.
func requesterError(e *env, a ibv.QP, want ibv.WCStatus, r retrySeries) (verdict, error) {
	const n = 3
	budget, wait := r.budget(), r.wait(e.o.Timeout)
	e.mark()
	if err := e.postSend(a, sends(sendBase, n)); err != nil {
		return verdict{}, fmt.Errorf("posting sends: %w", err)
	}
	first, err := e.poll(a.SendCQ(), 1, wait)
	if err != nil {
		return verdict{}, err
	}
	if len(first) == 0 {
		return deviation("no completion within %v of posting %d sends (retry budget %v: %s)", wait, n, budget, r.why), nil
	}
	took := e.since()
	rest, err := e.poll(a.SendCQ(), n-1, e.o.Timeout)
	if err != nil {
		return verdict{}, err
	}
	st, err := e.state(a)
	if err != nil {
		return verdict{}, err
	}
	ok := first[0].ID == sendBase && first[0].Status == want && first[0].QPNum == a.Num()
	okRest, why := checkFlushed("the sends behind it", ids(sendBase+1, n-1), rest, a.Num())
	obs := fmt.Sprintf("first send completed %s %v after the post (retry budget %v: %s); %d behind it: %s; QP %s",
		first[0].Status, took, budget, r.why, n-1, wcList(rest, a.Num()), st)
	switch {
	case !ok:
		return deviation("%s; want wr_id %d %s", obs, sendBase, want), nil
	case !okRest:
		return deviation("%s; %s", obs, why), nil
	case st != ibv.QPSErr:
		return deviation("%s; want the QP in ERR", obs), nil
	case took < budget:
		return deviation("%s: sooner than its retry budget", obs), nil
	}
	return pass("%s", obs), nil
}

// peerGone: the responder QP is destroyed before three sends are posted;
// no one answers them.
func peerGone(e *env) (verdict, error) {
	_, a, b, err := e.connected(peerGoneRetry)
	if err != nil {
		return verdict{}, err
	}
	if _, err := e.destroy(fmt.Sprintf("ibv_destroy_qp on QP %d", b.Num()), b); err != nil {
		return verdict{}, fmt.Errorf("destroying the responder: %w", err)
	}
	attr, err := e.queryRetry(a, ibv.QPAttrTimeout|ibv.QPAttrRetryCnt)
	if err != nil {
		return verdict{}, err
	}
	t := ackTimeout(attr.Timeout)
	v, err := requesterError(e, a, ibv.WCRetryExcErr, retrySeries{timers: int(attr.RetryCnt) + 1, timer: t,
		why: fmt.Sprintf("retry_cnt %d + 1 local ACK timeouts of %v (timeout %d)", attr.RetryCnt, roundDur(t), attr.Timeout)})
	v.observed = "responder QP destroyed: " + v.observed
	return v, err
}

// rnrInfinite is the rnr_retry that means "retry forever" (ibv_modify_qp(3)).
const rnrInfinite = 7

// rnrExhausted: the responder has no receive posted and the requester a
// finite rnr_retry. The RNR NAK carries the responder's min_rnr_timer.
func rnrExhausted(e *env) (verdict, error) {
	_, a, b, err := e.connected(rnrRetry)
	if err != nil {
		return verdict{}, err
	}
	req, err := e.queryRetry(a, ibv.QPAttrRNRRetry)
	if err != nil {
		return verdict{}, err
	}
	resp, err := e.queryRetry(b, ibv.QPAttrMinRNRTimer)
	if err != nil {
		return verdict{}, err
	}
	if req.RNRRetry >= rnrInfinite {
		return deviation("no receive at the responder: the requester reports rnr_retry %d (retry forever) where %d was set", req.RNRRetry, rnrRetry.RNRRetry), nil
	}
	t := rnrTimer(resp.MinRNRTimer)
	v, err := requesterError(e, a, ibv.WCRNRRetryExcErr, retrySeries{timers: int(req.RNRRetry), timer: t,
		why: fmt.Sprintf("rnr_retry %d RNR NAK timers of %v (min_rnr_timer %d)", req.RNRRetry, roundDur(t), resp.MinRNRTimer)})
	v.observed = "no receive at the responder: " + v.observed
	return v, err
}

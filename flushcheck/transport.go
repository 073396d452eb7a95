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

// The retry budgets of peer-gone (12.6 ms) and rnr-exhausted (15.4 ms):
// short enough to be observed within MinTimeout, long enough (several
// jiffies, and more than a loaded machine's scheduling delay) that a
// provider that does not wait them out shows it.
var (
	peerGoneRetry = rcsetup.Retry{Timeout: 10, RetryCnt: 2, RNRRetry: 7, MinRNRTimer: 12}
	rnrRetry      = rcsetup.Retry{Timeout: 14, RetryCnt: 7, RNRRetry: 3, MinRNRTimer: 18}
)

// requesterError posts three sends on a connected QP whose peer will not
// take them and judges what completes: the first with status want, no
// sooner than budget after the post, the other two flushed behind it, and
// the QP in ERROR.
func requesterError(e *env, a ibv.QP, want ibv.WCStatus, budget time.Duration, budgetWhy string) (verdict, error) {
	const n = 3
	e.mark()
	if err := a.PostSend(sends(sendBase, n)); err != nil {
		return verdict{}, fmt.Errorf("posting sends: %w", err)
	}
	first, err := e.poll(a.SendCQ(), 1, e.o.Timeout)
	if err != nil {
		return verdict{}, err
	}
	if len(first) == 0 {
		return deviation("no completion within %v of posting %d sends (retry budget %v: %s)", e.o.Timeout, n, budget, budgetWhy), nil
	}
	took := e.since()
	rest, err := e.poll(a.SendCQ(), n-1, e.o.Timeout)
	if err != nil {
		return verdict{}, err
	}
	st, err := state(a)
	if err != nil {
		return verdict{}, err
	}
	ok := first[0].ID == sendBase && first[0].Status == want && first[0].QPNum == a.Num()
	okRest, why := checkFlushed("the sends behind it", ids(sendBase+1, n-1), rest, a.Num())
	obs := fmt.Sprintf("first send completed %s %v after the post (retry budget %v: %s); %d behind it: %s; QP %s",
		first[0].Status, took, budget, budgetWhy, n-1, wcList(rest, a.Num()), st)
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
	rt := peerGoneRetry
	_, a, b, err := e.connected(rt)
	if err != nil {
		return verdict{}, err
	}
	if err := b.Close(); err != nil {
		return verdict{}, fmt.Errorf("destroying the responder QP %d: %w", b.Num(), err)
	}
	t := ackTimeout(rt.Timeout)
	budget := time.Duration(rt.RetryCnt+1) * t
	v, err := requesterError(e, a, ibv.WCRetryExcErr, roundDur(budget),
		fmt.Sprintf("retry_cnt %d + 1 local ACK timeouts of %v (timeout %d)", rt.RetryCnt, roundDur(t), rt.Timeout))
	v.observed = "responder QP destroyed: " + v.observed
	return v, err
}

// rnrExhausted: the responder has no receive posted and the requester a
// finite rnr_retry.
func rnrExhausted(e *env) (verdict, error) {
	rt := rnrRetry
	_, a, _, err := e.connected(rt)
	if err != nil {
		return verdict{}, err
	}
	t := rnrTimer(rt.MinRNRTimer)
	budget := time.Duration(rt.RNRRetry) * t
	v, err := requesterError(e, a, ibv.WCRNRRetryExcErr, roundDur(budget),
		fmt.Sprintf("rnr_retry %d RNR NAK timers of %v (min_rnr_timer %d)", rt.RNRRetry, roundDur(t), rt.MinRNRTimer))
	v.observed = "no receive at the responder: " + v.observed
	return v, err
}

package drain_test

import (
	"errors"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/soft"
)

// sendCountRig is a device that never completes a send posted in ERROR,
// as siw does on a user QP (its mapped send queue is read only while the
// QP is in RTS), and a QP on it with two signaled sends outstanding,
// which its peer (no receive posted) keeps waiting, and two receives.
func sendCountRig(t *testing.T) (*rig, ibv.QP) {
	t.Helper()
	r := quirkRig(t, soft.Quirks{SendInErrorNotFlushed: true})
	qp := r.pair(false)
	r.postRecvs(qp, 2)
	sends(t, qp, 0, 2)
	return r, qp
}

// Counted sends prove a send queue where no drain WR can: the two sends
// outstanding at ERROR come back flushed, and the QP is safe by its
// counts, with no drain WR posted.
func TestCountSends(t *testing.T) {
	r, qp := sendCountRig(t)
	rp := newReaper(t, r.cq, drain.Options{DrainTimeout: devtest.Timeout, Queue: queueOf})
	h := add(t, rp, qp, drain.AddOptions{CountRecvs: true, Recvs: 2, CountSends: true, Sends: 2})
	pollUntilDone(t, rp, r.cq)
	rep, err := h.Wait(testCtx(t))
	checkProof(t, rep)
	if err != nil || rep.Send.By != report.ProofSendCount || rep.Send.Count != 2 || rep.Recv.By != report.ProofRecvCount || has(rep, report.StepDrainPosted) {
		t.Errorf("%v: want safe by 2 sends and 2 receives counted back, no drain WR\n%s", err, rep)
	}
	if rep.Send.Stated {
		t.Errorf("a count proven past an empty poll reads as stated\n%s", rep)
	}
}

// A count too high is never a proof: one fewer back stalls the drain,
// and the stall follows the policy.
func TestCountSendsMissing(t *testing.T) {
	for _, tc := range []struct {
		policy drain.Policy
		want   report.Outcome
		errs   []error
	}{
		{drain.Quarantine, report.Quarantined, []error{drain.ErrQuarantined, drain.ErrSendsMissing}},
		{drain.DestroyWhenEmpty, report.DestroyedAfterEmptyCQ, nil},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			r, qp := sendCountRig(t)
			rp := newReaper(t, r.cq, drain.Options{Policy: tc.policy, DrainTimeout: stall, Queue: queueOf})
			h := add(t, rp, qp, drain.AddOptions{CountRecvs: true, Recvs: 2, CountSends: true, Sends: 3})
			startCaller(t, rp, r.cq, r.dev)
			rep, err := h.Wait(testCtx(t))
			checkProof(t, rep)
			wantErr(t, err, tc.errs...)
			if rep.Outcome != tc.want || rep.Send.Missing != report.MissingSends || rep.Send.Count != 2 || !errors.Is(rep.Stall, drain.ErrSendsMissing) {
				t.Errorf("%s, send queue %s, stall %v: want %s, 2 of the 3 counted sends back\n%s", rep.Outcome, rep.Send, rep.Stall, tc.want, rep)
			}
		})
	}
}

// A count too low that shows before the drain ends fails it: the second
// send's flush, with the receive still owed, is one more than counted,
// and the proof the first gave is withdrawn.
func TestCountExceeded(t *testing.T) {
	r := testRig(t)
	qp := r.pair(false)
	devtest.ToError(t, qp) // nothing posted: the device completes nothing
	rp := newReaper(t, r.cq, drain.Options{DrainTimeout: devtest.Timeout, Queue: queueOf})
	h := add(t, rp, qp, drain.AddOptions{CountRecvs: true, Recvs: 1, CountSends: true, Sends: 1, SoleQP: true,
		StateKnown: true, State: ibv.QPSErr})
	for i := range uint64(2) {
		rp.HandleWC(ibv.WC{ID: sendIDBase | i, QPNum: qp.Num(), Status: ibv.WCWRFlushErr})
	}
	rep, err := h.Wait(testCtx(t))
	checkProof(t, rep)
	wantErr(t, err, drain.ErrCountExceeded)
	if rep.Outcome != report.Failed || rep.Send.By != report.ProofNone || rep.Send.Missing != report.MissingCountExceeded || rep.Send.Count != 2 {
		t.Errorf("%s, send queue %s: want failed, the send queue unproven with 2 back\n%s", rep.Outcome, rep.Send, rep)
	}
}

// CountSends with Sends 0 states what NoSends states, and is recorded as
// that statement.
func TestCountNoSends(t *testing.T) {
	r := quirkRig(t, soft.Quirks{SendInErrorNotFlushed: true})
	qp := r.pair(false)
	rp := newReaper(t, r.cq, drain.Options{DrainTimeout: devtest.Timeout, Queue: queueOf})
	h := add(t, rp, qp, drain.AddOptions{CountRecvs: true, CountSends: true})
	pollUntilDone(t, rp, r.cq)
	if rep, err := h.Wait(testCtx(t)); err != nil || rep.Send.By != report.ProofNoSends {
		t.Errorf("%v: want safe, the send queue by %s\n%s", err, report.ProofNoSends, rep)
	}
}

// A QP the CM moved to ERROR has its flushes in the CQ before Add, so
// without the statement that it is the only QP on its CQ its counts are
// never trusted (a flush with its number may be an earlier QP's), and a
// device that completes no drain WR in ERROR leaves it quarantined; with
// the statement the counts prove it, and the report says they rested on
// it.
func TestCountAfterError(t *testing.T) {
	for _, sole := range []bool{false, true} {
		r, qp := sendCountRig(t)
		devtest.ToError(t, qp) // as rdma_disconnect does
		rp := newReaper(t, r.cq, drain.Options{DrainTimeout: stall, Queue: queueOf})
		h := add(t, rp, qp, drain.AddOptions{CountRecvs: true, Recvs: 2, CountSends: true, Sends: 2, SoleQP: sole,
			StateKnown: true, State: ibv.QPSErr})
		startCaller(t, rp, r.cq, r.dev)
		rep, err := h.Wait(testCtx(t))
		checkProof(t, rep)
		switch {
		case !sole && (rep.Outcome != report.Quarantined || !has(rep, report.StepCountNotTrusted) || rep.Send.By != report.ProofNone):
			t.Errorf("not stated the only QP: %v, want the counts not trusted and the QP quarantined\n%s", err, rep)
		case sole && (err != nil || rep.Send.By != report.ProofSendCount || !rep.Send.Stated || !rep.Recv.Stated || !has(rep, report.StepSoleQPStated)):
			t.Errorf("stated the only QP: %v, want safe by the counts, recorded as resting on the statement\n%s", err, rep)
		}
	}
}

// The rule SoleQP lifts, shown where it matters: an earlier QP with the
// same number left a receive's flush in the CQ, ahead of the new QP's two.
// Counted without the statement, that flush makes the count untrusted and
// a receive drain WR proves the receive queue where the device completes
// one (elsewhere the drain ends unproven); counted with it (a false
// statement, here the control) the stale flush and the QP's first pass
// the count while its second receive is still owed: the false safe the
// rule exists to prevent.
func TestStaleCompletionNoCount(t *testing.T) {
	for _, sole := range []bool{false, true} {
		r := testRig(t)
		qp := r.pair(false)
		r.postRecvs(qp, 2)
		devtest.ToError(t, qp)
		rp := newReaper(t, r.cq, drain.Options{DrainTimeout: 2 * time.Second, Queue: queueOf})
		h := add(t, rp, qp, drain.AddOptions{CountRecvs: true, Recvs: 2, NoSends: true, SoleQP: sole,
			StateKnown: true, State: ibv.QPSErr})
		time.Sleep(time.Millisecond) // the next poll begins after the Add
		rp.HandleWC(recvFlush(qp.Num()))
		pollUntilDone(t, rp, r.cq)
		rep, _ := h.Wait(testCtx(t))
		checkProof(t, rep)
		counted := rep.Recv.By == report.ProofRecvCount
		switch {
		case !sole && (counted || rep.Outcome == report.Safe && rep.Recv.By != report.ProofRecvDrainWR || !has(rep, report.StepCountNotTrusted)):
			t.Errorf("a stale completion with the QP's number: want the count not trusted, safe only by a receive drain WR\n%s", rep)
		case sole && !counted:
			t.Errorf("control: the stale completion did not make a trusted count pass, so the test proves nothing\n%s", rep)
		}
	}
}

// What the reaper can check of SoleQP it checks: a QP added beside one
// stated alone on the CQ, or stated alone beside one already added, is
// refused; a completion of another QP while the stated QP counts fails
// its drain, since an earlier QP's completions come before its own and
// the count may have taken some.
func TestSoleQPContradicted(t *testing.T) {
	sole := drain.AddOptions{CountRecvs: true, Recvs: 1, CountSends: true, SoleQP: true, StateKnown: true, State: ibv.QPSErr}
	r := testRig(t)
	a, b := r.pair(false), r.pair(false)
	devtest.ToError(t, a)
	rp := newReaper(t, r.cq, drain.Options{DrainTimeout: devtest.Timeout, Queue: queueOf})
	h := add(t, rp, a, sole)
	if _, err := rp.Add(b, drain.AddOptions{}); !errors.Is(err, drain.ErrNotSoleQP) {
		t.Errorf("a QP added beside one stated alone on the CQ: %v, want ErrNotSoleQP", err)
	}
	rp.HandleWC(recvFlush(b.Num()))
	rep, err := h.Wait(testCtx(t))
	wantErr(t, err, drain.ErrNotSoleQP)
	if rep.Outcome != report.Failed {
		t.Errorf("%s after another QP's completion, want failed\n%s", rep.Outcome, rep)
	}

	rp = newReaper(t, r.cq, drain.Options{DrainTimeout: devtest.Timeout, Queue: queueOf})
	rp.HandleWC(recvFlush(b.Num()))
	if _, err := rp.Add(a, sole); !errors.Is(err, drain.ErrNotSoleQP) {
		t.Errorf("a QP stated alone on a CQ where another QP's completion came: %v, want ErrNotSoleQP", err)
	}
}

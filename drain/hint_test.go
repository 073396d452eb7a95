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

// A quarantined QP whose number now stands for a new QP counting its
// receives: a completion with the number, while the new QP proves the CQ
// past its number's earlier QPs, may be the new QP's own, so its count is
// not trusted, even when the quarantined QP was the last one a completion
// was looked up for (the reaper's lookup hint must not outlive the
// number's reuse).
func TestReusedNumberAfterLookupHint(t *testing.T) {
	r := stallingSRQRig(t)
	old := r.pair(true)
	rp := newReaper(t, r.cq, drain.Options{LastWQETimeout: 10 * time.Millisecond, DrainTimeout: devtest.Timeout, Queue: queueOf})
	defer rp.Shutdown(endedCtx())
	if _, err := add(t, rp, old, drain.AddOptions{NoSends: true}).Wait(testCtx(t)); !errors.Is(err, drain.ErrQuarantined) {
		t.Fatalf("old QP: %v, want quarantined", err)
	}
	// A completion of the old QP's number: the quarantined QP is the one
	// it was looked up for.
	if rp.HandleWC(recvFlush(old.Num())) {
		t.Fatal("a receive's completion claimed")
	}
	wantReusedNumberNotTrusted(t, r, rp, old.Num())
}

// The same for the reaper's other lookup hint, the handle after the last
// one looked up: a quarantined QP that was that next handle when a
// completion of the QP before it was looked up does not take the
// completions of a new QP given its number.
func TestReusedNumberAfterNextHint(t *testing.T) {
	r := stallingSRQRig(t)
	first, old := r.pair(true), r.pair(true)
	rp := newReaper(t, r.cq, drain.Options{LastWQETimeout: 10 * time.Millisecond, DrainTimeout: devtest.Timeout, Queue: queueOf})
	defer rp.Shutdown(endedCtx())
	hFirst := add(t, rp, first, drain.AddOptions{NoSends: true})
	hOld := add(t, rp, old, drain.AddOptions{NoSends: true})
	// A completion of the first QP's number, while both wait in a row:
	// the old QP is the handle after the one it was looked up for.
	if rp.HandleWC(recvFlush(first.Num())) {
		t.Fatal("a receive's completion claimed")
	}
	for _, h := range []*drain.Handle{hFirst, hOld} {
		if _, err := h.Wait(testCtx(t)); !errors.Is(err, drain.ErrQuarantined) {
			t.Fatalf("%v, want quarantined", err)
		}
	}
	wantReusedNumberNotTrusted(t, r, rp, old.Num())
}

// And a QP that finished, the last one a completion was looked up for (its
// drain WR's), does not take the completions of a new QP given its number.
func TestReusedNumberAfterFinish(t *testing.T) {
	dev := openSoft(t, soft.Config{})
	r := newRig(t, dev, nil, 64)
	old := r.pair(false)
	rp := newReaper(t, r.cq, drain.Options{DrainTimeout: devtest.Timeout, Queue: queueOf})
	defer rp.Shutdown(endedCtx())
	hOld := add(t, rp, old, drain.AddOptions{})
	pollUntilDone(t, rp, r.cq)
	if o := hOld.Report().Outcome; o != report.Safe {
		t.Fatalf("old QP: %s, want safe", o)
	}
	wantReusedNumberNotTrusted(t, r, rp, old.Num())
}

// And a QP that finished without a lookup (given up after its stall, the
// CQ found empty), the handle after the last one looked up, does not take
// the completions of a new QP given its number.
func TestReusedNumberAfterNextHintFinished(t *testing.T) {
	r := stallingSRQRig(t)
	first, old := r.pair(true), r.pair(true)
	// DrainTimeout also bounds the wait for an empty poll, which this
	// loop makes every millisecond: ten times that, for a loaded host.
	rp := newReaper(t, r.cq, drain.Options{Policy: drain.DestroyWhenEmpty, LastWQETimeout: 20 * time.Millisecond, DrainTimeout: 200 * time.Millisecond, Queue: queueOf})
	defer rp.Shutdown(endedCtx())
	hs := []*drain.Handle{add(t, rp, first, drain.AddOptions{NoSends: true}), add(t, rp, old, drain.AddOptions{NoSends: true})}
	// While both wait in a row, the old QP is the handle after the one a
	// completion of the first QP's number was looked up for.
	if rp.HandleWC(recvFlush(first.Num())) {
		t.Fatal("a receive's completion claimed")
	}
	deadline := time.Now().Add(devtest.Timeout)
	for _, h := range hs {
		for done := false; !done; {
			select {
			case <-h.Done():
				done = true
			default:
				if time.Now().After(deadline) {
					t.Fatalf("not given up within %v:\n%s", devtest.Timeout, h.Report())
				}
				time.Sleep(time.Millisecond)
				rp.CQEmpty()
			}
		}
		if o := h.Report().Outcome; o != report.DestroyedAfterEmptyCQ {
			t.Fatalf("%s, want %s:\n%s", o, report.DestroyedAfterEmptyCQ, h.Report())
		}
	}
	wantReusedNumberNotTrusted(t, r, rp, old.Num())
}

// wantReusedNumberNotTrusted gives num to a new QP counting its two
// receives and, while it proves its CQ, hands rp a receive's flush with
// num: that completion may be the new QP's own, so the new QP's count must
// not be trusted.
func wantReusedNumberNotTrusted(t *testing.T, r *rig, rp *drain.Reaper, num uint32) {
	t.Helper()
	qp := r.pair(false)
	r.postRecvs(qp, 2)
	h := add(t, rp, renumbered{QP: qp, num: num}, drain.AddOptions{CountRecvs: true, Recvs: 2, NoSends: true})
	time.Sleep(time.Millisecond) // the next poll begins after the Add
	rp.HandleWC(recvFlush(num))
	rp.CQEmpty()
	rep := h.Report()
	if !has(rep, report.StepCountNotTrusted) || has(rep, report.StepCQEmpty) {
		t.Errorf("a completion with the number came while proving, yet the count was trusted:\n%s", rep)
	}
}

// recvFlush is the flush of a receive of the QP numbered num.
func recvFlush(num uint32) ibv.WC {
	return ibv.WC{ID: recvIDBase, QPNum: num, Status: ibv.WCWRFlushErr, Opcode: ibv.WCRecv}
}

// stallingSRQRig is a rig whose device never raises Last WQE Reached, so a
// QP on its SRQ (16 receives posted) stalls until its LastWQETimeout.
func stallingSRQRig(t *testing.T) *rig {
	t.Helper()
	dev := openSoft(t, soft.Config{Quirks: soft.Quirks{NoLastWQEReached: true}, SRQPrefetch: 4})
	r := newRig(t, dev, nil, 64)
	r.postRecvs(nil, 16)
	return r
}

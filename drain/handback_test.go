package drain_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/clock"
	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/soft"
)

// The tests in this file are about the QPs a reaper hands back to its
// caller (failed, released by DestroyWhenEmpty, returned by Shutdown): which
// are handed back, and what their drain WRs may still take of the CQ.

// A caller that destroys the QPs handed back to it from a worker of its
// own, a few ms after their outcome, while its poll loop goes on: as
// IPoIB-CM does, whose ipoib_cm_rx_reap destroys QPs from a work queue
// while NAPI polls the CQ (drivers/infiniband/ulp/ipoib/ipoib_cm.c). Drain
// WRs that never complete (eHCA) stall every drain, DestroyWhenEmpty
// releases each QP after an empty poll, and the drain WRs in the CQ plus
// those still to come (occupancy) must never exceed Headroom. The reaper
// before Handle.Destroy freed a released QP's slot at the first empty poll
// after the release, while the QP waited for its destroy, and posted the
// next QP's drain WR beside its own: 2, headroom 1.
func TestAsyncDestroyHeadroom(t *testing.T) {
	r, rp, o := stallingDestroyWhenEmpty(t)
	c := startCaller(t, rp, r.cq, r.dev)
	// The reap worker: each QP destroyed 5 ms after its outcome, in the
	// order the outcomes come (the QPs wait for the headroom in turn).
	ctx := testCtx(t)
	added := make(chan *drain.Handle, 4)
	var wg sync.WaitGroup
	wg.Go(func() {
		for h := range added {
			select {
			case <-h.Done():
			case <-ctx.Done():
				t.Errorf("qpn %d: no outcome within %v:\n%s", h.QP().Num(), devtest.Timeout, h.Report())
				return
			}
			time.Sleep(5 * time.Millisecond)
			if err := h.Destroy(); err != nil {
				t.Error(err)
			}
		}
	})
	// One QP every half DrainTimeout: each waits for the headroom the one
	// before holds, and stalls with its drain WR posted.
	var hs []*drain.Handle
	for i := range cap(added) {
		if i > 0 {
			time.Sleep(stallTimeout / 2)
		}
		h := add(t, rp, countingQP{r.pair(false).(*soft.QP), o}, counted)
		hs = append(hs, h)
		added <- h
	}
	close(added)
	wg.Wait()
	c.stop()
	// Every QP is handed back: released after an empty poll, or, where a
	// loaded host starved the poll loop past the empty poll's own bound
	// (DrainTimeout), failed for want of one. Either way the worker
	// destroyed it, which is what the occupancy is about.
	for _, h := range hs {
		rep := h.Report()
		checkProof(t, rep)
		if rep.Outcome != report.DestroyedAfterEmptyCQ && !(rep.Outcome == report.Failed && errors.Is(rep.Err, drain.ErrCQNotEmpty)) {
			t.Errorf("qpn %d: %s (%v), want released after an empty poll\n%s", rep.QPNum, rep.Outcome, rep.Err, rep)
		}
	}
}

// A reaper that replaces a shut-down one on the same CQ: the old one's
// drain WR, never completing (eHCA), may still take a CQ slot until its QP,
// handed back by Shutdown, is destroyed, so the new reaper's QP waits for
// the headroom it holds. The reaper before the ledger (NewReaper adopting
// what Shutdown left) posted its drain WR at once: 2, headroom 1.
func TestReplacedReaperHeadroom(t *testing.T) {
	r := eHCARig(t)
	o := newOccupancy(t, 1)
	opts := drain.Options{DrainTimeout: devtest.Timeout, Queue: queueOf}
	first := newReaper(t, r.cq, opts)
	old := add(t, first, countingQP{r.pair(false).(*soft.QP), o}, counted)
	if back := first.Shutdown(endedCtx()); len(back) != 1 || back[0] != old {
		t.Fatalf("Shutdown handed back %v, want the QP it was draining", back)
	}
	rp := newReaper(t, r.cq, opts)
	h := add(t, rp, countingQP{r.pair(false).(*soft.QP), o}, counted)
	for range 3 {
		pollAll(t, rp, r.cq)
	}
	if has(h.Report(), report.StepDrainPosted) {
		t.Errorf("the new reaper posted a drain WR beside the old one's:\n%s", h.Report())
	}
	if err := old.Destroy(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(devtest.Timeout)
	for !has(h.Report(), report.StepDrainPosted) {
		if time.Now().After(deadline) {
			t.Fatalf("no drain WR posted within %v of the old QP's destroy:\n%s", devtest.Timeout, h.Report())
		}
		pollAll(t, rp, r.cq)
	}
	rp.Shutdown(endedCtx())
	if err := h.Destroy(); err != nil {
		t.Error(err)
	}
}

// Shutdown racing Add: every QP that Add took and whose drain did not end
// Safe is in the list Shutdown returns, and Add refuses the others with
// ErrShutdown. The first QP waits for a receive that never comes back, so
// Shutdown waits for its ctx while QPs are still being added, each drained
// at once or failed by the shutdown. The reaper before took QPs while
// Shutdown waited for the pending drains, failed them with ErrShutdown and
// left them out.
func TestShutdownRacingAdd(t *testing.T) {
	r := quirkRig(t, soft.Quirks{})
	qps := r.pairs(16, false)
	r.postRecvs(qps[0], 1)
	rp := newReaper(t, r.cq, drain.Options{DrainTimeout: devtest.Timeout, Queue: queueOf})
	startCaller(t, rp, r.cq, r.dev)
	added := make(chan *drain.Handle, len(qps))
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(added)
		for i, qp := range qps {
			o := counted
			if i == 0 {
				o = drain.AddOptions{CountRecvs: true, Recvs: 2}
			}
			h, err := rp.Add(qp, o)
			switch {
			case errors.Is(err, drain.ErrShutdown):
			case err != nil:
				t.Errorf("Add racing Shutdown: %v, want ErrShutdown", err)
			default:
				added <- h
			}
			time.Sleep(100 * time.Microsecond)
		}
	})
	hs := []*drain.Handle{<-added}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	back := rp.Shutdown(ctx)
	wg.Wait()
	for h := range added {
		hs = append(hs, h)
	}
	listed := map[*drain.Handle]bool{}
	for _, h := range back {
		listed[h] = true
	}
	missing := 0
	for _, h := range hs {
		if rep := h.Report(); rep.Outcome != report.Safe && !listed[h] {
			missing++
			t.Errorf("qpn %d ended %s (%v) and is not in Shutdown's list", rep.QPNum, rep.Outcome, rep.Err)
		}
	}
	if missing > 0 {
		t.Logf("%d of %d handles missing from Shutdown's list", missing, len(hs))
	}
}

// Destroy destroys a QP handed back, Safe or not, and then does nothing;
// it refuses one whose drain has no outcome or that is in quarantine.
func TestDestroyOnlyHandedBack(t *testing.T) {
	r := eHCARig(t)
	rp := newReaper(t, r.cq, drain.Options{DrainTimeout: stall, Queue: queueOf, Clock: virtualClock()})
	safe := add(t, rp, r.pair(false), drain.AddOptions{CountRecvs: true, NoSends: true})
	if _, err := safe.Wait(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err := safe.Destroy(); err != nil {
		t.Errorf("destroying a QP proven safe: %v", err)
	}
	h := add(t, rp, r.pair(false), counted)
	wantBusy := func(when string) {
		t.Helper()
		err := h.Destroy()
		if !errors.Is(err, ibv.ErrBusy) || !strings.Contains(err.Error(), fmt.Sprint("qpn ", h.QP().Num())) {
			t.Errorf("Destroy %s: %v, want ErrBusy naming the QP", when, err)
		}
	}
	wantBusy("while the drain is pending")
	if _, err := h.Wait(testCtx(t)); !errors.Is(err, drain.ErrQuarantined) {
		t.Fatalf("%v, want quarantined", err)
	}
	wantBusy("in quarantine")
	if back := rp.Shutdown(endedCtx()); len(back) != 1 || back[0] != h {
		t.Fatalf("Shutdown handed back %v, want the quarantined QP", back)
	}
	for i := range 2 {
		if err := h.Destroy(); err != nil {
			t.Errorf("Destroy #%d of a QP Shutdown handed back: %v", i+1, err)
		}
	}
	for _, h := range []*drain.Handle{safe, h} {
		if _, _, err := h.QP().Query(ibv.QPAttrState); !errors.Is(err, ibv.ErrClosed) {
			t.Errorf("qpn %d after Destroy: query %v, want ErrClosed", h.QP().Num(), err)
		}
	}
}

// An empty poll frees the headroom slot of a destroyed QP's drain WR only
// if it began strictly after the destroy: one that began at the very
// instant (a clock.Virtual that did not move) may have begun before it,
// while the drain WR could still complete.
func TestEmptyPollAtDestroyInstant(t *testing.T) {
	r := eHCARig(t)
	vc := clock.NewVirtual(time.Unix(1e9, 0))
	rp := newReaper(t, r.cq, drain.Options{Policy: drain.DestroyWhenEmpty, DrainTimeout: stall, Queue: queueOf, Clock: vc})
	h := add(t, rp, r.pair(false), counted)
	inFlight := func(when string, want int) {
		t.Helper()
		if st := rp.Stats(); st.InFlight != want {
			t.Errorf("%s: %d drain WRs counted, want %d", when, st.InFlight, want)
		}
	}
	vc.Advance(stall)
	rp.CQEmpty() // the stall
	vc.Advance(time.Nanosecond)
	rp.CQEmpty() // began at the stall
	rp.CQEmpty() // began after it: releases the QP
	if rep := h.Report(); rep.Outcome != report.DestroyedAfterEmptyCQ {
		t.Fatalf("outcome %s, want released after an empty poll\n%s", rep.Outcome, rep)
	}
	if err := h.Destroy(); err != nil {
		t.Fatal(err)
	}
	rp.CQEmpty()
	inFlight("after an empty poll begun at the destroy's instant", 1)
	vc.Advance(time.Nanosecond)
	rp.CQEmpty()
	inFlight("after an empty poll begun at the destroy's instant, ended after it", 1)
	rp.CQEmpty()
	inFlight("after an empty poll begun after the destroy", 0)
}

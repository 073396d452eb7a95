package drain_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/clock"
	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/internal/testing/syncbuf"
	"github.com/qpdrain/qpdrain/soft"
)

// The tests in this file need the soft device's provider quirks: one test
// per quirk, each showing the exact error or the fallback, never a hang.

// stall is the bound the quirk tests give a wait that is meant to stall,
// so that it shows in a fraction of a second; a wait meant to succeed gets
// devtest.Timeout, so that a loaded machine cannot fake a stall.
const stall = 100 * time.Millisecond

// virtualClock is the clock of a test that feeds its reaper itself and
// then waits: the wait for a stall takes no real time, and the stall comes
// exactly at its deadline. A test fed by a concurrent caller stays on the
// real clock, since a wait would jump past deadlines the caller is about
// to meet.
func virtualClock() clock.Clock { return clock.NewVirtual(time.Unix(1e9, 0)) }

// quirkRig opens a soft device with quirks and 4 receive WQEs prefetched
// by every SRQ QP, so that ERROR has receives to flush.
func quirkRig(t *testing.T, q soft.Quirks) *rig {
	dev := openSoft(t, soft.Config{Quirks: q, SRQPrefetch: 4})
	r := newRig(t, dev, nil, 256)
	r.postRecvs(nil, 128)
	return r
}

// runReaper starts a reaper fed by a caller loop; timeouts left zero in o
// are meant to stall.
func runReaper(t *testing.T, r *rig, o drain.Options) (*drain.Reaper, *caller) {
	if o.LastWQETimeout == 0 {
		o.LastWQETimeout = stall
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = stall
	}
	o.Queue = queueOf
	rp := newReaper(t, r.cq, o)
	return rp, startCaller(t, rp, r.cq, r.dev)
}

// IBM eHCA: a send posted in ERROR never completes, so the drain WR never
// does. Quarantine keeps the QPs, up to its bound, and their drain WRs keep
// their headroom (3 here, one each); DestroyWhenEmpty releases them once
// the CQ polls empty.
func TestQuirkSendInErrorNotFlushed(t *testing.T) {
	q := soft.Quirks{SendInErrorNotFlushed: true}
	t.Run("quarantine", func(t *testing.T) {
		r := quirkRig(t, q)
		qps := r.pairs(3, true)
		rp, _ := runReaper(t, r, drain.Options{MaxQuarantine: 2, Headroom: 3, LastWQETimeout: devtest.Timeout})
		var errs []error
		for _, qp := range qps {
			rep, err := add(t, rp, qp, drain.AddOptions{}).Wait(testCtx(t))
			wantErr(t, err, drain.ErrDrainNotFlushed)
			if !rep.SRQ || rep.Flushed[report.QueueRecv].Flushed != 4 || !has(rep, report.StepDrainPosted) || has(rep, report.StepDrainDone) {
				t.Errorf("want 4 flushed receives, the drain WR posted and never completed:\n%s", rep)
			}
			errs = append(errs, err)
		}
		wantErr(t, errs[0], drain.ErrQuarantined)
		wantErr(t, errs[1], drain.ErrQuarantined)
		wantErr(t, errs[2], drain.ErrQuarantineFull)
		if st := rp.Stats(); st.Quarantined != 2 || st.Failed != 1 || st.Safe != 0 || st.InFlight < 2 || st.MaxInFlight > 3 {
			// The failed QP's drain WR counts until the next empty poll.
			t.Errorf("stats %+v: want 2 quarantined, 1 failed, none safe, the 2 quarantined drain WRs still counted", st)
		}
		if left := rp.Shutdown(testCtx(t)); len(left) != 2 {
			t.Errorf("Shutdown returned %d QPs, want the 2 quarantined", len(left))
		}
	})
	t.Run("destroy-when-empty", func(t *testing.T) {
		destroyedWhenEmpty(t, q, drain.Options{LastWQETimeout: devtest.Timeout}, drain.ErrDrainNotFlushed,
			report.StepDrainPosted, report.StepStall, report.StepCQEmpty, report.StepOutcome)
	})
}

// cxgb4 before 2025: no Last WQE Reached. Quarantine keeps the QP without
// posting a drain WR; DestroyWhenEmpty still posts the drain WR, then
// waits for an empty poll.
func TestQuirkNoLastWQEReached(t *testing.T) {
	q := soft.Quirks{NoLastWQEReached: true}
	t.Run("quarantine", func(t *testing.T) {
		r := quirkRig(t, q)
		qp := r.pair(true)
		rp, _ := runReaper(t, r, drain.Options{})
		rep, err := add(t, rp, qp, drain.AddOptions{}).Wait(testCtx(t))
		wantErr(t, err, drain.ErrNoLastWQE, drain.ErrQuarantined)
		if rep.Outcome != report.Quarantined || has(rep, report.StepEvent) || has(rep, report.StepDrainPosted) {
			t.Errorf("want quarantined with no event and no drain WR:\n%s", rep)
		}
		if st := rp.Stats(); st.DrainWRs != 0 || st.Quarantined != 1 {
			t.Errorf("stats %+v: want no drain WR, 1 quarantined", st)
		}
	})
	t.Run("destroy-when-empty", func(t *testing.T) {
		destroyedWhenEmpty(t, q, drain.Options{DrainTimeout: devtest.Timeout}, drain.ErrNoLastWQE,
			report.StepStall, report.StepDrainPosted, report.StepDrainDone, report.StepCQEmpty, report.StepOutcome)
	})
}

// destroyedWhenEmpty drains one SRQ QP of a quirkRig with quirks q under
// DestroyWhenEmpty and o, and fails unless the drain ends destroyed after
// an empty CQ with no error, having stalled on stall, its report holding
// the steps want in order.
func destroyedWhenEmpty(t *testing.T, q soft.Quirks, o drain.Options, stall error, want ...report.StepKind) {
	t.Helper()
	r := quirkRig(t, q)
	qp := r.pair(true)
	o.Policy = drain.DestroyWhenEmpty
	rp, _ := runReaper(t, r, o)
	rep, err := add(t, rp, qp, drain.AddOptions{}).Wait(testCtx(t))
	if err != nil || rep.Outcome != report.DestroyedAfterEmptyCQ {
		t.Fatalf("%v, outcome %s; want no error and destroyed after empty CQ\n%s", err, rep.Outcome, rep)
	}
	wantErr(t, rep.Stall, stall)
	if !inOrder(kinds(rep), want) {
		t.Errorf("want %v in order:\n%s", want, rep)
	}
}

// Last WQE Reached twice: the repeat is counted and changes nothing — one
// drain WR per batch, every QP safe once.
func TestQuirkLastWQEReachedTwice(t *testing.T) {
	r := quirkRig(t, soft.Quirks{LastWQEReachedTwice: true})
	qps := r.pairs(4, true)
	rp := newReaper(t, r.cq, drain.Options{LastWQETimeout: devtest.Timeout, DrainTimeout: devtest.Timeout})
	var hs []*drain.Handle
	for _, qp := range qps {
		hs = append(hs, add(t, rp, qp, drain.AddOptions{NoSends: true}))
	}
	if kept := handEvents(t, rp, r.dev, 2*len(qps)); len(kept) != 0 {
		t.Errorf("reaper left %v", kept)
	}
	pollAll(t, rp, r.cq)
	pollAll(t, rp, r.cq)
	waitAll(t, hs)
	if st := rp.Stats(); st.RepeatedLastWQE != 4 || st.DrainWRs != 2 || st.Safe != 4 {
		t.Errorf("stats %+v: want 4 repeats ignored, 2 drain WRs (1, then 3), 4 safe", st)
	}
	// A repeat after the QP was released is not the reaper's any more.
	if rp.HandleEvent(ibv.AsyncEvent{Type: ibv.EventQPLastWQEReached, QP: qps[0]}) {
		t.Error("reaper claimed an event of a QP it released")
	}
}

// rxe 6.12 raises Last WQE Reached again for every send posted in ERROR;
// here one is posted after the caller moved the QP to ERROR, before Add.
// The repeat comes after the first event, which follows the flushes of the
// WQEs the QP took from its SRQ, so no completion of a QP called safe may
// still come. The soft device before raised the repeat while the first
// was still due, and the reaper took it for the first: on 107 of 400
// seeds a receive flush was polled after the QP was called safe.
func TestQuirkLastWQEReachedAgain(t *testing.T) {
	r := quirkRig(t, soft.Quirks{LastWQEReachedAgain: true})
	qp := r.pair(true)
	devtest.ToError(t, qp)
	if err := qp.PostSend([]ibv.SendWR{{ID: sendIDBase, Opcode: ibv.WRSend, Flags: ibv.SendSignaled}}); err != nil {
		t.Fatal(err)
	}
	rp := newReaper(t, r.cq, drain.Options{LastWQETimeout: devtest.Timeout, DrainTimeout: devtest.Timeout, Queue: queueOf})
	s := newStepper(t, rp, r.cq, r.dev)
	h := add(t, rp, qp, drain.AddOptions{})
	s.watch(h, qp.(*soft.QP))
	s.until("the drain's outcome", s.settled)
	rep := h.Report()
	if rep.Outcome != report.Safe {
		t.Errorf("outcome %s, want safe:\n%s", rep.Outcome, rep)
	}
	// At the outcome nothing was outstanding; nor may a completion of the
	// QP be left in the CQ behind the drain WR's.
	kept, _ := pollAll(t, rp, r.cq)
	for _, wc := range kept {
		if wc.QPNum == qp.Num() {
			t.Errorf("false safe: completion wr_id %#x of qpn %d polled after it was called safe:\n%s", wc.ID, wc.QPNum, rep)
		}
	}
}

// A receive posted in ERROR is not flushed until something else happens on
// the QP. With the default headroom of 1 the receive drain WR goes out
// alone and never completes: the receive queue is unproven, the QP
// quarantined, the error names the receive drain WR. With Headroom 2 the
// send drain WR follows it on the same QP and is that something. A caller
// that counts its receives needs no receive drain WR at all.
func TestQuirkRecvInErrorFlushDeferred(t *testing.T) {
	q := soft.Quirks{RecvInErrorFlushDeferred: true}
	t.Run("headroom 1", func(t *testing.T) {
		r := quirkRig(t, q)
		qp := r.pair(false)
		r.postRecvs(qp, 2)
		rep, err := drainQP(testCtx(t), qp, drain.AddOptions{}, drain.Options{DrainTimeout: stall, Queue: queueOf}, drain.Feed{Events: r.dev})
		wantErr(t, err, drain.ErrDrainNotFlushed, drain.ErrQuarantined)
		checkProof(t, rep)
		if rep.Recv.By != report.ProofNone || rep.Recv.Missing != report.MissingRecvDrainWR || !strings.Contains(err.Error(), "receive drain WR") {
			t.Errorf("%v: want the receive queue unproven for want of its receive drain WR\n%s", err, rep)
		}
	})
	t.Run("headroom 2", func(t *testing.T) {
		r := quirkRig(t, q)
		qp := r.pair(false)
		r.postRecvs(qp, 2)
		rep, err := drainQP(testCtx(t), qp, drain.AddOptions{}, drain.Options{Headroom: 2, DrainTimeout: devtest.Timeout, Queue: queueOf}, drain.Feed{Events: r.dev})
		if err != nil {
			t.Fatalf("%v\n%s", err, rep)
		}
		checkProof(t, rep)
		if !inOrder(kinds(rep), []report.StepKind{report.StepRecvDrainPosted, report.StepDrainPosted, report.StepRecvDrainDone}) {
			t.Errorf("want the receive drain WR completed after the send drain WR was posted:\n%s", rep)
		}
	})
	t.Run("counted", func(t *testing.T) {
		r := quirkRig(t, q)
		qp := r.pair(false)
		r.postRecvs(qp, 2)
		rep, err := drainQP(testCtx(t), qp, drain.AddOptions{CountRecvs: true, Recvs: 2}, drain.Options{DrainTimeout: devtest.Timeout, Queue: queueOf}, drain.Feed{Events: r.dev})
		if err != nil || has(rep, report.StepRecvDrainPosted) || rep.Recv.By != report.ProofRecvCount {
			t.Errorf("%v: want safe by the count, without a receive drain WR\n%s", err, rep)
		}
	})
}

// A drain WR's completion is matched by its ID, and only a matched one
// returns its headroom slot. Rounds of barriers due while earlier ones are
// outstanding (send queues of 4 here, with room for a second barrier) must
// leave the whole headroom free, so that a QP with its own receive queue
// on rxe 6.12's model, which needs Headroom 2, still drains. The reaper
// before gave the second barrier the first one's carrier, whose ID it
// overwrote: the first barrier's completion went unmatched, one slot
// stayed counted for good, and that QP stalled and was quarantined.
func TestBarrierSlotsReturned(t *testing.T) {
	r := quirkRig(t, soft.Quirks{RecvInErrorFlushDeferred: true})
	r.sendWR = 4
	rp := newReaper(t, r.cq, drain.Options{Headroom: 2, LastWQETimeout: devtest.Timeout, DrainTimeout: devtest.Timeout, Queue: queueOf})
	barrierRounds(t, r, rp, 30)
	if _, claimed := pollAll(t, rp, r.cq); claimed != 0 {
		t.Errorf("%d drain WR completions polled after every QP was safe", claimed)
	}
	if st := rp.Stats(); st.InFlight != 0 || st.LateDrainWCs != 0 {
		t.Fatalf("stats %+v: want no drain WR counted and none completed unmatched", st)
	}
	qp := r.pair(false)
	r.postRecvs(qp, 2)
	h := add(t, rp, qp, drain.AddOptions{})
	pollUntilDone(t, rp, r.cq)
	rep := waitAll(t, []*drain.Handle{h})[0]
	if rep.Recv.By != report.ProofRecvDrainWR {
		t.Errorf("want the receive queue proven by its receive drain WR:\n%s", rep)
	}
}

// fullOnceQP finds its send queue full once, as a provider that returns a
// send slot only at a later poll may.
type fullOnceQP struct {
	ibv.QP
	full bool
}

func (q *fullOnceQP) PostSend(wrs []ibv.SendWR) error {
	if q.full {
		q.full = false
		return &ibv.PostError{Err: fmt.Errorf("send queue of qpn %d: %w", q.Num(), ibv.ErrQueueFull)}
	}
	return q.QP.PostSend(wrs)
}

// A barrier's carrier found with its send queue full waits for the next
// poll, as a QP's own drain WR does: within the slot the caller reserved,
// a full queue is a provider returning the slot late. The reaper before
// failed the QP with ErrPostDrain.
func TestBarrierFullSendQueueRetried(t *testing.T) {
	r := quirkRig(t, soft.Quirks{})
	qp := r.pair(true)
	devtest.ToError(t, qp)
	if ev := devtest.WaitEvent(t, r.dev, devtest.Timeout); ev.Type != ibv.EventQPLastWQEReached || ev.QP.Num() != qp.Num() {
		t.Fatalf("got event %v, want QP_LAST_WQE_REACHED for qpn %d", ev, qp.Num())
	}
	rp := newReaper(t, r.cq, drain.Options{LastWQETimeout: devtest.Timeout, DrainTimeout: devtest.Timeout, Queue: queueOf})
	h := add(t, rp, &fullOnceQP{QP: qp, full: true}, drain.AddOptions{NoSends: true, LastWQESeen: true})
	pollUntilDone(t, rp, r.cq)
	rep := waitAll(t, []*drain.Handle{h})[0]
	if !inOrder(kinds(rep), []report.StepKind{report.StepPostRetry, report.StepDrainPosted, report.StepDrainDone}) || rep.Recv.By != report.ProofBarrier {
		t.Errorf("want the barrier retried after a poll, then completed:\n%s", rep)
	}
	if st := rp.Stats(); st.PostRetries != 1 || st.DrainWRs != 1 {
		t.Errorf("stats %+v: want one retry, one drain WR", st)
	}
}

// WRs posted in ERROR flush only if the QP was in RTS before (Mellanox
// firmware, per ipoib_cm.c). A QP drained from RTR never flushes its drain
// WR: ErrDrainNotFlushed, and the report shows the state it came from.
// The same QP taken to RTS first drains.
func TestQuirkDrainNeedsRTS(t *testing.T) {
	r := quirkRig(t, soft.Quirks{DrainNeedsRTS: true})
	rtr := r.newQP(true)
	peer := devtest.NewRC(t, r.pd, devtest.RCConfig{SendCQ: r.peerCQ, Cap: qpCap})
	toRTR(t, r.dev, rtr, peer)
	rts := r.pair(true)
	rp, c := runReaper(t, r, drain.Options{LastWQETimeout: devtest.Timeout})
	rep, err := add(t, rp, rtr, drain.AddOptions{}).Wait(testCtx(t))
	wantErr(t, err, drain.ErrDrainNotFlushed, drain.ErrQuarantined)
	if s := rep.Steps()[0]; s.From != ibv.QPSRTR || !has(rep, report.StepEvent) || has(rep, report.StepDrainDone) {
		t.Errorf("want RTR -> ERR, Last WQE Reached, a drain WR never completed:\n%s", rep)
	}
	c.stop() // one caller loop at a time on the CQ
	rp, c = runReaper(t, r, drain.Options{LastWQETimeout: devtest.Timeout, DrainTimeout: devtest.Timeout})
	if rep, err := add(t, rp, rts, drain.AddOptions{}).Wait(testCtx(t)); err != nil {
		t.Errorf("a QP that was in RTS: %v\n%s", err, rep)
	}
	// Options.ViaRTS takes a QP found in RTR through RTS first.
	c.stop()
	rtr2 := r.newQP(true)
	peer2 := devtest.NewRC(t, r.pd, devtest.RCConfig{SendCQ: r.peerCQ, Cap: qpCap})
	toRTR(t, r.dev, rtr2, peer2)
	rp, _ = runReaper(t, r, drain.Options{ViaRTS: true, LastWQETimeout: devtest.Timeout, DrainTimeout: devtest.Timeout})
	rep, err = add(t, rp, rtr2, drain.AddOptions{}).Wait(testCtx(t))
	if err != nil {
		t.Fatalf("ViaRTS: %v\n%s", err, rep)
	}
	checkProof(t, rep)
	if steps := rep.Steps(); len(steps) < 2 {
		t.Fatalf("%d steps, want the two transitions first:\n%s", len(steps), rep)
	} else if s0, s1 := steps[0], steps[1]; s0.From != ibv.QPSRTR || s0.To != ibv.QPSRTS || s1.From != ibv.QPSRTS || s1.To != ibv.QPSErr {
		t.Errorf("ViaRTS: want RTR -> RTS -> ERR:\n%s", rep)
	}
}

// toRTR moves qp from RESET to RTR towards peer, and no further.
func toRTR(t *testing.T, dev ibv.Context, qp, peer ibv.QP) {
	t.Helper()
	steps := []struct {
		attr ibv.QPAttr
		mask ibv.QPAttrMask
	}{
		{ibv.QPAttr{State: ibv.QPSInit, PortNum: devtest.Port, AccessFlags: devtest.AllAccess},
			ibv.QPAttrState | ibv.QPAttrPKeyIndex | ibv.QPAttrPort | ibv.QPAttrAccessFlags},
		{ibv.QPAttr{State: ibv.QPSRTR, PathMTU: ibv.MTU1024, DestQPNum: peer.Num(), MaxDestRdAtomic: 1, MinRNRTimer: 12, AH: devtest.Address(t, dev)},
			ibv.QPAttrState | ibv.QPAttrAV | ibv.QPAttrPathMTU | ibv.QPAttrDestQPN | ibv.QPAttrRQPSN | ibv.QPAttrMaxDestRdAtomic | ibv.QPAttrMinRNRTimer},
	}
	for _, s := range steps {
		if err := qp.Modify(s.attr, s.mask); err != nil {
			t.Fatalf("moving qpn %d to %s: %v", qp.Num(), s.attr.State, err)
		}
	}
}

// A real CQ overflow on the soft device: EventCQErr on the reaper's CQ
// fails the drain with ErrCQError.
func TestCQOverflow(t *testing.T) {
	// The overflow needs every flush generated before the drain polls,
	// which only the orderly schedule promises: adversarial seeds 1-8
	// spread the flushes over the drain's polls and the CQ never fills.
	dev, err := soft.Open(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	devtest.Close(t, dev)
	cq := devtest.NewCQ(t, dev, 4)
	r := newRig(t, dev, cq, 16)
	qp := r.pair(false)
	r.postRecvs(qp, 8)
	rep, err := drainQP(testCtx(t), qp, drain.AddOptions{}, drain.Options{DrainTimeout: devtest.Timeout}, drain.Feed{Events: dev})
	wantErr(t, err, drain.ErrCQError)
	if rep.Outcome != report.Failed {
		t.Errorf("outcome %s, want failed\n%s", rep.Outcome, rep)
	}
}

// A stall is logged at debug level to Options.Log, with the QP number as
// "lqpn"; a reaper without a logger logs nothing (there is nowhere to).
func TestStallIsLogged(t *testing.T) {
	r := quirkRig(t, soft.Quirks{NoLastWQEReached: true})
	qp := r.pair(true)
	var buf syncbuf.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	rp, _ := runReaper(t, r, drain.Options{Log: log})
	if _, err := add(t, rp, qp, drain.AddOptions{}).Wait(testCtx(t)); err == nil {
		t.Fatal("want a stall")
	}
	var recs []map[string]any
	for line := range strings.Lines(buf.String()) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		recs = append(recs, rec)
	}
	qpn := float64(qp.Num())
	text := func(v any) string { s, _ := v.(string); return s }
	if len(recs) != 2 || recs[0]["level"] != "DEBUG" || recs[0]["msg"] != "drain stalled" || recs[0]["lqpn"] != qpn ||
		recs[0]["policy"] != "quarantine" || !strings.Contains(text(recs[0]["error"]), "no Last WQE Reached") ||
		recs[1]["msg"] != "drain ended" || recs[1]["lqpn"] != qpn || recs[1]["outcome"] != "quarantined" {
		t.Errorf("log records %v, want the stall and the quarantine of qpn %d", recs, qp.Num())
	}
}

package drain_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/soft"
)

// The tests in this file show, on the soft device and the adversary, each
// rule a safe report rests on; each failed before the reaper proved every
// queue.

// heldRig is a soft device whose sends stay outstanding (no fabric
// progress), its rig and an adversary on the rig's CQ.
func heldRig(t *testing.T, q soft.Quirks, delay time.Duration) (*rig, *adversary) {
	fab := soft.NewFabric()
	fab.SetAutoProgress(false)
	dev := openSoft(t, soft.Config{Fabric: fab, Quirks: q, SRQPrefetch: 2})
	r := newRig(t, dev, nil, 256)
	r.postRecvs(nil, 128)
	return r, newAdversary(r.cq, delay)
}

// sends posts n sends on qp.
func sends(t *testing.T, qp ibv.QP, first uint64, n int) {
	t.Helper()
	wrs := make([]ibv.SendWR, n)
	for i := range wrs {
		wrs[i] = ibv.SendWR{ID: sendIDBase | first + uint64(i), Opcode: ibv.WRSend, Flags: ibv.SendSignaled}
	}
	if err := qp.PostSend(wrs); err != nil {
		t.Fatalf("posting %d sends on qpn %d: %v", n, qp.Num(), err)
	}
}

// Item 1: a drain WR on one work queue proves nothing about another. The
// adversary delivers the flushes of the held queues late, in order, as a
// provider that generates them later may. Nothing is declared safe before
// its own queues are proven: its own receive queue by a receive drain WR
// behind its receives, its send queue by a drain WR on it, its SRQ side by
// Last WQE Reached and a barrier after it.
func TestNoProofFromAnotherQueue(t *testing.T) {
	for _, tc := range []struct {
		name string
		srq  bool
		q    report.Queue
	}{{"own receive queues", false, report.QueueRecv}, {"send queues of SRQ QPs", true, report.QueueSend}} {
		t.Run(tc.name, func(t *testing.T) {
			r, a := heldRig(t, soft.Quirks{}, 30*time.Millisecond)
			var qps []ibv.QP
			for i := range 4 {
				qp := a.wrap(r.pair(tc.srq), int(qpCap.MaxSendWR))
				if tc.srq {
					sends(t, qp, uint64(i)*8, 2)
				} else {
					r.postRecvs(qp, 2)
				}
				if i >= 2 {
					// Not the first two: a batching reaper would give them
					// their own drain WRs (the first alone, the second
					// carrying the next batch).
					a.holdBack(qp, tc.q)
				}
				qps = append(qps, qp)
			}
			rp := newReaper(t, a.cq(), drain.Options{LastWQETimeout: devtest.Timeout, DrainTimeout: devtest.Timeout, Queue: a.queueOf})
			var hs []*drain.Handle
			for _, qp := range qps {
				h := add(t, rp, qp, drain.AddOptions{})
				a.watch(h)
				hs = append(hs, h)
			}
			if tc.srq {
				// Every QP is ready before the first drain WR's completion
				// is polled, so that batching would put them behind it.
				handEvents(t, rp, &advCtx{Context: r.dev, a: a}, len(qps))
			}
			// The test is the caller's poll loop, until nothing is pending
			// and the adversary holds nothing back.
			deadline := time.Now().Add(devtest.Timeout)
			for rp.Stats().Pending > 0 || a.pending() {
				pollAll(t, rp, a.cq())
				if time.Now().After(deadline) {
					t.Fatalf("drains pending after %v: %+v", devtest.Timeout, rp.Stats())
				}
				time.Sleep(time.Millisecond)
			}
			waitAll(t, hs)
			a.check(t, 1)
		})
	}
}

// Item 1: where no proof can come, the QP is not safe. A provider that
// never flushes a receive posted in ERROR (rxe before Linux 6.12) never
// completes the receive drain WR: the receive queue stays unproven and the
// policy decides; the report says which queue and why.
func TestNoProofNotSafe(t *testing.T) {
	for _, policy := range []drain.Policy{drain.Quarantine, drain.DestroyWhenEmpty} {
		t.Run(policy.String(), func(t *testing.T) {
			// A CQ of its own: the quarantined QP of the first keeps its
			// receive drain WR counted on its CQ, as it may still complete.
			r := quirkRig(t, soft.Quirks{RecvInErrorNotFlushed: true})
			qp := r.pair(false)
			r.postRecvs(qp, 2)
			rep, err := drainQP(testCtx(t), qp, drain.AddOptions{}, drain.Options{Policy: policy, DrainTimeout: stall, Headroom: 2, Queue: queueOf}, drain.Feed{})
			checkProof(t, rep)
			if rep.Outcome == report.Safe || rep.Recv.By != report.ProofNone || rep.Recv.Missing != report.MissingRecvDrainWR ||
				rep.Send.By != report.ProofSendDrainWR {
				t.Errorf("%v: want the receive queue unproven for want of its receive drain WR, the send queue proven\n%s", err, rep)
			}
			if policy == drain.Quarantine {
				wantErr(t, err, drain.ErrQuarantined, drain.ErrDrainNotFlushed)
			} else if err != nil || rep.Outcome != report.DestroyedAfterEmptyCQ {
				t.Errorf("%v, %s: want destroyed after empty CQ", err, rep.Outcome)
			}
		})
	}
}

// Item 2: events belong to the QP object. One event loop serves two
// devices whose QP numbers coincide; the other device's Last WQE Reached
// for "the same" number is not the drained QP's.
func TestEventOfAnotherDevice(t *testing.T) {
	dev1 := openSoft(t, soft.Config{Quirks: soft.Quirks{NoLastWQEReached: true}})
	dev2 := openSoft(t, soft.Config{Name: "soft1"})
	r1, r2 := newRig(t, dev1, nil, 64), newRig(t, dev2, nil, 64)
	x, y := r1.pair(true), r2.pair(true)
	rp := newReaper(t, r1.cq, drain.Options{LastWQETimeout: stall, DrainTimeout: devtest.Timeout})
	h := add(t, rp, x, drain.AddOptions{NoSends: true})
	devtest.ToError(t, y)
	ev := devtest.WaitEvent(t, dev2, devtest.Timeout)
	if ev.QP.Num() != x.Num() {
		// Orderly devices number alike; adversarial ones pick numbers.
		ev.QP = renumbered{QP: ev.QP, num: x.Num()}
	}
	if ev.Type != ibv.EventQPLastWQEReached || rp.HandleEvent(ev) {
		t.Errorf("event %v of the other device claimed", ev)
	}
	pollAll(t, rp, r1.cq)
	rep, err := h.Wait(testCtx(t))
	checkProof(t, rep)
	wantErr(t, err, drain.ErrNoLastWQE, drain.ErrQuarantined)
	if has(rep, report.StepEvent) || has(rep, report.StepDrainPosted) {
		t.Errorf("the other device's event moved the drain on:\n%s", rep)
	}
}

// renumbered is a QP that claims another QP's number, for events: an
// orderly soft device never reuses numbers.
type renumbered struct {
	ibv.QP
	num uint32
}

func (q renumbered) Num() uint32 { return q.num }

// Item 2: a QP number reused after destroy is a new QP. A quarantined QP
// its owner destroyed keeps its place in the quarantine; the new QP with
// its number is drained, and the old QP's events are not the new one's.
func TestReusedQPNumber(t *testing.T) {
	// An adversarial schedule reuses the numbers of destroyed QPs.
	sched := devtest.Schedule(t)
	if sched.Seed == 0 {
		sched.Seed = 1
	}
	dev, err := soft.Open(soft.Config{Quirks: soft.Quirks{NoLastWQEReached: true}, SRQPrefetch: 4, Schedule: sched})
	if err != nil {
		t.Fatal(err)
	}
	devtest.Close(t, dev)
	r := newRig(t, dev, nil, 256)
	r.postRecvs(nil, 128)
	old := r.pair(true)
	rp, _ := runReaper(t, r, drain.Options{DrainTimeout: devtest.Timeout})
	if _, err := add(t, rp, old, drain.AddOptions{NoSends: true}).Wait(testCtx(t)); !errors.Is(err, drain.ErrQuarantined) {
		t.Fatalf("old QP: %v, want quarantined", err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	reused, peer := r.pairAndPeer(false)
	for tries := 0; reused.Num() != old.Num(); tries++ {
		if tries == 64 {
			t.Fatalf("seed %d: qpn %d not reused in 64 QPs", sched.Seed, old.Num())
		}
		if peer.Num() == old.Num() {
			// The peer took it: destroyed, it frees the number again.
			if err := errors.Join(reused.Close(), peer.Close()); err != nil {
				t.Fatal(err)
			}
		}
		reused, peer = r.pairAndPeer(false)
	}
	h, err := rp.Add(reused, drain.AddOptions{})
	if err != nil {
		t.Fatalf("Add of a QP with a reused number: %v", err)
	}
	if rp.HandleEvent(ibv.AsyncEvent{Type: ibv.EventQPLastWQEReached, QP: old}) {
		t.Error("an event of the destroyed QP was claimed for the new one")
	}
	rep, err := h.Wait(testCtx(t))
	checkProof(t, rep)
	if err != nil || has(rep, report.StepEvent) {
		t.Errorf("new QP: %v, want safe, without the old QP's event\n%s", err, rep)
	}
	if st := rp.Stats(); st.Quarantined != 1 || st.Safe != 1 {
		t.Errorf("stats %+v: want the old QP still quarantined, the new one safe", st)
	}
}

// Item 3: the headroom holds. A provider slower than DrainTimeout: the
// timed-out drain WR stays outstanding on the CQ, so the next QP's drain
// WR waits for its completion instead of taking a second slot.
func TestHeadroomHolds(t *testing.T) {
	r, a := heldRig(t, soft.Quirks{}, 150*time.Millisecond)
	var qps []ibv.QP
	for range 3 {
		qp := a.wrap(r.pair(false), int(qpCap.MaxSendWR))
		a.holdBack(qp, report.QueueSend)
		qps = append(qps, qp)
	}
	rp := newReaper(t, a.cq(), drain.Options{DrainTimeout: 50 * time.Millisecond, Queue: a.queueOf})
	startCaller(t, rp, a.cq(), r.dev)
	var hs []*drain.Handle
	for _, qp := range qps {
		hs = append(hs, add(t, rp, qp, counted))
	}
	for _, h := range hs {
		rep, err := h.Wait(testCtx(t))
		checkProof(t, rep)
		if err == nil {
			t.Errorf("qpn %d safe, want a stall: its drain WR completes after DrainTimeout\n%s", rep.QPNum, rep)
		}
	}
	for a.pending() {
		time.Sleep(time.Millisecond)
	}
	a.check(t, 1)
	if st := rp.Stats(); st.MaxInFlight != 1 {
		t.Errorf("stats %+v: want at most 1 drain WR counted", st)
	}
}

// Item 3: a full send queue is retried after polling. The send queue is
// full of sends whose flushes nobody polled yet, and the provider frees a
// slot only when its completion is polled: the drain WR goes out after the
// caller's next poll.
func TestFullSendQueueRetried(t *testing.T) {
	r, a := heldRig(t, soft.Quirks{}, 0)
	const depth = 4
	qp := a.wrap(r.pair(false), depth)
	sends(t, qp, 0, depth)
	rp := newReaper(t, a.cq(), drain.Options{DrainTimeout: devtest.Timeout, Queue: a.queueOf})
	h := add(t, rp, qp, counted)
	a.watch(h)
	startCaller(t, rp, a.cq(), r.dev)
	rep, err := h.Wait(testCtx(t))
	checkProof(t, rep)
	if err != nil || !inOrder(kinds(rep), []report.StepKind{report.StepPostRetry, report.StepFlushed, report.StepDrainPosted, report.StepDrainDone}) {
		t.Errorf("%v: want the drain WR retried after the flushes were polled\n%s", err, rep)
	}
	a.check(t, 1)
}

// Item 4: a Last WQE Reached seen before Add is not lost. The QP went to
// ERROR by itself and the caller's loop handed the event to the reaper
// before it handed over the QP.
func TestEventBeforeAdd(t *testing.T) {
	skipWithoutLastWQE(t)
	r := testRig(t)
	qp := r.pair(true)
	rp := newReaper(t, r.cq, drain.Options{LastWQETimeout: time.Hour, DrainTimeout: devtest.Timeout})
	devtest.ToError(t, qp)
	if ev := devtest.WaitEvent(t, r.dev, devtest.Timeout); rp.HandleEvent(ev) {
		t.Errorf("event %v of a QP not being drained claimed", ev)
	}
	h := add(t, rp, qp, drain.AddOptions{NoSends: true})
	pollUntilDone(t, rp, r.cq)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rep, err := h.Wait(ctx)
	checkProof(t, rep)
	if err != nil || rep.Recv.By != report.ProofBarrier || !rep.Recv.Stated || !has(rep, report.StepLastWQEStated) {
		t.Errorf("%v: want safe by the event seen before Add and a barrier\n%s", err, rep)
	}
}

// Item 4: the history is bounded, oldest dropped.
func TestEventHistoryBounded(t *testing.T) {
	r := quirkRig(t, soft.Quirks{})
	qps := r.pairs(3, true)
	rp := newReaper(t, r.cq, drain.Options{EventHistory: 2, LastWQETimeout: stall, DrainTimeout: devtest.Timeout})
	for _, qp := range qps {
		devtest.ToError(t, qp)
		rp.HandleEvent(devtest.WaitEvent(t, r.dev, devtest.Timeout))
	}
	hs := []*drain.Handle{add(t, rp, qps[0], drain.AddOptions{NoSends: true}), add(t, rp, qps[2], drain.AddOptions{NoSends: true})}
	pollAll(t, rp, r.cq)
	if rep, err := hs[1].Wait(testCtx(t)); err != nil {
		t.Errorf("newest event kept: %v\n%s", err, rep)
	}
	rep, err := hs[0].Wait(testCtx(t))
	wantErr(t, err, drain.ErrNoLastWQE)
	checkProof(t, rep)
}

// Item 5: stalls run in parallel. With a provider that never completes a
// drain WR (IBM eHCA) and one drain WR per QP, 20 QPs time out together:
// the first on its drain WR, the others waiting for the headroom it holds.
func TestStallsRunConcurrently(t *testing.T) {
	r := quirkRig(t, soft.Quirks{SendInErrorNotFlushed: true})
	qps := r.pairs(20, false)
	const timeout = 100 * time.Millisecond
	rp, _ := runReaper(t, r, drain.Options{MaxBatch: 1, MaxQuarantine: 100, DrainTimeout: timeout})
	start := time.Now()
	reps, err := drainWith(testCtx(t), rp, qps, counted)
	took := time.Since(start)
	if took > 5*timeout {
		t.Errorf("20 stalled drains took %v, want about one timeout (%v)", took, timeout)
	}
	for _, rep := range reps {
		checkProof(t, rep)
		if rep.Outcome != report.Quarantined || !(errors.Is(rep.Err, drain.ErrDrainNotFlushed) || errors.Is(rep.Err, drain.ErrNoHeadroom)) {
			t.Errorf("want quarantined for the drain WR or the headroom:\n%s", rep)
		}
	}
	wantErr(t, err, drain.ErrQuarantined)
	if st := rp.Stats(); st.MaxInFlight != 1 || st.Quarantined != 20 {
		t.Errorf("stats %+v: want 20 quarantined, never more than 1 drain WR", st)
	}
}

// Item 6: DrainAll drains a set and returns when each has an outcome, one
// report per QP in order; a QP Add refuses gets a failed report and the
// joined error names it.
func TestDrainAll(t *testing.T) {
	r := testRig(t)
	qps := r.pairs(6, !noLastWQE())
	reps, err := drain.DrainAll(testCtx(t), qps, drain.AddOptions{NoSends: true, CountRecvs: true}, drain.Options{LastWQETimeout: devtest.Timeout, DrainTimeout: devtest.Timeout,
		Queue: queueOf}, drain.Feed{Events: r.dev})
	if err != nil || len(reps) != len(qps) {
		t.Fatalf("DrainAll: %v, %d reports for %d QPs", err, len(reps), len(qps))
	}
	for i, rep := range reps {
		checkProof(t, rep)
		if rep.QPNum != qps[i].Num() || rep.Outcome != report.Safe {
			t.Errorf("report %d: qpn %d %s, want qpn %d safe", i, rep.QPNum, rep.Outcome, qps[i].Num())
		}
	}
	other := devtest.NewRC(t, r.pd, devtest.RCConfig{Cap: qpCap})
	reps, err = drain.DrainAll(testCtx(t), []ibv.QP{r.pair(false), other}, withSendCount(counted), drain.Options{Queue: queueOf}, drain.Feed{})
	wantErr(t, err, drain.ErrUnsupportedQP)
	if len(reps) != 2 || reps[0].Outcome != report.Safe || reps[1].Outcome != report.Failed {
		t.Errorf("reports %v: want one safe, one failed", reps)
	}
}

// Item 6: DrainAll of an SRQ QP with nobody handing it events says so.
func TestDrainQPSaysNoEvents(t *testing.T) {
	r := quirkRig(t, soft.Quirks{})
	qp := r.pair(true)
	rep, err := drainQP(testCtx(t), qp, drain.AddOptions{}, drain.Options{LastWQETimeout: stall}, drain.Feed{})
	wantErr(t, err, drain.ErrNoLastWQE, drain.ErrQuarantined)
	checkProof(t, rep)
	if err == nil || !strings.Contains(err.Error(), "no async event was delivered") {
		t.Errorf("error %v: want it to say that no event was delivered", err)
	}
}

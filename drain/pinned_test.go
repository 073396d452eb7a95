package drain_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/clock"
	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/soft"
)

// The tests in this file pin one rule each that a proof or a bound rests
// on, each with the smallest rig that breaks when the rule does.

// eHCARig is a soft device whose sends posted in ERROR never complete
// (IBM eHCA), so a drain WR stays outstanding as long as a test needs.
func eHCARig(t *testing.T) *rig {
	return quirkRig(t, soft.Quirks{SendInErrorNotFlushed: true})
}

// A CQ error of another CQ is not the reaper's: its drains go on.
func TestOtherCQErrorIgnored(t *testing.T) {
	r := quirkRig(t, soft.Quirks{})
	qp := r.pair(false)
	rp := newReaper(t, r.cq, drain.Options{DrainTimeout: devtest.Timeout, Queue: queueOf})
	h := add(t, rp, qp, counted)
	if rp.HandleEvent(ibv.AsyncEvent{Type: ibv.EventCQErr, CQ: r.peerCQ}) {
		t.Error("CQ_ERR of another CQ claimed")
	}
	pollUntilDone(t, rp, r.cq)
	if rep, err := h.Wait(testCtx(t)); err != nil {
		t.Errorf("after another CQ's CQ_ERR: %v, want safe\n%s", err, rep)
	}
	if _, err := rp.Add(r.pair(false), counted); err != nil {
		t.Errorf("Add after another CQ's CQ_ERR: %v", err)
	}
}

// A QP event other than Last WQE Reached (QP_FATAL) is recorded but is
// not Last WQE Reached: the drain still waits for it.
func TestOtherQPEventNotLastWQE(t *testing.T) {
	r := quirkRig(t, soft.Quirks{NoLastWQEReached: true})
	qp := r.pair(true)
	rp := newReaper(t, r.cq, drain.Options{LastWQETimeout: stall, DrainTimeout: devtest.Timeout, Clock: virtualClock()})
	h := add(t, rp, qp, drain.AddOptions{NoSends: true})
	if !rp.HandleEvent(ibv.AsyncEvent{Type: ibv.EventQPFatal, QP: qp}) {
		t.Error("QP_FATAL of a QP being drained not claimed")
	}
	pollAll(t, rp, r.cq)
	rep, err := h.Wait(testCtx(t))
	checkProof(t, rep)
	wantErr(t, err, drain.ErrNoLastWQE)
	if !has(rep, report.StepEvent) || has(rep, report.StepDrainPosted) {
		t.Errorf("QP_FATAL: want it recorded and no barrier posted for it\n%s", rep)
	}
}

// Add refuses a QP whose number names another QP still being drained:
// completions carry only the number, so two such QPs cannot be told apart.
func TestAddRefusesNumberInUse(t *testing.T) {
	r := eHCARig(t)
	qp := r.pair(false)
	rp := newReaper(t, r.cq, drain.Options{DrainTimeout: devtest.Timeout, Queue: queueOf})
	h := add(t, rp, qp, counted)
	other := renumbered{QP: r.pair(false), num: qp.Num()}
	if _, err := rp.Add(other, counted); !errors.Is(err, ibv.ErrBusy) {
		t.Errorf("Add of another QP with number %#x while it drains: %v, want ErrBusy", qp.Num(), err)
	}
	rp.Shutdown(endedCtx())
	if rep := h.Report(); rep.Outcome != report.Failed {
		t.Errorf("outcome %s, want failed by shutdown", rep.Outcome)
	}
}

// endedCtx is a context that has ended.
func endedCtx() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// A given-up QP's drain WR keeps its headroom after Failed (quarantine
// full) and after Shutdown, in the next reaper on the CQ: its completion
// may still take a CQ slot until the QP is destroyed through its handle
// and a poll after that finds the CQ empty.
func TestGivenUpKeepsHeadroom(t *testing.T) {
	r := eHCARig(t)
	opts := drain.Options{DrainTimeout: stall, MaxQuarantine: 1, Headroom: 3, Queue: queueOf}
	rp := newReaper(t, r.cq, opts)
	kept, failed := add(t, rp, r.pair(false), counted), add(t, rp, r.pair(false), counted)
	for _, h := range []*drain.Handle{kept, failed} {
		if _, err := h.Wait(testCtx(t)); err == nil {
			t.Fatal("a drain WR that never completes proved a QP")
		}
	}
	if kept.Report().Outcome != report.Quarantined {
		kept, failed = failed, kept
	}
	wantErr(t, failed.Report().Err, drain.ErrQuarantineFull)
	inFlight := func(rp *drain.Reaper, when string, want int) {
		t.Helper()
		if st := rp.Stats(); st.InFlight != want {
			t.Errorf("%s: %d drain WRs counted, want %d", when, st.InFlight, want)
		}
	}
	inFlight(rp, "after Failed", 2)
	rp.CQEmpty()
	rp.CQEmpty()
	inFlight(rp, "after empty polls, the failed QP not destroyed", 2)
	shut := add(t, rp, r.pair(false), counted)
	rp.Shutdown(endedCtx())
	if rep := shut.Report(); rep.Outcome != report.Failed {
		t.Fatalf("outcome %s, want failed by shutdown\n%s", rep.Outcome, rep)
	}
	inFlight(rp, "after Shutdown, which leaves them to the next reaper", 0)
	// One destroyed before the next reaper adopts it, two after.
	if err := kept.Destroy(); err != nil {
		t.Fatal(err)
	}
	next := newReaper(t, r.cq, opts)
	inFlight(next, "adopted", 3)
	// A poll loop's first call: its poll counts as begun before anything.
	next.CQEmpty()
	inFlight(next, "after the first empty poll", 3)
	next.CQEmpty()
	inFlight(next, "after an empty poll begun after the adoption", 2)
	for _, h := range []*drain.Handle{failed, shut} {
		if err := h.Destroy(); err != nil {
			t.Fatal(err)
		}
	}
	next.CQEmpty()
	inFlight(next, "after an empty poll begun before the destroys", 2)
	next.CQEmpty()
	inFlight(next, "after an empty poll begun after the destroys", 0)
}

// A remembered Last WQE Reached counts only for a QP that Add finds in
// ERROR: a QP Add moves to ERROR itself starts a new episode.
func TestRememberedEventNeedsError(t *testing.T) {
	r := quirkRig(t, soft.Quirks{NoLastWQEReached: true})
	qp, peer := r.pairAndPeer(true)
	devtest.ToError(t, qp)
	rp := newReaper(t, r.cq, drain.Options{LastWQETimeout: stall, DrainTimeout: devtest.Timeout, Clock: virtualClock()})
	rp.HandleEvent(ibv.AsyncEvent{Type: ibv.EventQPLastWQEReached, QP: qp})
	toReset(t, qp, peer)
	devtest.Connect(t, r.dev, qp, peer)
	r.wantEventForgotten(rp, qp, "the event remembered from before the QP left ERROR")
}

// MaxBatch caps the QPs one barrier drain WR releases.
func TestMaxBatchCap(t *testing.T) {
	r := quirkRig(t, soft.Quirks{})
	qps := r.pairs(5, true)
	for _, qp := range qps {
		devtest.ToError(t, qp)
	}
	rp := newReaper(t, r.cq, drain.Options{MaxBatch: 2, LastWQETimeout: devtest.Timeout, DrainTimeout: devtest.Timeout})
	var hs []*drain.Handle
	for _, qp := range qps {
		hs = append(hs, add(t, rp, qp, drain.AddOptions{NoSends: true}))
	}
	handEvents(t, rp, r.dev, len(qps))
	pollUntilDone(t, rp, r.cq)
	for _, rep := range waitAll(t, hs) {
		if rep.Batch > 2 {
			t.Errorf("qpn %d released by a barrier for %d QPs, MaxBatch 2\n%s", rep.QPNum, rep.Batch, rep)
		}
	}
	if st := rp.Stats(); st.DrainWRs < 3 {
		t.Errorf("stats %+v: 5 QPs, at most 2 per barrier, want at least 3 drain WRs", st)
	}
}

// A drain completion the reaper does not count (an unknown ID: another
// reaper's, or one no longer counted) or that comes from another QP than
// its WR's proves nothing: it releases no QP.
func TestForeignDrainWCReleasesNothing(t *testing.T) {
	r := quirkRig(t, soft.Quirks{})
	qp := r.pair(true)
	devtest.ToError(t, qp)
	rp := newReaper(t, r.cq, drain.Options{LastWQETimeout: devtest.Timeout, DrainTimeout: devtest.Timeout})
	h := add(t, rp, qp, drain.AddOptions{NoSends: true})
	handEvents(t, rp, r.dev, 1)
	posted := func() uint64 {
		for _, s := range h.Report().Steps() {
			if s.Kind == report.StepDrainPosted {
				return s.WRID
			}
		}
		t.Fatalf("no barrier posted:\n%s", h.Report())
		return 0
	}()
	for _, wc := range []ibv.WC{
		{ID: drain.WRIDTag | 1<<47, Status: ibv.WCWRFlushErr, QPNum: qp.Num()},
		{ID: posted, Status: ibv.WCWRFlushErr, QPNum: qp.Num() + 1},
	} {
		if !rp.HandleWC(wc) {
			t.Errorf("completion %#x not claimed", wc.ID)
		}
		if rep := h.Report(); rep.Outcome != report.Pending {
			t.Fatalf("completion %#x on qpn %d ended the drain:\n%s", wc.ID, wc.QPNum, rep)
		}
	}
	if st := rp.Stats(); st.LateDrainWCs != 2 || st.InFlight != 1 {
		t.Errorf("stats %+v: want 2 late drain completions, the barrier still counted", st)
	}
	pollUntilDone(t, rp, r.cq)
	waitAll(t, []*drain.Handle{h})
}

// stallingCQ is a CQ whose Poll lets time pass before it polls, as a poll
// preempted between its start and its result.
type stallingCQ struct {
	ibv.CQ
	during func()
}

func (c *stallingCQ) Poll(wcs []ibv.WC) (int, error) {
	if c.during != nil {
		c.during()
	}
	return c.CQ.Poll(wcs)
}

// stallingQP completes into a stallingCQ.
type stallingQP struct {
	ibv.QP
	cq *stallingCQ
}

func (q stallingQP) SendCQ() ibv.CQ { return q.cq }
func (q stallingQP) RecvCQ() ibv.CQ { return q.cq }

// An empty poll begun before a stall proves nothing about what the stalled
// QP left in the CQ: under DestroyWhenEmpty only a poll begun after the
// stall releases it.
func TestEmptyPollBeforeStall(t *testing.T) {
	r := eHCARig(t)
	cq := &stallingCQ{CQ: r.cq}
	qp := stallingQP{QP: r.pair(false), cq: cq}
	const timeout = 50 * time.Millisecond
	rp := newReaper(t, cq, drain.Options{Policy: drain.DestroyWhenEmpty, DrainTimeout: timeout, Queue: queueOf})
	h := add(t, rp, qp, counted)
	cq.during = func() {
		// The poll has begun; the drain WR's timeout runs out before the
		// poll returns (any call into the reaper fires it).
		time.Sleep(2 * timeout)
		rp.HandleEvent(ibv.AsyncEvent{Type: ibv.EventSQDrained})
	}
	if n, err := rp.Poll(); n != 0 || err != nil {
		t.Fatalf("Poll: %d, %v; want an empty poll", n, err)
	}
	cq.during = nil
	rep := h.Report()
	if rep.Outcome != report.Pending || rep.Stall == nil {
		t.Fatalf("after an empty poll begun before the stall: %s, want stalled and pending\n%s", rep.Outcome, rep)
	}
	if n, err := rp.Poll(); n != 0 || err != nil {
		t.Fatalf("Poll: %d, %v; want an empty poll", n, err)
	}
	if rep := h.Report(); rep.Outcome != report.DestroyedAfterEmptyCQ {
		t.Errorf("after an empty poll begun after the stall: %s, want destroyed after empty CQ\n%s", rep.Outcome, rep)
	}
}

// busyCQ keeps the reaper's CQ busy with the completions of a QP that is
// not being drained, so that no poll finds it empty: before every poll it
// posts a signaled zero-length RDMA WRITE, which needs no receive at the
// peer and completes at once.
type busyCQ struct {
	t  *testing.T
	rp *drain.Reaper
	cq ibv.CQ
	qp ibv.QP
	n  uint64
}

// poll posts a WRITE, polls one completion and hands it to the reaper.
func (b *busyCQ) poll() {
	b.t.Helper()
	b.n++
	if err := b.qp.PostSend([]ibv.SendWR{{ID: sendIDBase | b.n, Opcode: ibv.WRRDMAWrite, Flags: ibv.SendSignaled}}); err != nil {
		b.t.Fatal(err)
	}
	wc := make([]ibv.WC, 1)
	n, err := b.cq.Poll(wc)
	if err != nil {
		b.t.Fatal(err)
	}
	if n == 0 {
		b.t.Fatal("the reaper's CQ polled empty: the traffic must keep it busy")
	}
	b.rp.HandleWC(wc[0])
}

// wantEmptyPollNeverCame fails unless rep is a drain under DestroyWhenEmpty
// whose drain WR stalled and whose wait for an empty poll then ran out,
// DrainTimeout (timeout) after the stall, exactly on a virtual clock.
func wantEmptyPollNeverCame(t *testing.T, rep *report.Report, timeout time.Duration, virtual bool) {
	t.Helper()
	checkProof(t, rep)
	wantErr(t, rep.Stall, drain.ErrDrainNotFlushed)
	wantErr(t, rep.Err, drain.ErrCQNotEmpty)
	if rep.Outcome != report.Failed || rep.Err == nil || !strings.Contains(rep.Err.Error(), fmt.Sprintf("qpn %d", rep.QPNum)) ||
		!strings.Contains(rep.Err.Error(), timeout.String()) {
		t.Errorf("outcome %s, %v; want failed, naming the QP and the bound %v\n%s", rep.Outcome, rep.Err, timeout, rep)
	}
	var stalls []report.Step
	steps := rep.Steps()
	for _, s := range steps {
		if s.Kind == report.StepStall {
			stalls = append(stalls, s)
		}
	}
	if len(stalls) != 2 || !errors.Is(stalls[1].Err, drain.ErrCQNotEmpty) {
		t.Fatalf("want the drain WR's stall, then one saying no empty poll came:\n%s", rep)
	}
	end := steps[len(steps)-1]
	switch el := end.At - stalls[0].At; {
	case virtual && el != timeout:
		t.Errorf("outcome %v after the stall on a virtual clock, want exactly DrainTimeout %v:\n%s", el, timeout, rep)
	case el < timeout || el > 20*timeout:
		t.Errorf("outcome %v after the stall, want about DrainTimeout %v:\n%s", el, timeout, rep)
	}
}

// On a CQ that other QPs' traffic keeps busy no poll finds it empty, so a
// QP stalled under DestroyWhenEmpty waits for an empty poll that never
// comes: that wait too runs out, DrainTimeout after the stall, and the
// drain fails with ErrCQNotEmpty, its drain WR handed back with the QP.
// The reaper before gave that wait no deadline: the drain never ended.
func TestBusyCQEmptyPollBounded(t *testing.T) {
	const timeout, tick = 100 * time.Millisecond, time.Millisecond
	clock := clock.NewVirtual(time.Unix(1e9, 0))
	r := eHCARig(t)
	qp := r.pair(false)
	rp := newReaper(t, r.cq, drain.Options{Policy: drain.DestroyWhenEmpty, DrainTimeout: timeout, Queue: queueOf, Clock: clock})
	h := add(t, rp, qp, counted)
	b := &busyCQ{t: t, rp: rp, cq: r.cq, qp: r.pair(false)}
	start := clock.Now()
	for done := false; !done; {
		select {
		case <-h.Done():
			done = true
			continue
		default:
		}
		if el := clock.Now().Sub(start); el > 10*timeout {
			t.Fatalf("no outcome %v after Add, DrainTimeout %v, with the CQ busy at every poll:\n%s", el, timeout, h.Report())
		}
		b.poll()
		clock.Advance(tick)
	}
	wantEmptyPollNeverCame(t, h.Report(), timeout, true)
	if st := rp.Stats(); st.InFlight != 1 || st.Failed != 1 {
		t.Errorf("stats %+v: want 1 failed, its drain WR counted until a later empty poll", st)
	}
}

// Wait wakes for the end of the wait for an empty poll, on the real clock
// and on a virtual one, with no poll after the stall.
func TestWaitEndsEmptyPollWait(t *testing.T) {
	const timeout = 50 * time.Millisecond
	for _, c := range []struct {
		name  string
		clock clock.Clock
	}{{"real", clock.Real{}}, {"virtual", virtualClock()}} {
		t.Run(c.name, func(t *testing.T) {
			r := eHCARig(t)
			rp := newReaper(t, r.cq, drain.Options{Policy: drain.DestroyWhenEmpty, DrainTimeout: timeout, Queue: queueOf, Clock: c.clock})
			h := add(t, rp, r.pair(false), counted)
			b := &busyCQ{t: t, rp: rp, cq: r.cq, qp: r.pair(false)}
			vc, virtual := c.clock.(*clock.Virtual)
			deadline := time.Now().Add(devtest.Timeout)
			for !has(h.Report(), report.StepStall) {
				if time.Now().After(deadline) {
					t.Fatalf("no stall within %v, DrainTimeout %v:\n%s", devtest.Timeout, timeout, h.Report())
				}
				b.poll()
				if virtual {
					vc.Advance(time.Millisecond)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*timeout)
			defer cancel()
			rep, err := h.Wait(ctx)
			if ctx.Err() != nil {
				t.Fatalf("Wait did not end within %v of the stall, DrainTimeout %v: %v\n%s", 20*timeout, timeout, err, rep)
			}
			wantEmptyPollNeverCame(t, rep, timeout, virtual)
		})
	}
}

// Wait, and Run on a completion channel, wake for a posted drain WR's
// deadline without any completion or event: the stall fires on time.
func TestWakesForDrainWRDeadline(t *testing.T) {
	const timeout = 50 * time.Millisecond
	// On the real clock the wake-up is bounded; on a virtual clock, whose
	// only advance is the reaper's own sleep to its deadline, the stall is
	// recorded exactly timeout after the drain began.
	clocks := []struct {
		name  string
		clock func() clock.Clock
	}{
		{"real", func() clock.Clock { return clock.Real{} }},
		{"virtual", virtualClock},
	}
	check := func(t *testing.T, name string, rep *report.Report, began time.Time) {
		t.Helper()
		var el time.Duration
		stalled := false
		for _, s := range rep.Steps() {
			if s.Kind == report.StepStall {
				el, stalled = s.At, true
			}
		}
		switch {
		case !stalled:
			t.Errorf("no stall step:\n%s", rep)
		case name == "virtual" && el != timeout:
			t.Errorf("stall %v after the start on a virtual clock, want exactly %v:\n%s", el, timeout, rep)
		case time.Since(began) > 20*timeout:
			t.Errorf("outcome after %v, drain WR timeout %v", time.Since(began), timeout)
		}
	}
	for _, c := range clocks {
		t.Run("Wait/"+c.name, func(t *testing.T) {
			r := eHCARig(t)
			rp := newReaper(t, r.cq, drain.Options{DrainTimeout: timeout, Queue: queueOf, Clock: c.clock()})
			h := add(t, rp, r.pair(false), counted)
			began := time.Now()
			rep, err := h.Wait(testCtx(t))
			wantErr(t, err, drain.ErrQuarantined, drain.ErrDrainNotFlushed)
			check(t, c.name, rep, began)
		})
		t.Run("Run/"+c.name, func(t *testing.T) {
			r, rp := runOnChannel(t, soft.Quirks{SendInErrorNotFlushed: true}, drain.Options{DrainTimeout: timeout, Queue: queueOf, Clock: c.clock()})
			began := time.Now()
			h := add(t, rp, r.pair(false), counted)
			select {
			case <-h.Done():
			case <-time.After(20 * timeout):
				t.Fatalf("no outcome %v after the drain WR's timeout %v, Run polling on a channel:\n%s", 20*timeout, timeout, h.Report())
			}
			wantErr(t, h.Report().Err, drain.ErrDrainNotFlushed)
			check(t, c.name, h.Report(), began)
		})
	}
}

// Drain WR IDs are unique per CQ across reapers: a reaper that replaces
// another on the same CQ numbers its drain WRs past the other's.
func TestDrainWRIDsUniqueAcrossReapers(t *testing.T) {
	r := eHCARig(t)
	first := newReaper(t, r.cq, drain.Options{DrainTimeout: devtest.Timeout, Queue: queueOf})
	old := add(t, first, r.pair(false), counted)
	first.Shutdown(endedCtx())
	// Room beside the old drain WR, which the new reaper counts.
	rp := newReaper(t, r.cq, drain.Options{DrainTimeout: devtest.Timeout, Headroom: 2, Queue: queueOf})
	h := add(t, rp, r.pair(false), counted)
	defer rp.Shutdown(endedCtx())
	posted := func(h *drain.Handle) uint64 {
		for _, s := range h.Report().Steps() {
			if s.Kind == report.StepDrainPosted {
				return s.WRID
			}
		}
		t.Fatalf("no drain WR posted:\n%s", h.Report())
		return 0
	}
	if a, b := posted(old), posted(h); a == b {
		t.Errorf("two reapers on one CQ both posted drain WR %#x", a)
	}
}

// A QP found in ERROR while counting its receives may have flushed them
// before the CQ was proven past earlier QPs with its number: the count
// cannot be trusted, and a receive drain WR proves the receive queue.
func TestCountFoundInError(t *testing.T) {
	r := quirkRig(t, soft.Quirks{})
	qp := r.pair(false)
	r.postRecvs(qp, 4)
	devtest.ToError(t, qp)
	rp := newReaper(t, r.cq, drain.Options{DrainTimeout: 2 * time.Second, Queue: queueOf})
	h := add(t, rp, qp, drain.AddOptions{CountRecvs: true, Recvs: 4, NoSends: true})
	pollUntilDone(t, rp, r.cq)
	rep, err := h.Wait(testCtx(t))
	checkProof(t, rep)
	if err != nil || rep.Recv.By != report.ProofRecvDrainWR || !has(rep, report.StepCountNotTrusted) {
		t.Errorf("%v: want safe by a receive drain WR, the count not trusted\n%s", err, rep)
	}
}

// A Last WQE Reached handed over after its QP left ERROR belongs to an
// episode that ended: it is not remembered for the next.
func TestHistoryAfterErrorLeft(t *testing.T) {
	r := quirkRig(t, soft.Quirks{NoLastWQEReached: true})
	qp, peer := r.pairAndPeer(true)
	devtest.ToError(t, qp)
	toReset(t, qp, peer)
	rp := newReaper(t, r.cq, drain.Options{LastWQETimeout: stall, DrainTimeout: devtest.Timeout, Clock: virtualClock()})
	rp.HandleEvent(ibv.AsyncEvent{Type: ibv.EventQPLastWQEReached, QP: qp})
	devtest.Connect(t, r.dev, qp, peer)
	devtest.ToError(t, qp)
	r.wantEventForgotten(rp, qp, "an event handed over in RESET")
}

// A Last WQE Reached raised in a QP's earlier error episode and handed
// over only after the QP was reset and added again, by an event loop that
// lags, proves nothing: on a device that raises no event of its own, the
// drain stalls for one. Without the episode check the old event released
// the QP, safe, with no Last WQE Reached of its own episode.
func TestLateEventOfEarlierEpisode(t *testing.T) {
	r := quirkRig(t, soft.Quirks{NoLastWQEReached: true})
	qp, peer := r.pairAndPeer(true)
	devtest.ToError(t, qp)
	late := ibv.AsyncEvent{Type: ibv.EventQPLastWQEReached, QP: qp, QPResets: qp.Resets()}
	toReset(t, qp, peer)
	devtest.Connect(t, r.dev, qp, peer)
	rp := newReaper(t, r.cq, drain.Options{LastWQETimeout: stall, DrainTimeout: devtest.Timeout, Clock: virtualClock()})
	h := add(t, rp, qp, drain.AddOptions{NoSends: true})
	if !rp.HandleEvent(late) {
		t.Error("the late event of the QP being drained was not claimed")
	}
	pollAll(t, rp, r.cq)
	rep, err := h.Wait(testCtx(t))
	checkProof(t, rep)
	wantErr(t, err, drain.ErrNoLastWQE)
	if st := rp.Stats(); st.LateEvents != 1 {
		t.Errorf("stats %+v: want the event counted late", st)
	}
}

// A remembered Last WQE Reached serves only the QP object it was raised
// for: a QP created with the number of a destroyed one, in ERROR in its
// first episode as the old one was, does not take the old one's event.
func TestRememberedEventOfDestroyedQP(t *testing.T) {
	// An adversarial schedule: only it hands out the numbers of destroyed
	// QPs again.
	dev, err := soft.Open(soft.Config{Quirks: soft.Quirks{NoLastWQEReached: true}, Schedule: soft.Schedule{Seed: 1}})
	if err != nil {
		t.Fatal(err)
	}
	devtest.Close(t, dev)
	r := newRig(t, dev, nil, 256)
	r.postRecvs(nil, 64)
	rp := newReaper(t, r.cq, drain.Options{LastWQETimeout: stall, DrainTimeout: devtest.Timeout, Clock: virtualClock()})
	for range 32 {
		old := r.pair(true)
		devtest.ToError(t, old)
		rp.HandleEvent(ibv.AsyncEvent{Type: ibv.EventQPLastWQEReached, QP: old, QPResets: old.Resets()})
		num := old.Num()
		if err := old.Close(); err != nil {
			t.Fatal(err)
		}
		qp := r.pair(true)
		if qp.Num() != num {
			continue
		}
		devtest.ToError(t, qp)
		r.wantEventForgotten(rp, qp, "the event of a destroyed QP with the same number")
		return
	}
	t.Fatal("no QP number reused in 32 tries")
}

// refusingQP refuses every send: a drain WR on it fails to post.
type refusingQP struct{ ibv.QP }

func (refusingQP) PostSend([]ibv.SendWR) error {
	return &ibv.PostError{Err: ibv.ErrInvalidArgument}
}

// The drain WR of a QP given up on (here: its receive drain WR went out,
// its send drain WR was refused) proves nothing once its QP is the
// caller's: its late completion releases no QP waiting for a barrier.
func TestStaleDrainWCReleasesNothing(t *testing.T) {
	r := eHCARig(t) // the barrier, a send in ERROR, never completes
	waiting := r.pair(true)
	devtest.ToError(t, waiting)
	rp := newReaper(t, r.cq, drain.Options{Headroom: 3, LastWQETimeout: devtest.Timeout, DrainTimeout: devtest.Timeout, Queue: queueOf})
	h := add(t, rp, waiting, drain.AddOptions{NoSends: true})
	handEvents(t, rp, r.dev, 1)
	failed := add(t, rp, refusingQP{r.pair(false)}, drain.AddOptions{})
	rep := failed.Report()
	wantErr(t, rep.Err, drain.ErrPostDrain)
	if !has(rep, report.StepRecvDrainPosted) {
		t.Fatalf("want the receive drain WR posted before the refused send:\n%s", rep)
	}
	pollAll(t, rp, r.cq)
	if st := rp.Stats(); st.LateDrainWCs != 1 {
		t.Errorf("stats %+v: want the given-up QP's drain WR completed late", st)
	}
	if rep := h.Report(); rep.Outcome != report.Pending || rep.Recv.By != report.ProofNone || has(rep, report.StepDrainDone) {
		t.Errorf("the given-up QP's drain WR served as a barrier:\n%s", rep)
	}
	rp.Shutdown(endedCtx())
}

// CQEmpty's poll counts as begun at the poll loop's previous call: a QP
// counting its receives added after that call waits for the next empty
// poll before its move to ERROR, and then counts them all.
func TestCQEmptyCountsFromLastCall(t *testing.T) {
	r := quirkRig(t, soft.Quirks{})
	qp := r.pair(false)
	r.postRecvs(qp, 4)
	rp := newReaper(t, r.cq, drain.Options{DrainTimeout: devtest.Timeout, Queue: queueOf})
	rp.CQEmpty()
	h := add(t, rp, qp, drain.AddOptions{CountRecvs: true, Recvs: 4, NoSends: true})
	rp.CQEmpty() // the poll may have begun before Add
	if _, err := h.Wait(endedCtx()); !errors.Is(err, drain.ErrCQNotEmpty) {
		t.Errorf("Wait while the count waits for an empty poll: %v, want ErrCQNotEmpty", err)
	}
	if st := devtest.State(t, qp); st != ibv.QPSRTS {
		t.Fatalf("QP in %s after an empty poll that may have begun before Add, want RTS until a later one:\n%s", st, h.Report())
	}
	rp.CQEmpty()
	if st := devtest.State(t, qp); st != ibv.QPSErr {
		t.Fatalf("QP in %s after an empty poll begun after Add, want ERR:\n%s", st, h.Report())
	}
	pollUntilDone(t, rp, r.cq)
	rep, err := h.Wait(testCtx(t))
	checkProof(t, rep)
	if err != nil || rep.Recv.By != report.ProofRecvCount || rep.Recv.Count != 4 {
		t.Errorf("%v: want safe by 4 receives counted back\n%s", err, rep)
	}
}

// Without an empty poll within DrainTimeout the count is not trusted
// either: the QP still gets its move to ERROR and a receive drain WR, and
// the drain ends within its bounds.
func TestCountWithoutEmptyPoll(t *testing.T) {
	r := quirkRig(t, soft.Quirks{})
	qp := r.pair(false)
	r.postRecvs(qp, 4)
	rp := newReaper(t, r.cq, drain.Options{DrainTimeout: stall, Queue: queueOf})
	h := add(t, rp, qp, drain.AddOptions{CountRecvs: true, Recvs: 4, NoSends: true})
	rep, err := h.Wait(testCtx(t)) // nobody polls
	checkProof(t, rep)
	wantErr(t, err, drain.ErrQuarantined, drain.ErrDrainNotFlushed)
	if !has(rep, report.StepCountNotTrusted) || !has(rep, report.StepRecvDrainPosted) || devtest.State(t, qp) != ibv.QPSErr {
		t.Errorf("want the count untrusted, the QP in ERROR with a receive drain WR\n%s", rep)
	}
}

// Run on a completion channel polls for a QP counting its receives, whose
// Add raises no completion (its move to ERROR waits for that poll): the
// count is proven at once, not untrusted at its deadline.
func TestRunPollsForCount(t *testing.T) {
	r, rp := runOnChannel(t, soft.Quirks{}, drain.Options{DrainTimeout: devtest.Timeout, Queue: queueOf})
	for range 3 {
		time.Sleep(time.Millisecond) // Run waits on the channel
		qp := r.pair(false)
		r.postRecvs(qp, 4)
		h := add(t, rp, qp, drain.AddOptions{CountRecvs: true, Recvs: 4, NoSends: true})
		wctx, wcancel := context.WithTimeout(context.Background(), time.Second)
		rep, err := h.Wait(wctx)
		wcancel()
		checkProof(t, rep)
		if err != nil || rep.Recv.By != report.ProofRecvCount {
			t.Fatalf("%v: want safe by the count within 1s\n%s", err, rep)
		}
	}
}

// runOnChannel is a rig on a soft device with quirks whose CQ has a
// completion channel, and a reaper with opts on it, fed by Run on that
// channel until the test ends.
func runOnChannel(t *testing.T, q soft.Quirks, opts drain.Options) (*rig, *drain.Reaper) {
	t.Helper()
	dev := openSoft(t, soft.Config{Quirks: q})
	ch, cq := newCQ(t, dev, 64, true)
	r := newRig(t, dev, cq, 64)
	rp := newReaper(t, cq, opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rp.Run(ctx, drain.Feed{Channel: ch}) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return r, rp
}

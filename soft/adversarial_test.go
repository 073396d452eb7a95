package soft_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/soft"
)

// seeds is how many adversarial seeds the tests of a choice explore: enough
// that each branch of every choice is taken.
const seeds = 64

// recorder collects a device's trace as lines.
type recorder struct{ lines []string }

func (r *recorder) add(e soft.TraceEntry) { r.lines = append(r.lines, e.String()) }

// flushScenario moves a connected QP with sends held in flight and own
// receives to ERROR and polls its CQ one completion at a time, returning
// the trace and the completions in the order polled.
func flushScenario(t *testing.T, seed uint64) ([]string, []ibv.WC) {
	t.Helper()
	rec := &recorder{}
	fab := soft.NewFabric()
	e := newEnv(t, soft.Config{Fabric: fab, Schedule: soft.Schedule{Seed: seed}, Trace: rec.add})
	cq := e.cq(64)
	mr := e.mr(4096, ibv.AccessLocalWrite)
	a, b := e.qp(cq, nil), e.qp(e.cq(64), nil)
	connect(t, a, b, 1)
	fab.SetAutoProgress(false)
	for i := range 4 {
		postRecv(t, a, ibv.RecvWR{ID: 100 + uint64(i), SGL: sge(mr, 0, 64)})
		post(t, a, ibv.SendWR{ID: 200 + uint64(i), Opcode: ibv.WRSend, Flags: ibv.SendSignaled, SGL: sge(mr, 0, 8)})
	}
	toState(t, a, ibv.QPSErr)
	var got []ibv.WC
	wc := make([]ibv.WC, 1)
	for len(got) < 8 {
		n, err := cq.Poll(wc)
		if err != nil || n == 0 {
			t.Fatalf("seed %d: poll %d: %d completions (%v), want 1", seed, len(got), n, err)
		}
		got = append(got, wc[0])
	}
	fab.SetAutoProgress(true)
	return rec.lines, got
}

// The adversarial schedule flushes each work queue in order and
// interleaves the send and receive queues, over later calls.
func TestAdversarialFlushInterleaved(t *testing.T) {
	orders := map[string]bool{}
	for seed := uint64(1); seed <= seeds; seed++ {
		_, got := flushScenario(t, seed)
		var ids []string
		var sends, recvs []uint64
		for _, wc := range got {
			if wc.Status != ibv.WCWRFlushErr {
				t.Fatalf("seed %d: %v, want a flush", seed, wc)
			}
			ids = append(ids, fmt.Sprint(wc.ID))
			if wc.ID >= 200 {
				sends = append(sends, wc.ID)
			} else {
				recvs = append(recvs, wc.ID)
			}
		}
		if !slices.IsSorted(sends) || !slices.IsSorted(recvs) {
			t.Fatalf("seed %d: completions %v out of order within a work queue", seed, ids)
		}
		orders[strings.Join(ids, " ")] = true
	}
	if orders["200 201 202 203 100 101 102 103"] && len(orders) == 1 || len(orders) < 4 {
		t.Errorf("%d seeds gave %d flush orders, want the queues interleaved in many ways: %v", seeds, len(orders), orders)
	}
}

// recvsPosted is a QP on the schedule of seed, connected to a peer, with n
// receives posted (wr_id 0 to n-1), and the CQ it completes into.
func recvsPosted(t *testing.T, seed uint64, n int) (*soft.QP, ibv.CQ) {
	t.Helper()
	e := newEnv(t, soft.Config{Schedule: soft.Schedule{Seed: seed}})
	cq := e.cq(64)
	mr := e.mr(4096, ibv.AccessLocalWrite)
	a, b := e.qp(cq, nil), e.qp(e.cq(4), nil)
	connect(t, a, b, 1)
	for i := range n {
		postRecv(t, a, ibv.RecvWR{ID: uint64(i), SGL: sge(mr, 0, 64)})
	}
	return a, cq
}

// A move to ERROR generates no flush by itself: the flushes come with later
// calls, a few at a time.
func TestAdversarialFlushDeferred(t *testing.T) {
	for seed := uint64(1); seed <= seeds; seed++ {
		a, cq := recvsPosted(t, seed, 16)
		toState(t, a, ibv.QPSErr)
		wcs := make([]ibv.WC, 32)
		n, err := cq.Poll(wcs)
		if err != nil || n == 0 || n > 4 {
			t.Fatalf("seed %d: first poll after ERROR got %d completions (%v), want 1..4 of 16", seed, n, err)
		}
		total := n
		for polls := 0; total < 16; polls++ {
			if polls > 100 {
				t.Fatalf("seed %d: %d of 16 flushes after 100 polls", seed, total)
			}
			n, err := cq.Poll(wcs)
			if err != nil {
				t.Fatal(err)
			}
			total += n
		}
	}
}

// lastWQEScenario flushes an SRQ QP holding WQEs taken ahead and returns
// its trace. With again, the device has quirk LastWQEReachedAgain and a
// send (wr_id 100) is posted on the QP once it is in ERROR, which raises
// the event again.
func lastWQEScenario(t *testing.T, seed uint64, again bool) []string {
	t.Helper()
	rec := &recorder{}
	e := newEnv(t, soft.Config{SRQPrefetch: 4, Schedule: soft.Schedule{Seed: seed}, Trace: rec.add,
		Quirks: soft.Quirks{LastWQEReachedAgain: again}})
	cq := e.cq(64)
	srq := e.srq(16, 0)
	mr := e.mr(4096, ibv.AccessLocalWrite)
	for i := range 8 {
		if err := srq.PostRecv([]ibv.RecvWR{{ID: uint64(i), SGL: sge(mr, 0, 64)}}); err != nil {
			t.Fatal(err)
		}
	}
	a, b := e.qp(cq, srq), e.qp(e.cq(64), nil)
	connect(t, a, b, 1)
	toState(t, a, ibv.QPSErr)
	if again {
		post(t, a, ibv.SendWR{ID: 100, Opcode: ibv.WRSend})
	}
	if ev := waitEvent(t, e.dev); ev.Type != ibv.EventQPLastWQEReached || ev.QP != a {
		t.Fatalf("seed %d: event %v, want Last WQE Reached of QP %d", seed, ev, a.Num())
	}
	for polls := 0; a.Outstanding() > 0; polls++ {
		if polls > 100 {
			t.Fatalf("seed %d: %d WRs outstanding after 100 polls", seed, a.Outstanding())
		}
		pollAll(t, cq)
	}
	return rec.lines
}

// Last WQE Reached comes only after the flush of every WQE the QP took from
// the SRQ has been generated, however late the flushes come; so does a
// repeat (quirk LastWQEReachedAgain) raised by a send posted in ERROR. The
// device before counted the event as raised once it was due, so such a
// send could raise the repeat before the first: on 237 of 400 seeds.
func TestAdversarialLastWQEAfterFlush(t *testing.T) {
	for _, again := range []bool{false, true} {
		for seed := uint64(1); seed <= 400; seed++ {
			lines := lastWQEScenario(t, seed, again)
			event, flushes := -1, []int{}
			for i, l := range lines {
				switch {
				case strings.Contains(l, "QP_LAST_WQE_REACHED") && event < 0:
					event = i
				case strings.Contains(l, "WR_FLUSH_ERR") && !strings.Contains(l, "wr_id=100 "):
					flushes = append(flushes, i)
				}
			}
			if len(flushes) != 4 || event < 0 {
				t.Fatalf("seed %d (again %v): %d flushes of SRQ WQEs, event at %d, want 4 and the event:\n%s", seed, again, len(flushes), event, strings.Join(lines, "\n"))
			}
			if event < flushes[3] {
				t.Fatalf("seed %d (again %v): Last WQE Reached before the flush of the last WQE taken:\n%s", seed, again, strings.Join(lines, "\n"))
			}
		}
	}
}

// Async events wait a few device calls after their condition.
func TestAdversarialEventDelayed(t *testing.T) {
	delayed := 0
	for seed := uint64(1); seed <= seeds; seed++ {
		rec := &recorder{}
		e := newEnv(t, soft.Config{Schedule: soft.Schedule{Seed: seed}, Trace: rec.add})
		srq := e.srq(16, 0)
		if err := e.dev.InjectSRQError(srq); err != nil {
			t.Fatal(err)
		}
		// The trace records an event when it becomes deliverable.
		if !slices.ContainsFunc(rec.lines, func(l string) bool { return strings.Contains(l, "SRQ_ERR") }) {
			delayed++
		}
		if ev := waitEvent(t, e.dev); ev.Type != ibv.EventSRQErr {
			t.Fatalf("seed %d: event %v, want SRQ_ERR", seed, ev)
		}
	}
	if delayed == 0 || delayed == seeds {
		t.Errorf("%d of %d seeds delayed SRQ_ERR, want some and not all", delayed, seeds)
	}
}

// waitEvent returns dev's next async event, failing the test after a second.
func waitEvent(t testing.TB, dev *soft.Device) ibv.AsyncEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	ev, err := dev.NextAsyncEvent(ctx)
	if err != nil {
		t.Fatalf("waiting for an async event: %v", err)
	}
	return ev
}

// The responder's and the requester's completions of one SEND land in
// either order.
func TestAdversarialResponderRequesterOrder(t *testing.T) {
	first := map[string]int{}
	for seed := uint64(1); seed <= seeds; seed++ {
		rec := &recorder{}
		e := newEnv(t, soft.Config{Schedule: soft.Schedule{Seed: seed}, Trace: rec.add})
		cq := e.cq(64)
		mr := e.mr(4096, ibv.AccessLocalWrite)
		a, b := e.qp(cq, nil), e.qp(cq, nil)
		connect(t, a, b, 1)
		postRecv(t, b, ibv.RecvWR{ID: 1, SGL: sge(mr, 0, 64)})
		rec.lines = nil
		post(t, a, ibv.SendWR{ID: 2, Opcode: ibv.WRSend, Flags: ibv.SendSignaled, SGL: sge(mr, 64, 8)})
		got := pollAll(t, cq)
		if len(got) != 2 {
			t.Fatalf("seed %d: %v, want two completions", seed, got)
		}
		first[got[0].Opcode.String()]++
	}
	if len(first) != 2 {
		t.Errorf("first completion by opcode over %d seeds: %v, want both orders", seeds, first)
	}
}

// The same seed and the same calls give the same trace; other seeds give
// other traces.
func TestAdversarialReproducible(t *testing.T) {
	traces := map[string]bool{}
	for seed := uint64(1); seed <= 8; seed++ {
		x, _ := flushScenario(t, seed)
		y, _ := flushScenario(t, seed)
		if !slices.Equal(x, y) {
			t.Fatalf("seed %d gave two traces:\n%s\n---\n%s", seed, strings.Join(x, "\n"), strings.Join(y, "\n"))
		}
		traces[strings.Join(x, "\n")] = true
	}
	if len(traces) < 2 {
		t.Errorf("8 seeds gave %d traces, want different ones", len(traces))
	}
}

// QP numbers of destroyed QPs come back, as on hardware, and an event the
// destroyed QP raised is dropped with it (the error contract of
// ibv.Context.NextAsyncEvent): it never reaches the caller as an event of
// the new QP that has its number.
func TestAdversarialQPNumberReuse(t *testing.T) {
	reused := 0
	for seed := uint64(1); seed <= seeds; seed++ {
		e := newEnv(t, soft.Config{Schedule: soft.Schedule{Seed: seed}})
		cq := e.cq(16)
		srq := e.srq(4, 0)
		old, err := e.pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, SRQ: srq, Type: ibv.QPTRC, Cap: ibv.QPCap{MaxSendWR: 1}})
		if err != nil {
			t.Fatal(err)
		}
		toState(t, old, ibv.QPSErr) // raises Last WQE Reached, maybe later
		if err := old.Close(); err != nil {
			t.Fatal(err)
		}
		q := e.qp(cq, nil)
		if q.Num() != old.Num() {
			continue
		}
		reused++
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		ev, err := e.dev.NextAsyncEvent(ctx)
		cancel()
		if err == nil {
			t.Fatalf("seed %d: event %v (QP object %p) delivered after its QP %p was destroyed; the new QP is %p", seed, ev, ev.QP, old, q)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("seed %d: waiting for an event: %v", seed, err)
		}
	}
	if reused == 0 {
		t.Errorf("no seed of %d reused a QP number", seeds)
	}
}

// Devices of one seed start their QP numbers at different places, so
// numbers overlap without lining up.
func TestAdversarialQPNumbersAcrossDevices(t *testing.T) {
	fab := soft.NewFabric()
	sched := soft.Schedule{Seed: 7}
	x := newEnv(t, soft.Config{Name: "x", Fabric: fab, Schedule: sched})
	y := newEnv(t, soft.Config{Name: "y", Fabric: fab, Schedule: sched})
	var nx, ny []uint32
	for range 16 {
		nx = append(nx, x.qp(x.cq(4), nil).Num())
		ny = append(ny, y.qp(y.cq(4), nil).Num())
	}
	common := 0
	for _, n := range nx {
		if slices.Contains(ny, n) {
			common++
		}
	}
	if common == 0 || nx[0] == ny[0] {
		t.Errorf("QP numbers %v and %v: want overlapping numbers from different starts", nx, ny)
	}
}

// Outstanding counts the WRs whose completions are still to come: with
// deferred flushes it reaches 0 only when the last one was generated.
func TestOutstanding(t *testing.T) {
	for seed := uint64(0); seed <= 8; seed++ {
		a, cq := recvsPosted(t, seed, 4)
		if n := a.Outstanding(); n != 4 {
			t.Fatalf("seed %d: %d outstanding, want 4 receives", seed, n)
		}
		toState(t, a, ibv.QPSErr)
		got := 0
		wcs := make([]ibv.WC, 1)
		for a.Outstanding() > 0 {
			n, err := cq.Poll(wcs)
			if err != nil || n == 0 {
				t.Fatalf("seed %d: %d outstanding, poll gave %d (%v)", seed, a.Outstanding(), n, err)
			}
			got += n
		}
		if got += len(pollAll(t, cq)); got != 4 {
			t.Fatalf("seed %d: %d flushes once nothing was outstanding, want 4", seed, got)
		}
	}
}

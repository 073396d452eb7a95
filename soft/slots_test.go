package soft_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/soft"
)

// forSchedules runs f on the orderly schedule and a few adversarial ones.
func forSchedules(t *testing.T, f func(t *testing.T, sched soft.Schedule)) {
	for _, seed := range []uint64{0, 1, 2, 3} {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { f(t, soft.Schedule{Seed: seed}) })
	}
}

// slotRig is a connected pair whose a has a send queue and b a receive
// queue of depth 2, each on its own CQ.
type slotRig struct {
	a, b     ibv.QP
	cqa, cqb ibv.CQ
	mr       ibv.MR
}

func slotPair(t *testing.T, sched soft.Schedule) *slotRig {
	t.Helper()
	e := newEnv(t, soft.Config{Schedule: sched})
	r := &slotRig{cqa: e.cq(16), cqb: e.cq(16), mr: e.mr(4096, ibv.AccessLocalWrite)}
	small := ibv.QPCap{MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}
	mk := func(cq ibv.CQ) ibv.QP {
		q, err := e.pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: ibv.QPTRC, Cap: small})
		if err != nil {
			t.Fatal(err)
		}
		e.closeLater(q)
		return q
	}
	r.a, r.b = mk(r.cqa), mk(r.cqb)
	connect(t, r.a, r.b, 1)
	return r
}

// write posts a zero-length RDMA WRITE on a.
func (r *slotRig) write(id uint64, flags ibv.SendFlags) error {
	return r.a.PostSend([]ibv.SendWR{{ID: id, Opcode: ibv.WRRDMAWrite, Flags: flags, SGL: sge(r.mr, 0, 0)}})
}

// recv posts a receive on b.
func (r *slotRig) recv(id uint64) error {
	return r.b.PostRecv([]ibv.RecvWR{{ID: id, SGL: sge(r.mr, 0, 64)}})
}

func wantFull(t *testing.T, err error, what string) {
	t.Helper()
	if !errors.Is(err, ibv.ErrQueueFull) {
		t.Fatalf("%s: %v, want ErrQueueFull", what, err)
	}
}

// An unsignaled send keeps its slot until a later signaled send of the
// same queue completes and that completion is polled.
func TestSendSlotFreesWhenPolled(t *testing.T) {
	forSchedules(t, func(t *testing.T, sched soft.Schedule) {
		r := slotPair(t, sched)
		if err := r.write(1, 0); err != nil {
			t.Fatal(err)
		}
		if err := r.write(2, 0); err != nil {
			t.Fatal(err)
		}
		// Both executed and completed silently; their slots stay taken.
		wantFull(t, r.write(3, ibv.SendSignaled), "a third send on a depth of 2 with nothing polled")
		if got := pollAll(t, r.cqa); len(got) != 0 {
			t.Fatalf("unsignaled sends completed with %v", got)
		}
		wantFull(t, r.write(3, ibv.SendSignaled), "a third send after an empty poll")
	})
}

// A signaled completion, once polled, frees its slot and the slots of the
// unsignaled sends before it.
func TestSignaledPollFreesEarlierSlots(t *testing.T) {
	forSchedules(t, func(t *testing.T, sched soft.Schedule) {
		r := slotPair(t, sched)
		if err := r.write(1, 0); err != nil {
			t.Fatal(err)
		}
		if err := r.write(2, ibv.SendSignaled); err != nil {
			t.Fatal(err)
		}
		wantFull(t, r.write(3, 0), "a send before the signaled completion is polled")
		if got := pollAll(t, r.cqa); len(got) != 1 || got[0].ID != 2 {
			t.Fatalf("polled %v, want the completion of WR 2", got)
		}
		for id := uint64(3); id <= 4; id++ {
			if err := r.write(id, ibv.SendSignaled); err != nil {
				t.Fatalf("send %d after the poll freed both slots: %v", id, err)
			}
		}
		wantFull(t, r.write(5, 0), "a fifth send")
	})
}

// A receive keeps its slot until its completion is polled, also a flushed
// one.
func TestRecvSlotFreesWhenPolled(t *testing.T) {
	forSchedules(t, func(t *testing.T, sched soft.Schedule) {
		r := slotPair(t, sched)
		for id := uint64(1); id <= 2; id++ {
			if err := r.recv(id); err != nil {
				t.Fatal(err)
			}
		}
		// Both are consumed by messages; their completions are not polled.
		for id := uint64(1); id <= 2; id++ {
			post(t, r.a, ibv.SendWR{ID: 10 + id, Opcode: ibv.WRSend, SGL: sge(r.mr, 64, 8)})
		}
		wantFull(t, r.recv(3), "a third receive with two completions unpolled")
		toState(t, r.b, ibv.QPSErr)
		wantFull(t, r.recv(3), "a receive posted in ERROR with the queue full")
		got := devPoll(t, r.cqb, 2)
		if got[0].ID != 1 || got[1].ID != 2 {
			t.Fatalf("polled %v, want receives 1 and 2", got)
		}
		if err := r.recv(3); err != nil {
			t.Fatalf("a receive after both completions were polled: %v", err)
		}
		if got := devPoll(t, r.cqb, 1); got[0].ID != 3 || got[0].Status != ibv.WCWRFlushErr {
			t.Fatalf("polled %v, want receive 3 flushed", got)
		}
	})
}

// devPoll polls cq until it has n completions; the adversarial schedule
// may spread them over several polls.
func devPoll(t *testing.T, cq ibv.CQ, n int) []ibv.WC {
	t.Helper()
	var got []ibv.WC
	wcs := make([]ibv.WC, n)
	for polls := 0; len(got) < n; polls++ {
		if polls > 1000 {
			t.Fatalf("polled %v after 1000 polls, want %d completions", got, n)
		}
		k, err := cq.Poll(wcs[:n-len(got)])
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, wcs[:k]...)
	}
	return got
}

// Moving a QP to RESET discards its completions still in its CQs, and
// only its own.
func TestResetDiscardsCompletions(t *testing.T) {
	forSchedules(t, func(t *testing.T, sched soft.Schedule) {
		e := newEnv(t, soft.Config{Schedule: sched})
		cq := e.cq(16)
		mr := e.mr(4096, ibv.AccessLocalWrite)
		a, b := e.qp(cq, nil), e.qp(cq, nil)
		connect(t, a, b, 1)
		post(t, a, ibv.SendWR{ID: 1, Opcode: ibv.WRRDMAWrite, Flags: ibv.SendSignaled, SGL: sge(mr, 0, 0)})
		post(t, b, ibv.SendWR{ID: 2, Opcode: ibv.WRRDMAWrite, Flags: ibv.SendSignaled, SGL: sge(mr, 0, 0)})
		post(t, a, ibv.SendWR{ID: 3, Opcode: ibv.WRRDMAWrite, Flags: ibv.SendSignaled, SGL: sge(mr, 0, 0)})
		toState(t, a, ibv.QPSReset)
		got := pollAll(t, cq)
		if len(got) != 1 || got[0].ID != 2 || got[0].QPNum != b.Num() {
			t.Fatalf("after RESET of QP %d polled %v, want only WR 2 of QP %d", a.Num(), got, b.Num())
		}
	})
}

// An SRQ WQE keeps its slot until its completion is polled, not only until
// a QP takes it; WQEs a QP took and dropped at RESET give their slots back.
func TestSRQSlotFreesWhenPolled(t *testing.T) {
	forSchedules(t, func(t *testing.T, sched soft.Schedule) {
		e := newEnv(t, soft.Config{Schedule: sched, SRQPrefetch: 1})
		cq := e.cq(16)
		srq := e.srq(2, 0)
		mr := e.mr(4096, ibv.AccessLocalWrite)
		recv := func(id uint64) error { return srq.PostRecv([]ibv.RecvWR{{ID: id, SGL: sge(mr, 0, 64)}}) }
		a, b := e.qp(e.cq(16), nil), e.qp(cq, srq)
		connect(t, a, b, 1)
		for id := uint64(1); id <= 2; id++ {
			if err := recv(id); err != nil {
				t.Fatal(err)
			}
		}
		post(t, a, ibv.SendWR{ID: 10, Opcode: ibv.WRSend, SGL: sge(mr, 64, 8)})
		// WQE 1 is consumed, WQE 2 taken ahead by b: neither slot is free.
		wantFull(t, recv(3), "a third receive on an SRQ of 2 with a completion unpolled")
		if got := devPoll(t, cq, 1); got[0].ID != 1 {
			t.Fatalf("polled %v, want receive 1", got)
		}
		if err := recv(3); err != nil {
			t.Fatalf("a receive after the completion was polled: %v", err)
		}
		wantFull(t, recv(4), "a fourth receive")
		toState(t, b, ibv.QPSReset) // drops WQE 2, which b had taken
		if err := recv(4); err != nil {
			t.Fatalf("a receive after RESET dropped the WQE b took: %v", err)
		}
	})
}

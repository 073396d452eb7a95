package soft_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/soft"
)

// topologies returns the two environments of each way two QPs can meet.
func topologies(t *testing.T) map[string][2]*env {
	one := newEnv(t, soft.Config{Name: "same"})
	fab := soft.NewFabric()
	x := newEnv(t, soft.Config{Name: "x", Fabric: fab})
	y := newEnv(t, soft.Config{Name: "y", Fabric: fab})
	return map[string][2]*env{"one device": {one, one}, "two devices": {x, y}}
}

func TestSendRecv(t *testing.T) {
	for name, envs := range topologies(t) {
		t.Run(name, func(t *testing.T) {
			p := newPair(t, envs[0], envs[1])
			copy(p.ma.Buf(), "hello, soft world")
			postRecv(t, p.b, ibv.RecvWR{ID: 7, SGL: append(sge(p.mb, 100, 5), sge(p.mb, 200, 100)...)})
			post(t, p.a, ibv.SendWR{ID: 1, Opcode: ibv.WRSendWithImm, Flags: ibv.SendSignaled, SGL: sge(p.ma, 0, 17), ImmData: 0xbeef})
			wantWCs(t, p.cqa, ibv.WC{ID: 1, Opcode: ibv.WCSend, ByteLen: 17, QPNum: p.a.Num()})
			wantWCs(t, p.cqb, ibv.WC{ID: 7, Opcode: ibv.WCRecv, ByteLen: 17, ImmData: 0xbeef, Flags: ibv.WCFlagWithImm,
				QPNum: p.b.Num(), SrcQP: p.a.Num(), SLID: envs[0].dev.LID()})
			if got := string(p.mb.Buf()[100:105]) + string(p.mb.Buf()[200:212]); got != "hello, soft world" {
				t.Errorf("received %q", got)
			}
		})
	}
}

func TestConnectByGID(t *testing.T) {
	fab := soft.NewFabric()
	x := newEnv(t, soft.Config{Name: "x", Fabric: fab})
	y := newEnv(t, soft.Config{Name: "y", Fabric: fab})
	cx, cy := x.cq(8), y.cq(8)
	a, b := x.qp(cx, nil), y.qp(cy, nil)
	for _, s := range []struct {
		q    *soft.QP
		to   *env
		peer *soft.QP
	}{{a, y, b}, {b, x, a}} {
		if err := s.q.ToRTS(0, s.peer.Num(), 1); err != nil { // LID 0 routes nowhere...
			t.Fatal(err)
		}
		// ... so route by GID instead, in RTS->SQD->SQD with AV.
		toState(t, s.q, ibv.QPSSQD)
		ah := ibv.AHAttr{IsGlobal: true, GRH: ibv.GlobalRoute{DGID: s.to.dev.GID()}, PortNum: 1}
		if err := s.q.Modify(ibv.QPAttr{State: ibv.QPSSQD, AH: ah}, ibv.QPAttrState|ibv.QPAttrAV); err != nil {
			t.Fatal(err)
		}
		toState(t, s.q, ibv.QPSRTS)
	}
	postRecv(t, b, ibv.RecvWR{ID: 2})
	post(t, a, ibv.SendWR{ID: 1, Opcode: ibv.WRSend, Flags: ibv.SendSignaled})
	wantWCs(t, cx, ibv.WC{ID: 1, Opcode: ibv.WCSend, QPNum: a.Num()})
	wantWCs(t, cy, ibv.WC{ID: 2, Opcode: ibv.WCRecv, QPNum: b.Num(), SrcQP: a.Num(), SLID: x.dev.LID()})
}

func TestRDMAAndAtomics(t *testing.T) {
	for name, envs := range topologies(t) {
		t.Run(name, func(t *testing.T) {
			p := newPair(t, envs[0], envs[1])
			la, rb := p.ma.Buf(), p.mb.Buf()
			copy(la, "written")
			post(t, p.a, ibv.SendWR{ID: 1, Opcode: ibv.WRRDMAWrite, Flags: ibv.SendSignaled, SGL: sge(p.ma, 0, 7),
				RemoteAddr: p.mb.Addr() + 64, RKey: p.mb.RKey()})
			if string(rb[64:71]) != "written" {
				t.Fatalf("RDMA WRITE left %q", rb[64:71])
			}
			postRecv(t, p.b, ibv.RecvWR{ID: 9})
			post(t, p.a, ibv.SendWR{ID: 2, Opcode: ibv.WRRDMAWriteWithImm, Flags: ibv.SendSignaled, SGL: sge(p.ma, 0, 3),
				RemoteAddr: p.mb.Addr() + 128, RKey: p.mb.RKey(), ImmData: 5})
			copy(rb[300:], "remote!")
			post(t, p.a, ibv.SendWR{ID: 3, Opcode: ibv.WRRDMARead, Flags: ibv.SendSignaled, SGL: sge(p.ma, 1000, 7),
				RemoteAddr: p.mb.Addr() + 300, RKey: p.mb.RKey()})
			if string(la[1000:1007]) != "remote!" {
				t.Fatalf("RDMA READ got %q", la[1000:1007])
			}
			binary.NativeEndian.PutUint64(rb[512:], 40)
			atom := func(id uint64, op ibv.WROpcode, cmpAdd, swap uint64) {
				post(t, p.a, ibv.SendWR{ID: id, Opcode: op, Flags: ibv.SendSignaled, SGL: sge(p.ma, 2048, 8),
					RemoteAddr: p.mb.Addr() + 512, RKey: p.mb.RKey(), CompareAdd: cmpAdd, Swap: swap})
			}
			atom(4, ibv.WRAtomicFetchAndAdd, 2, 0) // 40 -> 42, returns 40
			if got := binary.NativeEndian.Uint64(la[2048:]); got != 40 {
				t.Errorf("FETCH_ADD returned %d, want 40", got)
			}
			atom(5, ibv.WRAtomicCmpAndSwp, 7, 99) // no match: stays 42
			atom(6, ibv.WRAtomicCmpAndSwp, 42, 99)
			if got := binary.NativeEndian.Uint64(rb[512:]); got != 99 {
				t.Errorf("remote word = %d, want 99", got)
			}
			if got := binary.NativeEndian.Uint64(la[2048:]); got != 42 {
				t.Errorf("CMP_AND_SWP returned %d, want 42", got)
			}
			qa := p.a.Num()
			wantWCs(t, p.cqa,
				ibv.WC{ID: 1, Opcode: ibv.WCRDMAWrite, ByteLen: 7, QPNum: qa},
				ibv.WC{ID: 2, Opcode: ibv.WCRDMAWrite, ByteLen: 3, QPNum: qa},
				ibv.WC{ID: 3, Opcode: ibv.WCRDMARead, ByteLen: 7, QPNum: qa},
				ibv.WC{ID: 4, Opcode: ibv.WCFetchAdd, ByteLen: 8, QPNum: qa},
				ibv.WC{ID: 5, Opcode: ibv.WCCompSwap, ByteLen: 8, QPNum: qa},
				ibv.WC{ID: 6, Opcode: ibv.WCCompSwap, ByteLen: 8, QPNum: qa})
			wantWCs(t, p.cqb, ibv.WC{ID: 9, Opcode: ibv.WCRecvRDMAWithImm, ByteLen: 3, ImmData: 5, Flags: ibv.WCFlagWithImm,
				QPNum: p.b.Num(), SrcQP: qa, SLID: envs[0].dev.LID()})
		})
	}
}

func TestSignaling(t *testing.T) {
	e := newEnv(t, soft.Config{})
	p := newPair(t, e, e)
	postRecv(t, p.b, ibv.RecvWR{ID: 1}, ibv.RecvWR{ID: 2}, ibv.RecvWR{ID: 3})
	post(t, p.a, ibv.SendWR{ID: 10, Opcode: ibv.WRSend}, ibv.SendWR{ID: 11, Opcode: ibv.WRSend, Flags: ibv.SendSignaled})
	wantWCs(t, p.cqa, ibv.WC{ID: 11, Opcode: ibv.WCSend, QPNum: p.a.Num()})

	// With SigAll every WR completes.
	cq := e.cq(8)
	all, err := e.pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: ibv.QPTRC, SigAll: true, Cap: ibv.QPCap{MaxSendWR: 4, MaxRecvWR: 4}})
	if err != nil {
		t.Fatal(err)
	}
	e.closeLater(all)
	peer := e.qp(e.cq(8), nil)
	connect(t, all, peer, 1)
	postRecv(t, peer, ibv.RecvWR{ID: 1})
	post(t, all, ibv.SendWR{ID: 20, Opcode: ibv.WRSend})
	wantWCs(t, cq, ibv.WC{ID: 20, Opcode: ibv.WCSend, QPNum: all.Num()})
}

func TestCompletionOrder(t *testing.T) {
	e := newEnv(t, soft.Config{})
	p := newPair(t, e, e)
	var recvs []ibv.RecvWR
	var sends []ibv.SendWR
	var wantA, wantB []ibv.WC
	for i := uint64(0); i < 50; i++ {
		recvs = append(recvs, ibv.RecvWR{ID: 1000 + i, SGL: sge(p.mb, int(i), 1)})
		sends = append(sends, ibv.SendWR{ID: i, Opcode: ibv.WRSend, Flags: ibv.SendSignaled, SGL: sge(p.ma, int(i), 1)})
		wantA = append(wantA, ibv.WC{ID: i, Opcode: ibv.WCSend, ByteLen: 1, QPNum: p.a.Num()})
		wantB = append(wantB, ibv.WC{ID: 1000 + i, Opcode: ibv.WCRecv, ByteLen: 1, QPNum: p.b.Num(), SrcQP: p.a.Num(), SLID: e.dev.LID()})
		p.ma.Buf()[i] = byte(i)
	}
	postRecv(t, p.b, recvs...)
	post(t, p.a, sends...)
	wantWCs(t, p.cqa, wantA...)
	wantWCs(t, p.cqb, wantB...)
	if !bytes.Equal(p.mb.Buf()[:50], p.ma.Buf()[:50]) {
		t.Error("payloads arrived out of order")
	}
}

func TestRNR(t *testing.T) {
	e := newEnv(t, soft.Config{})
	p := newPair(t, e, e) // rnr_retry 7: wait forever
	post(t, p.a, ibv.SendWR{ID: 1, Opcode: ibv.WRSend, Flags: ibv.SendSignaled},
		ibv.SendWR{ID: 2, Opcode: ibv.WRSend, Flags: ibv.SendSignaled})
	wantWCs(t, p.cqa) // both wait for receives
	postRecv(t, p.b, ibv.RecvWR{ID: 8})
	wantWCs(t, p.cqa, ibv.WC{ID: 1, Opcode: ibv.WCSend, QPNum: p.a.Num()})
	postRecv(t, p.b, ibv.RecvWR{ID: 9})
	wantWCs(t, p.cqa, ibv.WC{ID: 2, Opcode: ibv.WCSend, QPNum: p.a.Num()})

	// A finite rnr_retry: retried after the responder's min_rnr_timer
	// (12: 0.64 ms), rnr_retry times (timing: TestRNRRetryTiming).
	if err := p.a.Modify(ibv.QPAttr{State: ibv.QPSSQD}, ibv.QPAttrState); err != nil {
		t.Fatal(err)
	}
	if err := p.a.Modify(ibv.QPAttr{State: ibv.QPSSQD, RNRRetry: 3}, ibv.QPAttrState|ibv.QPAttrRNRRetry); err != nil {
		t.Fatal(err)
	}
	toState(t, p.a, ibv.QPSRTS)
	pollAll(t, p.cqb)
	post(t, p.a, ibv.SendWR{ID: 3, Opcode: ibv.WRSend})
	if err := e.dev.Fabric().Advance(3 * 640 * time.Microsecond); err != nil {
		t.Fatal(err)
	}
	wantWCs(t, p.cqa, ibv.WC{ID: 3, Status: ibv.WCRNRRetryExcErr, QPNum: p.a.Num()})
	if s := state(t, p.a); s != ibv.QPSErr {
		t.Errorf("requester after RNR retries exhausted: %s, want ERR", s)
	}
	if s := state(t, p.b); s != ibv.QPSRTS {
		t.Errorf("responder: %s, want RTS", s)
	}
}

// waitOnClock polls cq, advancing the fabric's clock by step between polls,
// until it has a completion, and checks that it came exactly when the
// clock reached deadline: never before, never after. The clock moves only
// by those steps: a jump, when the test was slow between two polls, would
// fire the timer early.
func waitOnClock(t *testing.T, fab *soft.Fabric, cq ibv.CQ, deadline time.Time, step time.Duration) []ibv.WC {
	t.Helper()
	fab.SetClockJumps(false)
	defer fab.SetClockJumps(true)
	for {
		got := pollAll(t, cq)
		now := fab.Now()
		switch {
		case len(got) > 0 && now.Before(deadline):
			t.Fatalf("completions %v at device time %v, before %v", got, now, deadline)
		case len(got) > 0:
			return got
		case !now.Before(deadline):
			t.Fatalf("no completion at device time %v, due at %v", now, deadline)
		}
		if err := fab.Advance(step); err != nil {
			t.Fatal(err)
		}
	}
}

// An RNR NAK is retried rnr_retry times, each after the responder's
// min_rnr_timer: a receive posted before the retries run out lets the
// message through, and without one the last NAK fails the WR.
func TestRNRRetryTiming(t *testing.T) {
	const timer, retries = 640 * time.Microsecond, 3 // min_rnr_timer 12
	for _, recvAt := range []time.Duration{0, 1000 * time.Microsecond, -1} {
		t.Run(fmt.Sprintf("receive at %v", recvAt), func(t *testing.T) {
			fab := soft.NewFabric()
			e := newEnv(t, soft.Config{Fabric: fab})
			p := newPair(t, e, e)
			if err := p.a.Modify(ibv.QPAttr{State: ibv.QPSSQD}, ibv.QPAttrState); err != nil {
				t.Fatal(err)
			}
			if err := p.a.Modify(ibv.QPAttr{State: ibv.QPSSQD, RNRRetry: retries}, ibv.QPAttrState|ibv.QPAttrRNRRetry); err != nil {
				t.Fatal(err)
			}
			toState(t, p.a, ibv.QPSRTS)
			start := fab.Now()
			post(t, p.a, ibv.SendWR{ID: 1, Opcode: ibv.WRSend, Flags: ibv.SendSignaled})
			if recvAt < 0 {
				got := waitOnClock(t, fab, p.cqa, start.Add(retries*timer), 100*time.Microsecond)
				if len(got) != 1 || got[0].Status != ibv.WCRNRRetryExcErr {
					t.Fatalf("%v, want RNR_RETRY_EXC_ERR", got)
				}
				return
			}
			if err := fab.Advance(recvAt); err != nil {
				t.Fatal(err)
			}
			postRecv(t, p.b, ibv.RecvWR{ID: 2})
			// The message goes through at the next retry, not before.
			next := start.Add((recvAt/timer + 1) * timer)
			got := waitOnClock(t, fab, p.cqa, next, 100*time.Microsecond)
			if len(got) != 1 || got[0].Status != ibv.WCSuccess {
				t.Fatalf("%v, want the send to succeed", got)
			}
		})
	}
}

// A request nobody answers fails with RETRY_EXC_ERR once the local ACK
// timeout (timeout 14: 4.096 µs * 2^14) ran out for each of the 1 +
// retry_cnt (7) attempts, on the fabric's clock.
func TestUnreachablePeer(t *testing.T) {
	for name, prepare := range map[string]func(a, b *soft.QP){
		"peer in ERR":   func(a, b *soft.QP) { toState(t, b, ibv.QPSErr) },
		"peer closed":   func(a, b *soft.QP) { b.Close() },
		"peer in RESET": func(a, b *soft.QP) { toState(t, b, ibv.QPSReset) },
	} {
		t.Run(name, func(t *testing.T) {
			fab := soft.NewFabric()
			e := newEnv(t, soft.Config{Fabric: fab})
			p := newPair(t, e, e)
			prepare(p.a, p.b)
			start := fab.Now()
			post(t, p.a, ibv.SendWR{ID: 1, Opcode: ibv.WRRDMAWrite}, ibv.SendWR{ID: 2, Opcode: ibv.WRSend})
			got := waitOnClock(t, fab, p.cqa, start.Add(8*4096*(1<<14)), 10*time.Millisecond)
			want := []ibv.WC{{ID: 1, Status: ibv.WCRetryExcErr, QPNum: p.a.Num()}, flushed(2, p.a.Num())}
			if !slices.Equal(got, want) {
				t.Fatalf("%v, want %v", got, want)
			}
			wantEvents(t, e.dev) // a requester error raises no event
		})
	}
}

// Without explicit Advance, a caller waiting for the completion is never
// stranded: once only waiting calls happen, the virtual clock jumps to the
// next timer.
func TestClockJumpsWhenCallersWait(t *testing.T) {
	e := newEnv(t, soft.Config{})
	p := newPair(t, e, e)
	toState(t, p.b, ibv.QPSErr)
	start := e.dev.Fabric().Now()
	post(t, p.a, ibv.SendWR{ID: 1, Opcode: ibv.WRRDMAWrite})
	deadline := time.Now().Add(5 * time.Second)
	for {
		if got := pollAll(t, p.cqa); len(got) > 0 {
			if got[0].Status != ibv.WCRetryExcErr {
				t.Fatalf("%v, want RETRY_EXC_ERR", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no completion within 5 s: the clock never jumped")
		}
		time.Sleep(100 * time.Microsecond)
	}
	if d := e.dev.Fabric().Now().Sub(start); d < 8*4096*(1<<14) {
		t.Errorf("device time %v at the completion, want at least 8 ACK timeouts", d)
	}
}

// With its jumps off, the clock moves only by Advance: callers that wait
// for longer than the quiescence period see no timer fire, and Advance
// fires it when due.
func TestClockJumpsOff(t *testing.T) {
	e := newEnv(t, soft.Config{})
	fab := e.dev.Fabric()
	fab.SetClockJumps(false)
	p := newPair(t, e, e)
	toState(t, p.b, ibv.QPSErr)
	start := fab.Now()
	post(t, p.a, ibv.SendWR{ID: 1, Opcode: ibv.WRRDMAWrite})
	for range 5 {
		time.Sleep(2 * time.Millisecond)
		if got := pollAll(t, p.cqa); len(got) > 0 {
			t.Fatalf("%v after %v of device time, want none before Advance", got, fab.Now().Sub(start))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	if ev, err := e.dev.NextAsyncEvent(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("NextAsyncEvent: %v, %v; want the context's deadline", ev, err)
	}
	if now := fab.Now(); !now.Equal(start) {
		t.Fatalf("device time moved by %v with its jumps off", now.Sub(start))
	}
	got := waitOnClock(t, fab, p.cqa, start.Add(8*4096*(1<<14)), 10*time.Millisecond)
	if len(got) != 1 || got[0].Status != ibv.WCRetryExcErr {
		t.Fatalf("%v, want RETRY_EXC_ERR", got)
	}
}

// On a real-time fabric the retry timers run on the wall clock.
func TestRealTimeClock(t *testing.T) {
	fab := soft.NewFabric()
	fab.SetRealTime(true)
	e := newEnv(t, soft.Config{Fabric: fab})
	p := newPair(t, e, e)
	// timeout 10: 4.2 ms per attempt; retry_cnt 7: 33.6 ms in all.
	toState(t, p.a, ibv.QPSSQD)
	if err := p.a.Modify(ibv.QPAttr{State: ibv.QPSSQD, Timeout: 10}, ibv.QPAttrState|ibv.QPAttrTimeout); err != nil {
		t.Fatal(err)
	}
	toState(t, p.a, ibv.QPSRTS)
	toState(t, p.b, ibv.QPSErr)
	if err := fab.Advance(time.Second); err == nil {
		t.Error("Advance on a real-time fabric succeeded")
	}
	start := time.Now()
	post(t, p.a, ibv.SendWR{ID: 1, Opcode: ibv.WRRDMAWrite})
	for {
		if got := pollAll(t, p.cqa); len(got) > 0 {
			if got[0].Status != ibv.WCRetryExcErr {
				t.Fatalf("%v, want RETRY_EXC_ERR", got)
			}
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatal("no completion within 5 s of real time")
		}
		time.Sleep(time.Millisecond)
	}
	if el := time.Since(start); el < 8*4096*(1<<10) {
		t.Errorf("RETRY_EXC_ERR after %v of real time, want at least 8 ACK timeouts (33.6 ms)", el)
	}
}

package soft_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/soft"
)

const (
	toInit = ibv.QPAttrState | ibv.QPAttrPKeyIndex | ibv.QPAttrPort | ibv.QPAttrAccessFlags
	toRTR  = ibv.QPAttrState | ibv.QPAttrAV | ibv.QPAttrPathMTU | ibv.QPAttrDestQPN | ibv.QPAttrRQPSN |
		ibv.QPAttrMaxDestRdAtomic | ibv.QPAttrMinRNRTimer
	toRTS = ibv.QPAttrState | ibv.QPAttrTimeout | ibv.QPAttrRetryCnt | ibv.QPAttrRNRRetry | ibv.QPAttrSQPSN |
		ibv.QPAttrMaxQPRdAtomic
)

// reach brings q from RESET to s along the usual path.
func reach(t *testing.T, q ibv.QP, s ibv.QPState) {
	t.Helper()
	path := []struct {
		st   ibv.QPState
		mask ibv.QPAttrMask
	}{{ibv.QPSInit, toInit}, {ibv.QPSRTR, toRTR}, {ibv.QPSRTS, toRTS}, {ibv.QPSSQD, ibv.QPAttrState}}
	if s == ibv.QPSErr {
		toState(t, q, ibv.QPSErr)
		return
	}
	for _, p := range path {
		if s == ibv.QPSReset {
			return
		}
		if err := q.Modify(ibv.QPAttr{State: p.st, PortNum: 1, PathMTU: ibv.MTU1024}, p.mask); err != nil {
			t.Fatalf("Modify to %s: %v", p.st, err)
		}
		if p.st == s {
			return
		}
	}
}

func TestStateMachine(t *testing.T) {
	e := newEnv(t, soft.Config{})
	cq := e.cq(64)
	tests := []struct {
		from ibv.QPState
		to   ibv.QPState
		mask ibv.QPAttrMask
		ok   bool
	}{
		{ibv.QPSReset, ibv.QPSInit, toInit, true},
		{ibv.QPSReset, ibv.QPSInit, toInit &^ ibv.QPAttrPort, false},            // missing required
		{ibv.QPSReset, ibv.QPSInit, toInit | ibv.QPAttrPathMTU, false},          // not allowed
		{ibv.QPSReset, ibv.QPSRTR, toRTR, false},                                // skips INIT
		{ibv.QPSReset, ibv.QPSRTS, toRTS, false},                                // skips INIT and RTR
		{ibv.QPSReset, ibv.QPSErr, ibv.QPAttrState, true},                       // any -> ERR
		{ibv.QPSReset, ibv.QPSReset, ibv.QPAttrState, true},                     // RESET -> RESET
		{ibv.QPSInit, ibv.QPSInit, toInit, true},                                // optional attributes
		{ibv.QPSInit, ibv.QPSRTR, toRTR, true},                                  //
		{ibv.QPSInit, ibv.QPSRTR, toRTR &^ ibv.QPAttrMinRNRTimer, false},        // missing required
		{ibv.QPSInit, ibv.QPSRTR, toRTR | ibv.QPAttrAccessFlags, true},          // optional
		{ibv.QPSInit, ibv.QPSRTS, toRTS, false},                                 //
		{ibv.QPSInit, ibv.QPSSQD, ibv.QPAttrState, false},                       //
		{ibv.QPSRTR, ibv.QPSRTS, toRTS, true},                                   //
		{ibv.QPSRTR, ibv.QPSRTS, toRTS &^ ibv.QPAttrSQPSN, false},               // missing required
		{ibv.QPSRTR, ibv.QPSRTS, toRTS | ibv.QPAttrCurState, true},              // CUR_STATE allowed in RTR
		{ibv.QPSRTR, ibv.QPSRTR, ibv.QPAttrState, false},                        //
		{ibv.QPSRTR, ibv.QPSInit, toInit, false},                                // no way back
		{ibv.QPSRTS, ibv.QPSSQD, ibv.QPAttrState, true},                         //
		{ibv.QPSRTS, ibv.QPSRTS, ibv.QPAttrState | ibv.QPAttrMinRNRTimer, true}, //
		{ibv.QPSRTS, ibv.QPSRTS, ibv.QPAttrState | ibv.QPAttrPathMTU, false},    //
		{ibv.QPSRTS, ibv.QPSRTR, toRTR, false},                                  //
		{ibv.QPSRTS, ibv.QPSSQE, ibv.QPAttrState, false},                        // only hardware enters SQE
		{ibv.QPSSQD, ibv.QPSRTS, ibv.QPAttrState, true},                         //
		{ibv.QPSSQD, ibv.QPSSQD, ibv.QPAttrState | ibv.QPAttrTimeout, true},     //
		{ibv.QPSSQD, ibv.QPSInit, toInit, false},                                //
		{ibv.QPSErr, ibv.QPSReset, ibv.QPAttrState, true},                       //
		{ibv.QPSErr, ibv.QPSErr, ibv.QPAttrState, true},                         //
		{ibv.QPSErr, ibv.QPSRTS, toRTS, false},                                  //
		{ibv.QPSErr, ibv.QPSRTS, ibv.QPAttrState, false},                        // ERR leaves only to RESET
		{ibv.QPSErr, ibv.QPSRTR, ibv.QPAttrState, false},                        //
		{ibv.QPSErr, ibv.QPSSQD, ibv.QPAttrState, false},                        //
		{ibv.QPSErr, ibv.QPSInit, toInit, false},                                //
		{ibv.QPSRTS, ibv.QPSErr, ibv.QPAttrState | ibv.QPAttrTimeout, false},    // ERR takes STATE only
		{ibv.QPSRTS, ibv.QPSReset, ibv.QPAttrState | ibv.QPAttrPort, false},     // RESET too
	}
	for _, tt := range tests {
		q := e.qp(cq, nil)
		reach(t, q, tt.from)
		before, _, _ := q.Query(0)
		err := q.Modify(ibv.QPAttr{State: tt.to, PortNum: 1, PathMTU: ibv.MTU1024, CurState: tt.from}, tt.mask)
		if tt.ok {
			if err != nil {
				t.Errorf("%s -> %s with %s: %v", tt.from, tt.to, tt.mask, err)
			} else if s := state(t, q); s != tt.to {
				t.Errorf("%s -> %s: QP is in %s", tt.from, tt.to, s)
			}
			continue
		}
		if !errors.Is(err, ibv.ErrInvalidArgument) {
			t.Errorf("%s -> %s with %s: err %v, want ErrInvalidArgument", tt.from, tt.to, tt.mask, err)
		}
		if after, _, _ := q.Query(0); after != before {
			t.Errorf("%s -> %s failed but changed the QP: %+v -> %+v", tt.from, tt.to, before, after)
		}
	}
}

func TestModifyValues(t *testing.T) {
	e := newEnv(t, soft.Config{Limits: soft.Limits{MaxQPRdAtom: 4}})
	q := e.qp(e.cq(4), nil)
	for _, tt := range []struct {
		name string
		attr ibv.QPAttr
		mask ibv.QPAttrMask
	}{
		{"port 2", ibv.QPAttr{State: ibv.QPSInit, PortNum: 2}, toInit},
		{"pkey index 1", ibv.QPAttr{State: ibv.QPSInit, PortNum: 1, PKeyIndex: 1}, toInit},
		{"bad access", ibv.QPAttr{State: ibv.QPSInit, PortNum: 1, AccessFlags: ibv.AccessHugeTLB}, toInit},
	} {
		if err := q.Modify(tt.attr, tt.mask); !errors.Is(err, ibv.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", tt.name, err)
		}
	}
	reach(t, q, ibv.QPSInit)
	if err := q.Modify(ibv.QPAttr{State: ibv.QPSRTR, PathMTU: ibv.MTU1024, MaxDestRdAtomic: 5}, toRTR); !errors.Is(err, ibv.ErrInvalidArgument) {
		t.Errorf("max_dest_rd_atomic above the device limit: %v", err)
	}
	if err := q.Modify(ibv.QPAttr{State: ibv.QPSRTR, PathMTU: 9}, toRTR); !errors.Is(err, ibv.ErrInvalidArgument) {
		t.Errorf("path MTU 9: %v", err)
	}
	if s := state(t, q); s != ibv.QPSInit {
		t.Errorf("failed modifies moved the QP to %s", s)
	}
}

func TestPostStates(t *testing.T) {
	e := newEnv(t, soft.Config{})
	cq := e.cq(64)
	for _, s := range []ibv.QPState{ibv.QPSReset, ibv.QPSInit, ibv.QPSRTR} {
		q := e.qp(cq, nil)
		reach(t, q, s)
		err := q.PostSend([]ibv.SendWR{{ID: 1, Opcode: ibv.WRSend}})
		var pe *ibv.PostError
		if !errors.As(err, &pe) || pe.Index != 0 || !errors.Is(err, ibv.ErrInvalidArgument) {
			t.Errorf("PostSend in %s: %v, want PostError at 0 wrapping ErrInvalidArgument", s, err)
		}
		err = q.PostRecv([]ibv.RecvWR{{ID: 1}})
		if (s == ibv.QPSReset) != errors.Is(err, ibv.ErrInvalidArgument) {
			t.Errorf("PostRecv in %s: %v", s, err)
		}
	}
}

func TestResetClearsAndReuse(t *testing.T) {
	e := newEnv(t, soft.Config{})
	p := newPair(t, e, e)
	postRecv(t, p.b, ibv.RecvWR{ID: 1}, ibv.RecvWR{ID: 2})
	toState(t, p.b, ibv.QPSReset)
	wantWCs(t, p.cqb) // RESET drops queues without completions
	if a, _, _ := p.b.Query(0); a.DestQPNum != 0 || a.State != ibv.QPSReset {
		t.Errorf("after RESET: %+v", a)
	}
	// Reuse after ERR -> RESET.
	toState(t, p.a, ibv.QPSErr)
	toState(t, p.a, ibv.QPSReset)
	connect(t, p.a, p.b, 1)
	postRecv(t, p.b, ibv.RecvWR{ID: 3})
	post(t, p.a, ibv.SendWR{ID: 4, Opcode: ibv.WRSend, Flags: ibv.SendSignaled})
	wantWCs(t, p.cqa, ibv.WC{ID: 4, Opcode: ibv.WCSend, QPNum: p.a.Num()})
	wantWCs(t, p.cqb, ibv.WC{ID: 3, Opcode: ibv.WCRecv, QPNum: p.b.Num(), SrcQP: p.a.Num(), SLID: e.dev.LID()})
}

func TestSQD(t *testing.T) {
	e := newEnv(t, soft.Config{})
	p := newPair(t, e, e)
	postRecv(t, p.b, ibv.RecvWR{ID: 1})
	if err := p.a.Modify(ibv.QPAttr{State: ibv.QPSSQD, EnSQDAsyncNotify: true}, ibv.QPAttrState|ibv.QPAttrEnSQDAsyncNotify); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, e.dev, "SQ_DRAINED qpn=17")
	post(t, p.a, ibv.SendWR{ID: 5, Opcode: ibv.WRSend, Flags: ibv.SendSignaled})
	wantWCs(t, p.cqa) // sends wait in SQD
	toState(t, p.a, ibv.QPSRTS)
	wantWCs(t, p.cqa, ibv.WC{ID: 5, Opcode: ibv.WCSend, QPNum: p.a.Num()})
}

// SQ_DRAINED waits for the send in flight when SQD began: a send blocked
// by RNR completes normally once a receive is posted, then the event
// comes, and the sends behind it wait for RTS.
func TestSQDWaitsForSendInFlight(t *testing.T) {
	e := newEnv(t, soft.Config{})
	p := newPair(t, e, e) // rnr_retry 7: the send waits for a receive
	post(t, p.a, ibv.SendWR{ID: 1, Opcode: ibv.WRSend, Flags: ibv.SendSignaled},
		ibv.SendWR{ID: 2, Opcode: ibv.WRSend, Flags: ibv.SendSignaled})
	if err := p.a.Modify(ibv.QPAttr{State: ibv.QPSSQD, EnSQDAsyncNotify: true}, ibv.QPAttrState|ibv.QPAttrEnSQDAsyncNotify); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, e.dev) // WR 1 is in flight
	postRecv(t, p.b, ibv.RecvWR{ID: 8}, ibv.RecvWR{ID: 9})
	wantWCs(t, p.cqa, ibv.WC{ID: 1, Opcode: ibv.WCSend, QPNum: p.a.Num()})
	wantEvents(t, e.dev, fmt.Sprintf("SQ_DRAINED qpn=%d", p.a.Num()))
	wantWCs(t, p.cqa) // WR 2 had not started: it waits in SQD
	toState(t, p.a, ibv.QPSRTS)
	wantWCs(t, p.cqa, ibv.WC{ID: 2, Opcode: ibv.WCSend, QPNum: p.a.Num()})
}

// Quirks.SQDrainedEarly, rxe's SQD: SQ_DRAINED comes at once although a
// send is RNR-waiting, and that send never completes in SQD, receives or
// not; back in RTS both sends go. A send waiting for an ACK with timeout 0
// is never retried, so it still holds SQ_DRAINED back.
func TestSQDrainedEarly(t *testing.T) {
	sqd := func(t *testing.T, q *soft.QP) {
		t.Helper()
		if err := q.Modify(ibv.QPAttr{State: ibv.QPSSQD, EnSQDAsyncNotify: true}, ibv.QPAttrState|ibv.QPAttrEnSQDAsyncNotify); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("rnr", func(t *testing.T) {
		e := newEnv(t, soft.Config{Quirks: soft.Quirks{SQDrainedEarly: true}})
		p := newPair(t, e, e) // rnr_retry 7: the send waits for a receive
		post(t, p.a, ibv.SendWR{ID: 1, Opcode: ibv.WRSend, Flags: ibv.SendSignaled},
			ibv.SendWR{ID: 2, Opcode: ibv.WRSend, Flags: ibv.SendSignaled})
		sqd(t, p.a)
		wantEvents(t, e.dev, fmt.Sprintf("SQ_DRAINED qpn=%d", p.a.Num())) // WR 1 was in flight
		postRecv(t, p.b, ibv.RecvWR{ID: 8}, ibv.RecvWR{ID: 9})
		wantWCs(t, p.cqa) // WR 1 was rewound: it does not start again in SQD
		wantWCs(t, p.cqb)
		toState(t, p.a, ibv.QPSRTS)
		wantWCs(t, p.cqa, ibv.WC{ID: 1, Opcode: ibv.WCSend, QPNum: p.a.Num()}, ibv.WC{ID: 2, Opcode: ibv.WCSend, QPNum: p.a.Num()})
		wantEvents(t, e.dev)
	})
	t.Run("no ACK, timeout 0", func(t *testing.T) {
		e := newEnv(t, soft.Config{Quirks: soft.Quirks{SQDrainedEarly: true}})
		p := newPair(t, e, e)
		toState(t, p.a, ibv.QPSSQD) // SQD -> SQD may change the timeout
		if err := p.a.Modify(ibv.QPAttr{State: ibv.QPSSQD, Timeout: 0}, ibv.QPAttrState|ibv.QPAttrTimeout); err != nil {
			t.Fatal(err)
		}
		toState(t, p.a, ibv.QPSRTS)
		toState(t, p.b, ibv.QPSReset) // nobody answers
		post(t, p.a, ibv.SendWR{ID: 1, Opcode: ibv.WRSend, Flags: ibv.SendSignaled})
		sqd(t, p.a)
		wantEvents(t, e.dev) // WR 1 waits forever: not drained
		wantWCs(t, p.cqa)
	})
}

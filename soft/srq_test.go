package soft_test

import (
	"errors"
	"testing"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/soft"
)

// srqSetup is three QPs sharing one SRQ, each connected to its own peer.
type srqSetup struct {
	e     *env
	srq   ibv.SRQ
	qps   [3]*soft.QP
	cqs   [3]ibv.CQ
	peers [3]*soft.QP
}

func newSRQSetup(t *testing.T, cfg soft.Config, wqes int, limit uint32) *srqSetup {
	e := newEnv(t, cfg)
	s := &srqSetup{e: e, srq: e.srq(64, limit)}
	var wrs []ibv.RecvWR
	for i := 0; i < wqes; i++ {
		wrs = append(wrs, ibv.RecvWR{ID: uint64(100 + i)})
	}
	if err := s.srq.PostRecv(wrs); err != nil {
		t.Fatal(err)
	}
	peerCQ := e.cq(64)
	for i := range s.qps {
		s.cqs[i] = e.cq(64)
		s.qps[i] = e.qp(s.cqs[i], s.srq)
		s.peers[i] = e.qp(peerCQ, nil)
		connect(t, s.qps[i], s.peers[i], 1)
	}
	return s
}

func TestSRQShared(t *testing.T) {
	s := newSRQSetup(t, soft.Config{}, 4, 0)
	send := ibv.SendWR{Opcode: ibv.WRSend}
	post(t, s.peers[0], send)
	post(t, s.peers[1], send)
	post(t, s.peers[0], send)
	wantWCs(t, s.cqs[0],
		ibv.WC{ID: 100, Opcode: ibv.WCRecv, QPNum: s.qps[0].Num(), SrcQP: s.peers[0].Num(), SLID: 1},
		ibv.WC{ID: 102, Opcode: ibv.WCRecv, QPNum: s.qps[0].Num(), SrcQP: s.peers[0].Num(), SLID: 1})
	wantWCs(t, s.cqs[1], ibv.WC{ID: 101, Opcode: ibv.WCRecv, QPNum: s.qps[1].Num(), SrcQP: s.peers[1].Num(), SLID: 1})
	// Without prefetch a QP holds no WQE: ERROR flushes nothing, leaves the
	// SRQ to its siblings, and raises Last WQE Reached once.
	toState(t, s.qps[0], ibv.QPSErr)
	toState(t, s.qps[0], ibv.QPSErr)
	wantWCs(t, s.cqs[0])
	wantEvents(t, s.e.dev, "QP_LAST_WQE_REACHED qpn=17")
	post(t, s.peers[2], send)
	wantWCs(t, s.cqs[2], ibv.WC{ID: 103, Opcode: ibv.WCRecv, QPNum: s.qps[2].Num(), SrcQP: s.peers[2].Num(), SLID: 1})
	// RESET re-arms the event for the next ERROR.
	toState(t, s.qps[0], ibv.QPSReset)
	toState(t, s.qps[0], ibv.QPSErr)
	wantEvents(t, s.e.dev, "QP_LAST_WQE_REACHED qpn=17")
	if err := s.qps[0].PostRecv([]ibv.RecvWR{{ID: 1}}); !errors.Is(err, ibv.ErrInvalidArgument) {
		t.Errorf("PostRecv on an SRQ-attached QP: %v, want ErrInvalidArgument", err)
	}
}

func TestSRQPrefetchFlush(t *testing.T) {
	s := newSRQSetup(t, soft.Config{SRQPrefetch: 2}, 8, 0)
	// QP i took WQEs 100+2i and 101+2i on reaching RTR.
	toState(t, s.qps[0], ibv.QPSErr)
	q0 := s.qps[0].Num()
	wantWCs(t, s.cqs[0], flushed(100, q0), flushed(101, q0))
	wantEvents(t, s.e.dev, "QP_LAST_WQE_REACHED qpn=17")
	// A sibling consumes its own taken WQE, then takes the next from the SRQ.
	post(t, s.peers[1], ibv.SendWR{Opcode: ibv.WRSend})
	wantWCs(t, s.cqs[1], ibv.WC{ID: 102, Opcode: ibv.WCRecv, QPNum: s.qps[1].Num(), SrcQP: s.peers[1].Num(), SLID: 1})
	toState(t, s.qps[1], ibv.QPSErr)
	q1 := s.qps[1].Num()
	wantWCs(t, s.cqs[1], flushed(103, q1), flushed(106, q1))
}

func TestSRQLimit(t *testing.T) {
	s := newSRQSetup(t, soft.Config{}, 4, 3)
	send := ibv.SendWR{Opcode: ibv.WRSend}
	post(t, s.peers[0], send) // 3 left: not below the limit
	wantEvents(t, s.e.dev)
	post(t, s.peers[0], send) // 2 left: below
	wantEvents(t, s.e.dev, "SRQ_LIMIT_REACHED srq")
	post(t, s.peers[0], send) // disarmed
	wantEvents(t, s.e.dev)
	if a, err := s.srq.Query(); err != nil || a.SRQLimit != 0 || a.MaxWR != 64 {
		t.Errorf("Query = %+v, %v; want limit disarmed", a, err)
	}
	if err := s.srq.Modify(ibv.SRQAttr{SRQLimit: 5}, ibv.SRQAttrLimit); err != nil {
		t.Fatal(err)
	}
	post(t, s.peers[1], send)
	wantEvents(t, s.e.dev, "SRQ_LIMIT_REACHED srq")
}

func TestSRQError(t *testing.T) {
	s := newSRQSetup(t, soft.Config{SRQPrefetch: 1}, 8, 0)
	reset := s.e.qp(s.e.cq(4), s.srq) // in RESET: not using the SRQ yet
	if err := s.e.dev.InjectSRQError(s.srq); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, s.e.dev, "SRQ_ERR srq",
		"QP_FATAL qpn=17", "QP_LAST_WQE_REACHED qpn=17",
		"QP_FATAL qpn=19", "QP_LAST_WQE_REACHED qpn=19",
		"QP_FATAL qpn=21", "QP_LAST_WQE_REACHED qpn=21")
	for i, q := range s.qps {
		if st := state(t, q); st != ibv.QPSErr {
			t.Errorf("QP %d: %s, want ERR", q.Num(), st)
		}
		wantWCs(t, s.cqs[i], flushed(uint64(100+i), q.Num()))
	}
	if st := state(t, reset); st != ibv.QPSReset {
		t.Errorf("QP in RESET moved to %s", st)
	}
	for _, p := range s.peers {
		if st := state(t, p); st != ibv.QPSRTS {
			t.Errorf("peer %d: %s, want RTS", p.Num(), st)
		}
	}
	var pe *ibv.PostError
	if err := s.srq.PostRecv([]ibv.RecvWR{{ID: 1}}); !errors.As(err, &pe) || !errors.Is(err, ibv.ErrInvalidState) {
		t.Errorf("PostRecv on an SRQ in error: %v", err)
	}
	// The SRQ in error hands out none of the WQEs it still holds: the QP
	// that was in RESET takes none ahead when it reaches RTR.
	reach(t, reset, ibv.QPSRTR)
	if n := reset.Outstanding(); n != 0 {
		t.Errorf("QP attached to an SRQ in error took %d WQEs", n)
	}
}

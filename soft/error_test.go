package soft_test

import (
	"testing"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/soft"
)

func TestFlushInOrder(t *testing.T) {
	fab := soft.NewFabric()
	fab.SetAutoProgress(false)
	e := newEnv(t, soft.Config{Fabric: fab})
	p := newPair(t, e, e)
	postRecv(t, p.a, ibv.RecvWR{ID: 100, SGL: sge(p.ma, 0, 8)}, ibv.RecvWR{ID: 101})
	post(t, p.a,
		ibv.SendWR{ID: 1, Opcode: ibv.WRSend, Flags: ibv.SendSignaled, SGL: sge(p.ma, 0, 8)},
		ibv.SendWR{ID: 2, Opcode: ibv.WRRDMAWrite}, // unsignaled: flushed all the same
		ibv.SendWR{ID: 3, Opcode: ibv.WRRDMARead, Flags: ibv.SendSignaled, SGL: sge(p.ma, 0, 8)})
	toState(t, p.a, ibv.QPSErr)
	qa := p.a.Num()
	wantWCs(t, p.cqa, flushed(1, qa), flushed(2, qa), flushed(3, qa), flushed(100, qa), flushed(101, qa))
	if n := fab.Progress(0); n != 0 {
		t.Errorf("Progress after the flush executed %d WRs, want 0", n)
	}
	// Posted in ERROR: flushed at once, send and receive alike.
	post(t, p.a, ibv.SendWR{ID: 4, Opcode: ibv.WRSend})
	postRecv(t, p.a, ibv.RecvWR{ID: 102})
	wantWCs(t, p.cqa, flushed(4, qa), flushed(102, qa))
	wantEvents(t, e.dev) // a Modify to ERR raises nothing, and a non-SRQ QP never gets Last WQE Reached
}

func TestResponderErrors(t *testing.T) {
	const (
		noAtomic = ibv.AccessLocalWrite | ibv.AccessRemoteWrite | ibv.AccessRemoteRead
	)
	tests := []struct {
		name      string
		prep      func(t *testing.T, p *pair)
		wr        func(p *pair, small ibv.MR) ibv.SendWR
		recv      func(p *pair, small ibv.MR) []ibv.RecvWR
		reqStatus ibv.WCStatus
		event     string // responder's async event, "" for none
		recvWC    ibv.WCStatus
	}{
		{name: "bad rkey",
			wr: func(p *pair, _ ibv.MR) ibv.SendWR {
				return ibv.SendWR{ID: 1, Opcode: ibv.WRRDMAWrite, SGL: sge(p.ma, 0, 8), RemoteAddr: p.mb.Addr(), RKey: 0xdead}
			},
			reqStatus: ibv.WCRemAccessErr, event: "QP_ACCESS_ERR"},
		{name: "out of bounds",
			wr: func(p *pair, _ ibv.MR) ibv.SendWR {
				return ibv.SendWR{ID: 1, Opcode: ibv.WRRDMARead, SGL: sge(p.ma, 0, 16), RemoteAddr: p.mb.Addr() + 4090, RKey: p.mb.RKey()}
			},
			reqStatus: ibv.WCRemAccessErr, event: "QP_ACCESS_ERR"},
		{name: "MR without remote access",
			wr: func(p *pair, small ibv.MR) ibv.SendWR {
				return ibv.SendWR{ID: 1, Opcode: ibv.WRAtomicFetchAndAdd, SGL: sge(p.ma, 0, 8), RemoteAddr: small.Addr(), RKey: small.RKey()}
			},
			reqStatus: ibv.WCRemAccessErr, event: "QP_ACCESS_ERR"},
		{name: "misaligned atomic",
			wr: func(p *pair, _ ibv.MR) ibv.SendWR {
				return ibv.SendWR{ID: 1, Opcode: ibv.WRAtomicCmpAndSwp, SGL: sge(p.ma, 0, 8), RemoteAddr: p.mb.Addr() + 4, RKey: p.mb.RKey()}
			},
			reqStatus: ibv.WCRemInvReqErr, event: "QP_ACCESS_ERR"},
		{name: "SEND longer than the receive buffer",
			wr: func(p *pair, _ ibv.MR) ibv.SendWR {
				return ibv.SendWR{ID: 1, Opcode: ibv.WRSend, SGL: sge(p.ma, 0, 64)}
			},
			recv: func(p *pair, _ ibv.MR) []ibv.RecvWR {
				return []ibv.RecvWR{{ID: 50, SGL: sge(p.mb, 0, 32)}, {ID: 51}}
			},
			reqStatus: ibv.WCRemInvReqErr, event: "QP_ACCESS_ERR", recvWC: ibv.WCLocLenErr},
		{name: "QP without remote write",
			prep: func(t *testing.T, p *pair) {
				if err := p.b.Modify(ibv.QPAttr{AccessFlags: ibv.AccessRemoteRead}, ibv.QPAttrAccessFlags); err != nil {
					t.Fatal(err)
				}
			},
			wr: func(p *pair, _ ibv.MR) ibv.SendWR {
				return ibv.SendWR{ID: 1, Opcode: ibv.WRRDMAWrite} // zero-length: only the QP's access is checked
			},
			reqStatus: ibv.WCRemInvReqErr, event: "QP_REQ_ERR"},
		{name: "unsupported opcode",
			wr:        func(p *pair, _ ibv.MR) ibv.SendWR { return ibv.SendWR{ID: 1, Opcode: ibv.WRSendWithInv} },
			reqStatus: ibv.WCRemInvReqErr, event: "QP_REQ_ERR"},
		{name: "receive WQE with a bad lkey",
			wr: func(p *pair, _ ibv.MR) ibv.SendWR { return ibv.SendWR{ID: 1, Opcode: ibv.WRSend, SGL: sge(p.ma, 0, 8)} },
			recv: func(p *pair, _ ibv.MR) []ibv.RecvWR {
				return []ibv.RecvWR{{ID: 50, SGL: []ibv.SGE{{Addr: p.mb.Addr(), Length: 8, LKey: 0xbad}}}, {ID: 51}}
			},
			reqStatus: ibv.WCRemOpErr, recvWC: ibv.WCLocProtErr},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, soft.Config{})
			p := newPair(t, e, e)
			small := e.mr(64, noAtomic)
			if tt.prep != nil {
				tt.prep(t, p)
			}
			if tt.recv != nil {
				postRecv(t, p.b, tt.recv(p, small)...)
			}
			post(t, p.a, tt.wr(p, small), ibv.SendWR{ID: 2, Opcode: ibv.WRSend, Flags: ibv.SendSignaled})
			wantWCs(t, p.cqa, ibv.WC{ID: 1, Status: tt.reqStatus, QPNum: p.a.Num()}, flushed(2, p.a.Num()))
			var wantB []ibv.WC
			if tt.recv != nil {
				wantB = []ibv.WC{{ID: 50, Status: tt.recvWC, QPNum: p.b.Num()}, flushed(51, p.b.Num())}
			}
			wantWCs(t, p.cqb, wantB...)
			var wantEv []string
			if tt.event != "" {
				wantEv = []string{tt.event + " qpn=18"}
			}
			wantEvents(t, e.dev, wantEv...)
			if sa, sb := state(t, p.a), state(t, p.b); sa != ibv.QPSErr || sb != ibv.QPSErr {
				t.Errorf("requester %s, responder %s; want both ERR", sa, sb)
			}
		})
	}
}

func TestTooManyReads(t *testing.T) {
	e := newEnv(t, soft.Config{})
	cqa, cqb := e.cq(16), e.cq(16)
	m := e.mr(64, ibv.AccessLocalWrite|ibv.AccessRemoteRead)
	a, b := e.qp(cqa, nil), e.qp(cqb, nil)
	if err := a.ToRTS(e.dev.LID(), b.Num(), 4); err != nil { // a issues up to 4 READs ...
		t.Fatal(err)
	}
	if err := b.ToRTS(e.dev.LID(), a.Num(), 1); err != nil { // ... b accepts 1
		t.Fatal(err)
	}
	read := func(id uint64) ibv.SendWR {
		return ibv.SendWR{ID: id, Opcode: ibv.WRRDMARead, Flags: ibv.SendSignaled, SGL: sge(m, 0, 8), RemoteAddr: m.Addr() + 8, RKey: m.RKey()}
	}
	post(t, a, read(1)) // one at a time is fine
	wantWCs(t, cqa, ibv.WC{ID: 1, Opcode: ibv.WCRDMARead, ByteLen: 8, QPNum: a.Num()})
	post(t, a, read(2), read(3))
	wantWCs(t, cqa, ibv.WC{ID: 2, Status: ibv.WCRemInvReqErr, QPNum: a.Num()}, flushed(3, a.Num()))
	wantEvents(t, e.dev, "QP_ACCESS_ERR qpn=18")
}

func TestLocalErrors(t *testing.T) {
	e := newEnv(t, soft.Config{})
	p := newPair(t, e, e)
	ro := e.mr(64, 0) // local read only
	postRecv(t, p.b, ibv.RecvWR{ID: 9})
	post(t, p.a, ibv.SendWR{ID: 1, Opcode: ibv.WRRDMARead, SGL: sge(ro, 0, 8), RemoteAddr: p.mb.Addr(), RKey: p.mb.RKey()})
	wantWCs(t, p.cqa, ibv.WC{ID: 1, Status: ibv.WCLocProtErr, QPNum: p.a.Num()})
	if s := state(t, p.b); s != ibv.QPSRTS {
		t.Errorf("a local error moved the responder to %s", s)
	}
	wantWCs(t, p.cqb)
	wantEvents(t, e.dev)
}

// A fault in one QP changes no other QP's state, queues or completions.
func TestIsolation(t *testing.T) {
	e := newEnv(t, soft.Config{})
	bad, good := newPair(t, e, e), newPair(t, e, e)
	postRecv(t, good.b, ibv.RecvWR{ID: 1}, ibv.RecvWR{ID: 2})
	post(t, bad.a, ibv.SendWR{ID: 1, Opcode: ibv.WRRDMAWrite, SGL: sge(bad.ma, 0, 8), RKey: 0xdead})
	post(t, good.a, ibv.SendWR{ID: 3, Opcode: ibv.WRSend, Flags: ibv.SendSignaled})
	wantWCs(t, good.cqa, ibv.WC{ID: 3, Opcode: ibv.WCSend, QPNum: good.a.Num()})
	wantWCs(t, good.cqb, ibv.WC{ID: 1, Opcode: ibv.WCRecv, QPNum: good.b.Num(), SrcQP: good.a.Num(), SLID: e.dev.LID()})
	for _, q := range []ibv.QP{good.a, good.b} {
		if s := state(t, q); s != ibv.QPSRTS {
			t.Errorf("QP %d: %s, want RTS", q.Num(), s)
		}
	}
	toState(t, good.b, ibv.QPSErr) // its second receive is still there, untouched
	wantWCs(t, good.cqb, flushed(2, good.b.Num()))
}

func TestCQOverflow(t *testing.T) {
	e := newEnv(t, soft.Config{})
	shared := e.cq(2)
	peerCQ, otherCQ := e.cq(16), e.cq(16)
	a1, a2, other := e.qp(shared, nil), e.qp(shared, nil), e.qp(otherCQ, nil)
	b1, b2, ob := e.qp(peerCQ, nil), e.qp(peerCQ, nil), e.qp(peerCQ, nil)
	connect(t, a1, b1, 1)
	connect(t, a2, b2, 1)
	connect(t, other, ob, 1)
	postRecv(t, b1, ibv.RecvWR{ID: 1}, ibv.RecvWR{ID: 2}, ibv.RecvWR{ID: 3})
	sig := ibv.SendWR{Opcode: ibv.WRSend, Flags: ibv.SendSignaled}
	post(t, a1, sig, sig, sig) // the third completion overflows the 2-entry CQ
	wantEvents(t, e.dev, "CQ_ERR cq", "QP_FATAL qpn=17", "QP_FATAL qpn=18")
	for _, q := range []ibv.QP{a1, a2} {
		if s := state(t, q); s != ibv.QPSErr {
			t.Errorf("QP %d on the overflowed CQ: %s, want ERR", q.Num(), s)
		}
	}
	if n := len(pollAll(t, shared)); n != 2 {
		t.Errorf("overflowed CQ returned %d completions, want the 2 it held", n)
	}
	if s := state(t, other); s != ibv.QPSRTS {
		t.Errorf("QP on another CQ: %s, want RTS", s)
	}
}

// A QP whose receive CQ overflows still delivers its send completions, the
// flushes included, to its healthy send CQ.
func TestCQOverflowSeparateCQs(t *testing.T) {
	e := newEnv(t, soft.Config{})
	scq, rcq := e.cq(8), e.cq(1)
	q, err := e.pd.CreateQP(ibv.QPInitAttr{SendCQ: scq, RecvCQ: rcq, Type: ibv.QPTRC,
		Cap: ibv.QPCap{MaxSendWR: 4, MaxRecvWR: 4}})
	if err != nil {
		t.Fatal(err)
	}
	e.closeLater(q)
	peer := e.qp(e.cq(8), nil)
	connect(t, q, peer, 1)
	postRecv(t, q, ibv.RecvWR{ID: 1}, ibv.RecvWR{ID: 2}, ibv.RecvWR{ID: 3})
	post(t, q, ibv.SendWR{ID: 10, Opcode: ibv.WRSend}) // waits: the peer has no receive
	post(t, peer, ibv.SendWR{Opcode: ibv.WRSend}, ibv.SendWR{Opcode: ibv.WRSend})
	wantEvents(t, e.dev, "CQ_ERR cq", "QP_FATAL qpn=17")
	wantWCs(t, rcq, ibv.WC{ID: 1, Opcode: ibv.WCRecv, QPNum: q.Num(), SrcQP: peer.Num(), SLID: 1})
	wantWCs(t, scq, flushed(10, q.Num()))
	if s := state(t, peer); s != ibv.QPSRTS {
		t.Errorf("peer: %s, want RTS", s)
	}
}

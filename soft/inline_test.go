package soft_test

import (
	"errors"
	"testing"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/soft"
)

// inlineQP creates an RC QP completing into cq that takes up to maxInline
// bytes of inline data.
func (e *env) inlineQP(cq ibv.CQ, maxInline uint32) *soft.QP {
	e.t.Helper()
	q, err := e.pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: ibv.QPTRC,
		Cap: ibv.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: maxInline}})
	if err != nil {
		e.t.Fatalf("CreateQP with %d bytes inline: %v", maxInline, err)
	}
	e.closeLater(q)
	return q.(*soft.QP)
}

// inlinePair is QP a, with room for 64 bytes inline, connected to QP b on
// another device of fab; src is a buffer on a's device that a's inline
// sends read.
func inlinePair(t *testing.T, fab *soft.Fabric) (p *pair, src ibv.MR) {
	t.Helper()
	const all = ibv.AccessLocalWrite | ibv.AccessRemoteWrite | ibv.AccessRemoteRead | ibv.AccessRemoteAtomic
	x := newEnv(t, soft.Config{Name: "x", Fabric: fab})
	y := newEnv(t, soft.Config{Name: "y", Fabric: fab})
	p = &pair{cqa: x.cq(64), cqb: y.cq(64), ma: x.mr(4096, all), mb: y.mr(4096, all)}
	p.a, p.b = x.inlineQP(p.cqa, 64), y.qp(p.cqb, nil)
	connect(t, p.a, p.b, 4)
	return p, x.mr(256, 0)
}

// TestInlineCopiedAtPost: the data of an inline send is copied when it is
// posted, from the SGEs in order and without checking their lkeys, so the
// buffer may be reused at once: with auto-progress off the source is
// overwritten before the WRs execute, and the responder still gets the
// bytes as they were at post time.
func TestInlineCopiedAtPost(t *testing.T) {
	fab := soft.NewFabric()
	p, src := inlinePair(t, fab)
	fab.SetAutoProgress(false)
	buf := src.Buf()
	copy(buf, "inline!written")
	badKeys := []ibv.SGE{{Addr: src.Addr(), Length: 3, LKey: 0}, {Addr: src.Addr() + 3, Length: 4, LKey: 0xbad}}
	postRecv(t, p.b, ibv.RecvWR{ID: 10, SGL: sge(p.mb, 0, 64)}, ibv.RecvWR{ID: 11})
	post(t, p.a,
		ibv.SendWR{ID: 1, Opcode: ibv.WRSendWithImm, Flags: ibv.SendSignaled | ibv.SendInline, SGL: badKeys, ImmData: 7},
		ibv.SendWR{ID: 2, Opcode: ibv.WRRDMAWriteWithImm, Flags: ibv.SendSignaled | ibv.SendInline,
			SGL: []ibv.SGE{{Addr: src.Addr() + 7, Length: 7}}, RemoteAddr: p.mb.Addr() + 100, RKey: p.mb.RKey(), ImmData: 8})
	copy(buf, "OVERWRITTEN...")
	if n := fab.Progress(0); n != 2 {
		t.Fatalf("Progress executed %d WRs, want 2", n)
	}
	wantWCs(t, p.cqa,
		ibv.WC{ID: 1, Opcode: ibv.WCSend, ByteLen: 7, QPNum: p.a.Num()},
		ibv.WC{ID: 2, Opcode: ibv.WCRDMAWrite, ByteLen: 7, QPNum: p.a.Num()})
	got := pollAll(t, p.cqb)
	if len(got) != 2 || got[0].ID != 10 || got[0].Status != ibv.WCSuccess || got[0].ByteLen != 7 || got[0].ImmData != 7 ||
		got[1].ID != 11 || got[1].Status != ibv.WCSuccess || got[1].Opcode != ibv.WCRecvRDMAWithImm || got[1].ByteLen != 7 || got[1].ImmData != 8 {
		t.Fatalf("responder completions %v, want receives 10 (7 bytes, imm 7) and 11 (WRITE of 7 bytes, imm 8)", got)
	}
	if s := string(p.mb.Buf()[:7]); s != "inline!" {
		t.Errorf("inline SEND delivered %q, want the bytes at post time %q", s, "inline!")
	}
	if s := string(p.mb.Buf()[100:107]); s != "written" {
		t.Errorf("inline RDMA WRITE stored %q, want the bytes at post time %q", s, "written")
	}

	// The same SEND without SendInline does check the lkeys.
	postRecv(t, p.b, ibv.RecvWR{ID: 12, SGL: sge(p.mb, 0, 64)})
	post(t, p.a, ibv.SendWR{ID: 3, Opcode: ibv.WRSend, Flags: ibv.SendSignaled, SGL: badKeys})
	fab.Progress(0)
	wantWCs(t, p.cqa, ibv.WC{ID: 3, Status: ibv.WCLocProtErr, QPNum: p.a.Num()})
}

// TestInlinePostErrors: an inline send longer than the QP's MaxInlineData,
// one with an opcode that carries no outgoing data, and one whose data the
// soft device cannot see each fail the post with EINVAL, naming the WR;
// the WRs before it are posted.
func TestInlinePostErrors(t *testing.T) {
	p, src := inlinePair(t, soft.NewFabric())
	_, init, err := p.a.Query(0)
	if err != nil || init.Cap.MaxInlineData != 64 {
		t.Fatalf("Query: cap %+v, %v; want MaxInlineData 64", init.Cap, err)
	}
	ok := ibv.SendWR{ID: 1, Opcode: ibv.WRRDMAWrite, Flags: ibv.SendSignaled | ibv.SendInline,
		SGL: []ibv.SGE{{Addr: src.Addr(), Length: 32}, {Addr: src.Addr() + 32, Length: 32}}, RemoteAddr: p.mb.Addr(), RKey: p.mb.RKey()}
	remote := ibv.SendWR{SGL: sge(src, 0, 8), RemoteAddr: p.mb.Addr(), RKey: p.mb.RKey(), Flags: ibv.SendInline}
	for name, bad := range map[string]ibv.SendWR{
		"65 bytes":     {Opcode: ibv.WRSend, Flags: ibv.SendInline, SGL: []ibv.SGE{{Addr: src.Addr(), Length: 64}, {Addr: src.Addr() + 64, Length: 1}}},
		"RDMA READ":    func() ibv.SendWR { w := remote; w.Opcode = ibv.WRRDMARead; return w }(),
		"fetch-add":    func() ibv.SendWR { w := remote; w.Opcode = ibv.WRAtomicFetchAndAdd; return w }(),
		"cmp-swap":     func() ibv.SendWR { w := remote; w.Opcode = ibv.WRAtomicCmpAndSwp; return w }(),
		"not in an MR": {Opcode: ibv.WRSend, Flags: ibv.SendInline, SGL: []ibv.SGE{{Addr: 8, Length: 8}}},
	} {
		err := p.a.PostSend([]ibv.SendWR{ok, bad})
		var pe *ibv.PostError
		if !errors.As(err, &pe) || pe.Index != 1 || !errors.Is(err, ibv.ErrInvalidArgument) {
			t.Errorf("posting an inline write, then inline %s: %v, want a PostError at index 1 wrapping ErrInvalidArgument", name, err)
		}
		wantWCs(t, p.cqa, ibv.WC{ID: 1, Opcode: ibv.WCRDMAWrite, ByteLen: 64, QPNum: p.a.Num()})
	}
	if s := state(t, p.a); s != ibv.QPSRTS {
		t.Errorf("QP in %s after refused posts, want RTS", s)
	}
}

// TestInlineLimit: a QP may ask for up to Limits.MaxInlineData bytes of
// inline data (default 512, rxe's maximum) and is granted what it asked
// for; more fails with EINVAL, as rxe's create does.
func TestInlineLimit(t *testing.T) {
	for _, tt := range []struct {
		limits soft.Limits
		max    uint32
	}{{soft.Limits{}, 512}, {soft.Limits{MaxInlineData: 100}, 100}} {
		e := newEnv(t, soft.Config{Limits: tt.limits})
		cq := e.cq(8)
		q := e.inlineQP(cq, tt.max)
		if _, init, err := q.Query(0); err != nil || init.Cap.MaxInlineData != tt.max {
			t.Errorf("Query: cap %+v, %v; want MaxInlineData %d", init.Cap, err, tt.max)
		}
		_, err := e.pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: ibv.QPTRC, Cap: ibv.QPCap{MaxInlineData: tt.max + 1}})
		if !errors.Is(err, ibv.ErrInvalidArgument) {
			t.Errorf("QP with %d bytes inline on a device taking %d: %v, want ErrInvalidArgument", tt.max+1, tt.max, err)
		}
	}
	if _, err := soft.Open(soft.Config{Limits: soft.Limits{MaxInlineData: -1}}); !errors.Is(err, ibv.ErrInvalidArgument) {
		t.Errorf("Open with MaxInlineData -1: %v, want ErrInvalidArgument", err)
	}
}

package devtest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
)

// loopback is two connected RC QPs on one device, each with its own CQ
// and a registered buffer.
type loopback struct {
	ctx      ibv.Context
	pd       ibv.PD
	a, b     ibv.QP
	mra, mrb ibv.MR
}

func newLoopback(t *testing.T) *loopback {
	t.Helper()
	ctx := Open(t)
	pd := NewPD(t, ctx)
	l := &loopback{ctx: ctx, pd: pd}
	l.a, l.b = Pair(t, pd, RCConfig{}, RCConfig{})
	l.mra = Buffer(t, pd, 4096, AllAccess)
	l.mrb = Buffer(t, pd, 4096, AllAccess)
	return l
}

func sge(mr ibv.MR, off, n int) []ibv.SGE {
	return []ibv.SGE{{Addr: mr.Addr() + uint64(off), Length: uint32(n), LKey: mr.LKey()}}
}

func post(t *testing.T, qp ibv.QP, wrs ...ibv.SendWR) {
	t.Helper()
	if err := qp.PostSend(wrs); err != nil {
		t.Fatalf("posting send on QP %d: %v", qp.Num(), err)
	}
}

func postRecv(t *testing.T, qp ibv.QP, wrs ...ibv.RecvWR) {
	t.Helper()
	if err := qp.PostRecv(wrs); err != nil {
		t.Fatalf("posting receive on QP %d: %v", qp.Num(), err)
	}
}

func checkWC(t *testing.T, wc ibv.WC, id uint64, status ibv.WCStatus, op ibv.WCOpcode) {
	t.Helper()
	if wc.ID != id || wc.Status != status || (status == ibv.WCSuccess && wc.Opcode != op) {
		t.Fatalf("completion %v, want wr_id=%d status=%s opcode=%s", wc, id, status, op)
	}
}

func TestConnect(t *testing.T) {
	l := newLoopback(t)
	// iWARP carries no destination QP number: DDP's queue number (RFC
	// 5041) names one of a connection's three queues, and siw_query_qp
	// (drivers/infiniband/sw/siw/siw_verbs.c) fills in no dest_qp_num.
	siw := SIW(t, l.ctx)
	if siw {
		t.Log("dest_qp_num not checked: siw_query_qp fills in none (iWARP has no destination QP number)")
	}
	for _, qp := range []ibv.QP{l.a, l.b} {
		if s := State(t, qp); s != ibv.QPSRTS {
			t.Errorf("QP %d is %s, want RTS", qp.Num(), s)
		}
		attr, init, err := qp.Query(ibv.QPAttrDestQPN | ibv.QPAttrCap)
		if err != nil {
			t.Fatal(err)
		}
		peer := l.b
		if qp == l.b {
			peer = l.a
		}
		if !siw && attr.DestQPNum != peer.Num() {
			t.Errorf("QP %d dest QPN %d, want %d", qp.Num(), attr.DestQPNum, peer.Num())
		}
		if init.Type != ibv.QPTRC || init.SendCQ != qp.SendCQ() || init.SRQ != nil || init.Cap.MaxSendWR < 16 {
			t.Errorf("QP %d init attributes %+v", qp.Num(), init)
		}
	}
}

// immediateData reports whether ctx carries immediate data. siw does not:
// RDMAP (RFC 5040) has none (RFC 7306 adds it, which siw does not
// implement), and libsiw refuses SEND_WITH_IMM and RDMA_WRITE_WITH_IMM
// with EINVAL (map_send_opcode in rdma-core's providers/siw/siw.c).
func immediateData(t *testing.T, ctx ibv.Context) bool {
	t.Helper()
	if SIW(t, ctx) {
		t.Log("no immediate data: siw implements none (RFC 5040 has none; libsiw's map_send_opcode refuses the WITH_IMM opcodes)")
		return false
	}
	return true
}

func TestSendRecv(t *testing.T) {
	l := newLoopback(t)
	msg := []byte("hello, responder")
	copy(l.mra.Buf(), msg)
	first := ibv.SendWR{ID: 1, Opcode: ibv.WRSendWithImm, Flags: ibv.SendSignaled, SGL: sge(l.mra, 0, len(msg)), ImmData: 0xdeadbeef}
	imm := immediateData(t, l.ctx)
	if !imm {
		first.Opcode, first.ImmData = ibv.WRSend, 0
	}
	postRecv(t, l.b, ibv.RecvWR{ID: 10, SGL: sge(l.mrb, 0, 64)}, ibv.RecvWR{ID: 11, SGL: sge(l.mrb, 64, 64)})
	post(t, l.a, first, ibv.SendWR{ID: 2, Opcode: ibv.WRSend, Flags: ibv.SendSignaled})
	wcs := Poll(t, l.a.SendCQ(), 2)
	checkWC(t, wcs[0], 1, ibv.WCSuccess, ibv.WCSend)
	checkWC(t, wcs[1], 2, ibv.WCSuccess, ibv.WCSend)
	wcs = Poll(t, l.b.RecvCQ(), 2)
	checkWC(t, wcs[0], 10, ibv.WCSuccess, ibv.WCRecv)
	if wcs[0].ByteLen != uint32(len(msg)) || (wcs[0].Flags&ibv.WCFlagWithImm != 0) != imm || imm && wcs[0].ImmData != 0xdeadbeef || wcs[0].QPNum != l.b.Num() {
		t.Errorf("receive %+v, want %d bytes (with immediate 0xdeadbeef: %v) on QP %d", wcs[0], len(msg), imm, l.b.Num())
	}
	checkWC(t, wcs[1], 11, ibv.WCSuccess, ibv.WCRecv)
	if wcs[1].ByteLen != 0 || wcs[1].Flags&ibv.WCFlagWithImm != 0 {
		t.Errorf("zero-length receive %+v, want 0 bytes without immediate", wcs[1])
	}
	if got := l.mrb.Buf()[:len(msg)]; !bytes.Equal(got, msg) {
		t.Errorf("received %q, want %q", got, msg)
	}
}

// TestSendInline: a QP created with room for inline data sends the bytes
// its SGEs hold at post time, so the buffer may be reused as soon as
// PostSend returns, and checks no lkey for them. An inline send longer than
// the QP's max_inline_data fails the post with EINVAL at that WR; the WRs
// before it are posted. Soft and rxe alike (docs/PROVIDERS.md).
func TestSendInline(t *testing.T) {
	ctx := Open(t)
	pd := NewPD(t, ctx)
	cq := NewCQ(t, ctx, 16)
	inline := ibv.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64}
	a, b := Pair(t, pd, RCConfig{SendCQ: cq, Cap: inline}, RCConfig{})
	_, init, err := a.Query(ibv.QPAttrCap)
	if err != nil || init.Cap.MaxInlineData < inline.MaxInlineData {
		t.Fatalf("QP created with %d bytes inline: Query gives cap %+v, %v", inline.MaxInlineData, init.Cap, err)
	}
	granted := int(init.Cap.MaxInlineData)
	t.Logf("asked for %+v, granted %+v", inline, init.Cap)
	mra := Buffer(t, pd, 4096, AllAccess)
	mrb := Buffer(t, pd, 4096, AllAccess)
	copy(mra.Buf(), "inline!")
	postRecv(t, b, ibv.RecvWR{ID: 11, SGL: sge(mrb, 0, 64)}, ibv.RecvWR{ID: 12, SGL: sge(mrb, 64, 64)})
	noKey := []ibv.SGE{{Addr: mra.Addr(), Length: 7, LKey: 0}} // inline data needs no lkey
	post(t, a, ibv.SendWR{ID: 2, Opcode: ibv.WRSend, Flags: ibv.SendSignaled | ibv.SendInline, SGL: noKey})
	copy(mra.Buf(), "changed") // inline data was copied at post time
	checkWC(t, Poll(t, cq, 1)[0], 2, ibv.WCSuccess, ibv.WCSend)
	wc := Poll(t, b.RecvCQ(), 1)[0]
	checkWC(t, wc, 11, ibv.WCSuccess, ibv.WCRecv)
	if got := string(mrb.Buf()[:7]); wc.ByteLen != 7 || got != "inline!" {
		t.Errorf("inline receive of %d bytes %q, want 7 bytes %q", wc.ByteLen, got, "inline!")
	}

	err = a.PostSend([]ibv.SendWR{
		{ID: 3, Opcode: ibv.WRSend, Flags: ibv.SendSignaled | ibv.SendInline, SGL: sge(mra, 0, 7)},
		{ID: 4, Opcode: ibv.WRSend, Flags: ibv.SendSignaled | ibv.SendInline, SGL: sge(mra, 0, granted+1)}})
	var pe *ibv.PostError
	switch {
	case SIW(t, ctx):
		// libsiw's siw_post_send (rdma-core providers/siw/siw.c) stops
		// at the WR push_send_wqe refuses (EINVAL), then overwrites that
		// error with the doorbell's result for the WRs queued before
		// it: the post succeeds and the long WR is dropped, never sent
		// and never completed.
		if err != nil {
			t.Errorf("posting inline sends of 7 and %d bytes (max %d) on siw: %v, want nil (libsiw loses the EINVAL)", granted+1, granted, err)
		}
	case !errors.As(err, &pe) || pe.Index != 1 || !errors.Is(err, ibv.ErrInvalidArgument):
		t.Errorf("posting inline sends of 7 and %d bytes (max %d): %v, want EINVAL at WR 1", granted+1, granted, err)
	}
	checkWC(t, Poll(t, cq, 1)[0], 3, ibv.WCSuccess, ibv.WCSend)
	checkWC(t, Poll(t, b.RecvCQ(), 1)[0], 12, ibv.WCSuccess, ibv.WCRecv)
	PollNone(t, cq, quiet) // the long WR was not posted
}

// TestInlineReadAtomic: IBV_SEND_INLINE on an RDMA READ or an atomic, whose
// data flows to the requester. ibv_post_send(3) allows inline data only for
// sends and RDMA writes: the soft device refuses the post with EINVAL at
// that WR. librxe checks only the inline length at post time, so on rxe
// the post succeeds and the WR completes with LOC_PROT_ERR, moving the QP
// to ERROR (docs/PROVIDERS.md). siw refuses them all, but not all with
// EINVAL (below).
func TestInlineReadAtomic(t *testing.T) {
	for _, op := range []ibv.WROpcode{ibv.WRRDMARead, ibv.WRAtomicFetchAndAdd, ibv.WRAtomicCmpAndSwp} {
		t.Run(op.String(), func(t *testing.T) {
			ctx := Open(t)
			pd := NewPD(t, ctx)
			cq := NewCQ(t, ctx, 16)
			a, _ := Pair(t, pd, RCConfig{SendCQ: cq, Cap: ibv.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64}}, RCConfig{})
			mra := Buffer(t, pd, 4096, AllAccess)
			mrb := Buffer(t, pd, 4096, AllAccess)
			err := a.PostSend([]ibv.SendWR{{ID: 5, Opcode: op, Flags: ibv.SendSignaled | ibv.SendInline,
				SGL: sge(mra, 0, 8), RemoteAddr: mrb.Addr(), RKey: mrb.RKey()}})
			if CurrentProvider() == ProviderRXE {
				if err != nil {
					t.Fatalf("posting an inline %s on rxe: %v, want it posted", op, err)
				}
				checkWC(t, Poll(t, cq, 1)[0], 5, ibv.WCLocProtErr, 0)
				if s := State(t, a); s != ibv.QPSErr {
					t.Errorf("QP in %s after the inline %s failed, want ERR", s, op)
				}
				return
			}
			// siw refuses the atomics itself (libsiw's map_send_opcode in
			// rdma-core's providers/siw/siw.c) and the inline READ at its
			// doorbell (siw_activate_tx_from_sq in
			// drivers/infiniband/sw/siw/siw_qp.c: inline only on SEND and
			// WRITE), whose write(2) fails with EINVAL (siw_db in
			// providers/siw/siw.h returns its -1, the binding reads errno).
			var pe *ibv.PostError
			if !errors.As(err, &pe) || pe.Index != 0 || !errors.Is(err, ibv.ErrInvalidArgument) {
				t.Errorf("posting an inline %s: %v, want EINVAL at WR 0", op, err)
			}
		})
	}
}

func TestRDMAWriteRead(t *testing.T) {
	l := newLoopback(t)
	copy(l.mra.Buf(), "written by RDMA")
	copy(l.mrb.Buf()[1024:], "read by RDMA")
	// The receive a WRITE with immediate consumes takes no data, but
	// libsiw refuses a receive without an SGE (push_recv_wqe in rdma-core's
	// providers/siw/siw.c), so it has one.
	postRecv(t, l.b, ibv.RecvWR{ID: 20, SGL: sge(l.mrb, 2048, 8)})
	write := ibv.SendWR{ID: 1, Opcode: ibv.WRRDMAWrite, Flags: ibv.SendSignaled, SGL: sge(l.mra, 0, 15), RemoteAddr: l.mrb.Addr() + 512, RKey: l.mrb.RKey()}
	withImm := ibv.SendWR{ID: 2, Opcode: ibv.WRRDMAWriteWithImm, Flags: ibv.SendSignaled, SGL: sge(l.mra, 0, 7), RemoteAddr: l.mrb.Addr() + 600, RKey: l.mrb.RKey(), ImmData: 42}
	read := ibv.SendWR{ID: 3, Opcode: ibv.WRRDMARead, Flags: ibv.SendSignaled, SGL: sge(l.mra, 2048, 12), RemoteAddr: l.mrb.Addr() + 1024, RKey: l.mrb.RKey()}
	wrs := []ibv.SendWR{write, withImm, read}
	imm := immediateData(t, l.ctx)
	if !imm {
		wrs = []ibv.SendWR{write, read}
	}
	post(t, l.a, wrs...)
	wcs := Poll(t, l.a.SendCQ(), len(wrs))
	checkWC(t, wcs[0], 1, ibv.WCSuccess, ibv.WCRDMAWrite)
	if imm {
		checkWC(t, wcs[1], 2, ibv.WCSuccess, ibv.WCRDMAWrite)
	}
	rd := wcs[len(wcs)-1]
	checkWC(t, rd, 3, ibv.WCSuccess, ibv.WCRDMARead)
	if rd.ByteLen != 12 {
		t.Errorf("RDMA READ completion %v, want byte_len 12", rd)
	}
	if imm {
		wcs = Poll(t, l.b.RecvCQ(), 1)
		checkWC(t, wcs[0], 20, ibv.WCSuccess, ibv.WCRecvRDMAWithImm)
		if wcs[0].ImmData != 42 || wcs[0].Flags&ibv.WCFlagWithImm == 0 || wcs[0].ByteLen != 7 {
			t.Errorf("WRITE with immediate consumed %+v, want immediate 42, 7 bytes", wcs[0])
		}
	} else {
		PollNone(t, l.b.RecvCQ(), quiet) // a WRITE consumes no receive
	}
	if got := string(l.mrb.Buf()[512:527]); got != "written by RDMA" {
		t.Errorf("RDMA WRITE left %q", got)
	}
	if got := string(l.mra.Buf()[2048:2060]); got != "read by RDMA" {
		t.Errorf("RDMA READ brought %q", got)
	}
}

func TestAtomics(t *testing.T) {
	l := newLoopback(t)
	attr, err := l.ctx.QueryDevice()
	if err != nil {
		t.Fatal(err)
	}
	if attr.AtomicCap == ibv.AtomicNone {
		t.Skipf("%s reports atomic_cap %v (IBV_ATOMIC_NONE): it performs no atomics (siw: siw_query_device in drivers/infiniband/sw/siw/siw_verbs.c; RDMAP, RFC 5040, has none)", DeviceName(), attr.AtomicCap)
	}
	remote := l.mrb.Buf()[8:16]
	binary.NativeEndian.PutUint64(remote, 100)
	post(t, l.a,
		ibv.SendWR{ID: 1, Opcode: ibv.WRAtomicFetchAndAdd, Flags: ibv.SendSignaled, SGL: sge(l.mra, 0, 8), RemoteAddr: l.mrb.Addr() + 8, RKey: l.mrb.RKey(), CompareAdd: 5},
		ibv.SendWR{ID: 2, Opcode: ibv.WRAtomicCmpAndSwp, Flags: ibv.SendSignaled, SGL: sge(l.mra, 8, 8), RemoteAddr: l.mrb.Addr() + 8, RKey: l.mrb.RKey(), CompareAdd: 105, Swap: 7},
		ibv.SendWR{ID: 3, Opcode: ibv.WRAtomicCmpAndSwp, Flags: ibv.SendSignaled, SGL: sge(l.mra, 16, 8), RemoteAddr: l.mrb.Addr() + 8, RKey: l.mrb.RKey(), CompareAdd: 999, Swap: 1})
	wcs := Poll(t, l.a.SendCQ(), 3)
	checkWC(t, wcs[0], 1, ibv.WCSuccess, ibv.WCFetchAdd)
	checkWC(t, wcs[1], 2, ibv.WCSuccess, ibv.WCCompSwap)
	checkWC(t, wcs[2], 3, ibv.WCSuccess, ibv.WCCompSwap)
	local := l.mra.Buf()
	for i, want := range []uint64{100, 105, 7} {
		if got := binary.NativeEndian.Uint64(local[8*i:]); got != want {
			t.Errorf("atomic %d returned %d, want %d", i+1, got, want)
		}
	}
	if got := binary.NativeEndian.Uint64(remote); got != 7 {
		t.Errorf("remote value after atomics = %d, want 7", got)
	}
}

// Moving a QP to RESET with its completions unpolled: the soft device
// discards them, as libmlx4 and libmlx5 do (mlx4_modify_qp, mlx5_modify_qp
// clean the CQs); rxe_qp_reset leaves the CQ alone, so rxe keeps them
// (docs/PROVIDERS.md).
func TestResetWithCompletionsUnpolled(t *testing.T) {
	l := newLoopback(t)
	post(t, l.a, ibv.SendWR{ID: 1, Opcode: ibv.WRRDMAWrite, Flags: ibv.SendSignaled, SGL: sge(l.mra, 0, 8),
		RemoteAddr: l.mrb.Addr(), RKey: l.mrb.RKey()})
	// rxe writes the completion from a kernel task: let it run first.
	if CurrentProvider() == ProviderRXE {
		time.Sleep(200 * time.Millisecond)
	}
	if err := l.a.Modify(ibv.QPAttr{State: ibv.QPSReset}, ibv.QPAttrState); err != nil {
		t.Fatalf("moving QP %d to RESET: %v", l.a.Num(), err)
	}
	want := 0
	if CurrentProvider() == ProviderRXE {
		want = 1
	}
	batch := make([]ibv.WC, 4)
	n, err := l.a.SendCQ().Poll(batch)
	if err != nil {
		t.Fatal(err)
	}
	if CurrentProvider() != ProviderOther && n != want {
		t.Errorf("%d completions after RESET (%v), want %d on %s", n, batch[:n], want, CurrentProvider())
	}
	t.Logf("%s: %d completions of QP %d after RESET", DeviceName(), n, l.a.Num())
}

package devtest

import (
	"errors"
	"syscall"
	"testing"

	"github.com/qpdrain/qpdrain/ibv"
)

// TestErrorContract: the same misuse gives the same sentinel on every
// device, the one libibverbs gives on rxe (ibv/verbs.go documents each).
func TestErrorContract(t *testing.T) {
	t.Run("invalid transition", func(t *testing.T) {
		// rxe_qp_chk_attr refuses what ib_modify_qp_is_ok refuses with
		// EINVAL, which cannot tell a bad state from a bad attribute.
		// siw refuses RTS without a connection
		// (siw_qp_nextstate_from_idle in siw_qp.c), and takes any move
		// within its IDLE (the log line says why).
		ctx := Open(t)
		qp := NewRC(t, NewPD(t, ctx), RCConfig{})
		siw := SIW(t, ctx)
		for _, tc := range []struct {
			name     string
			to       ibv.QPState
			mask     ibv.QPAttrMask
			idleOnly bool // a move within IB's RESET, INIT and RTR
		}{
			{"RESET -> RTS", ibv.QPSRTS, ibv.QPAttrState, false},
			{"RESET -> INIT without PKEY_INDEX, PORT, ACCESS_FLAGS", ibv.QPSInit, ibv.QPAttrState, true},
			{"RESET -> INIT with SQ_PSN", ibv.QPSInit, ibv.QPAttrState | ibv.QPAttrPKeyIndex | ibv.QPAttrPort | ibv.QPAttrAccessFlags | ibv.QPAttrSQPSN, true},
		} {
			if siw && tc.idleOnly {
				t.Logf("%s: not on siw, which checks no attribute and has one IDLE state for RESET, INIT and RTR (siw_verbs_modify_qp, ib_qp_state_to_siw_qp_state in drivers/infiniband/sw/siw/siw_verbs.c)", tc.name)
				continue
			}
			err := qp.Modify(ibv.QPAttr{State: tc.to, PortNum: 1, AccessFlags: AllAccess}, tc.mask)
			if !errors.Is(err, ibv.ErrInvalidArgument) || !errors.Is(err, syscall.EINVAL) {
				t.Errorf("%s = %v, want ErrInvalidArgument (EINVAL)", tc.name, err)
			}
		}
		if s, want := State(t, qp), IdleState(t, ctx); s != want {
			t.Errorf("QP is %s after refused transitions, want %s", s, want)
		}
	})

	t.Run("post in a state that forbids it", func(t *testing.T) {
		// rxe_post_send refuses a send below RTS with EINVAL, and librxe
		// a receive in RESET; receives are allowed from INIT on.
		ctx := Open(t)
		if SIW(t, ctx) {
			t.Skip("siw queues a send posted below RTS in the send queue it shares with the kernel and only its doorbell is refused (rdma-core providers/siw/siw.c siw_post_send; the doorbell's write(2) fails with the kernel's ENOTCONN, siw_post_send in drivers/infiniband/sw/siw/siw_verbs.c), the WR left queued; it queues a receive in any state (siw_post_recv): no refusal to check")
		}
		pd := NewPD(t, ctx)
		mr := Buffer(t, pd, 4096, AllAccess)
		route := Route(t, ctx)
		for _, s := range []ibv.QPState{ibv.QPSReset, ibv.QPSInit, ibv.QPSRTR} {
			a := NewRC(t, pd, RCConfig{})
			b := NewRC(t, pd, RCConfig{})
			if s != ibv.QPSReset {
				if err := route.Bring(a, b.Num(), s); err != nil {
					t.Fatal(err)
				}
			}
			err := a.PostSend([]ibv.SendWR{{ID: 1, Opcode: ibv.WRSend, Flags: ibv.SendSignaled, SGL: sge(mr, 0, 8)}})
			var pe *ibv.PostError
			if !errors.As(err, &pe) || pe.Index != 0 || !errors.Is(err, ibv.ErrInvalidArgument) {
				t.Errorf("PostSend in %s = %v, want a PostError at 0 matching ErrInvalidArgument", s, err)
			}
			err = a.PostRecv([]ibv.RecvWR{{ID: 2, SGL: sge(mr, 64, 64)}})
			if s == ibv.QPSReset && (!errors.As(err, &pe) || pe.Index != 0 || !errors.Is(err, ibv.ErrInvalidArgument)) {
				t.Errorf("PostRecv in RESET = %v, want a PostError at 0 matching ErrInvalidArgument", err)
			}
			if s != ibv.QPSReset && err != nil {
				t.Errorf("PostRecv in %s = %v, want it posted", s, err)
			}
			PollNone(t, a.SendCQ(), quiet/5) // nothing posted, nothing completes
		}
	})

	t.Run("unsupported opcode in a batch", func(t *testing.T) {
		// A provider posts WRs one by one and stops at the one it
		// rejects (bad_wr): the WRs before it are posted and complete.
		l := newLoopback(t)
		postRecv(t, l.b, ibv.RecvWR{ID: 30, SGL: sge(l.mrb, 0, 64)}, ibv.RecvWR{ID: 31, SGL: sge(l.mrb, 64, 64)})
		send := func(id uint64) ibv.SendWR {
			return ibv.SendWR{ID: id, Opcode: ibv.WRSend, Flags: ibv.SendSignaled, SGL: sge(l.mra, 0, 8)}
		}
		err := l.a.PostSend([]ibv.SendWR{send(1), send(2), {ID: 3, Opcode: ibv.WRBindMW, Flags: ibv.SendSignaled}, send(4)})
		var pe *ibv.PostError
		if !errors.As(err, &pe) || pe.Index != 2 || !errors.Is(err, ibv.ErrNotSupported) {
			t.Fatalf("PostSend of SEND, SEND, BIND_MW, SEND = %v, want a PostError at 2 matching ErrNotSupported", err)
		}
		wcs := Poll(t, l.a.SendCQ(), 2)
		checkWC(t, wcs[0], 1, ibv.WCSuccess, ibv.WCSend)
		checkWC(t, wcs[1], 2, ibv.WCSuccess, ibv.WCSend)
		Poll(t, l.b.RecvCQ(), 2)
		PollNone(t, l.a.SendCQ(), quiet)
	})

	t.Run("events of closed objects", func(t *testing.T) {
		// An event whose QP or SRQ was closed before it was returned is
		// dropped: its owner has let go of the object.
		r := newSRQLimitRig(t)
		ctx, srq, a := r.ctx, r.srq, r.a
		r.sendFive(t)
		// SRQ_LIMIT_REACHED is raised now (TestSRQLimit), and Last WQE
		// Reached once a is in ERROR, except on rxe before 6.5.
		ToError(t, a)
		PollNone(t, a.RecvCQ(), quiet) // let the events reach the queue
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		if err := srq.Close(); err != nil {
			t.Fatal(err)
		}
		NoEvent(t, ctx, quiet)
	})

	t.Run("capabilities beyond the device's", func(t *testing.T) {
		// rxe_qp_chk_cap, rxe_cq_chk_attr and rxe_srq_chk_init refuse
		// them with EINVAL; ENOMEM (ErrResourceLimit) is for running out.
		ctx := Open(t)
		pd := NewPD(t, ctx)
		cq := NewCQ(t, ctx, 16)
		attr, err := ctx.QueryDevice()
		if err != nil {
			t.Fatal(err)
		}
		wr, sges := uint32(attr.MaxQPWR+1), uint32(attr.MaxSGE+1)
		for name, c := range map[string]ibv.QPCap{
			"send WRs":     {MaxSendWR: wr, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1},
			"receive WRs":  {MaxSendWR: 1, MaxRecvWR: wr, MaxSendSGE: 1, MaxRecvSGE: 1},
			"send SGEs":    {MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: sges, MaxRecvSGE: 1},
			"receive SGEs": {MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: sges},
		} {
			qp, err := pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: c, Type: ibv.QPTRC})
			if err == nil {
				Close(t, qp)
			}
			if !errors.Is(err, ibv.ErrInvalidArgument) {
				t.Errorf("CreateQP with %s beyond the device's (%+v) = %v, want ErrInvalidArgument", name, c, err)
			}
		}
		if c, err := ctx.CreateCQ(attr.MaxCQE+1, nil); !errors.Is(err, ibv.ErrInvalidArgument) {
			if err == nil {
				Close(t, c)
			}
			t.Errorf("CreateCQ(%d), max_cqe %d = %v, want ErrInvalidArgument", attr.MaxCQE+1, attr.MaxCQE, err)
		}
		if s, err := pd.CreateSRQ(ibv.SRQAttr{MaxWR: uint32(attr.MaxSRQWR + 1), MaxSGE: 1}); !errors.Is(err, ibv.ErrInvalidArgument) {
			if err == nil {
				Close(t, s)
			}
			t.Errorf("CreateSRQ of %d WRs, max_srq_wr %d = %v, want ErrInvalidArgument", attr.MaxSRQWR+1, attr.MaxSRQWR, err)
		}
	})
}

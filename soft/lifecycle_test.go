package soft_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/soft"
)

func TestDestroyRules(t *testing.T) {
	dev, err := soft.Open(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pd, _ := dev.AllocPD()
	ch, _ := dev.CreateCompChannel()
	cq, _ := dev.CreateCQ(4, ch)
	mr, _ := pd.RegMR(make([]byte, 8), ibv.AccessLocalWrite)
	srq, _ := pd.CreateSRQ(ibv.SRQAttr{MaxWR: 4, MaxSGE: 1})
	qp, err := pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, SRQ: srq, Type: ibv.QPTRC, Cap: ibv.QPCap{MaxSendWR: 1}})
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]closer{"device": dev, "PD": pd, "channel": ch, "CQ": cq, "SRQ": srq} {
		if err := c.Close(); !errors.Is(err, ibv.ErrBusy) {
			t.Errorf("closing the %s in use: %v, want ErrBusy", name, err)
		}
	}
	// Children first; each Close twice.
	for _, c := range []closer{qp, srq, mr, cq, ch, pd, dev} {
		for i := 0; i < 2; i++ {
			if err := c.Close(); err != nil {
				t.Fatalf("closing %T (time %d): %v", c, i+1, err)
			}
		}
	}
	// Use after close.
	uses := map[string]error{
		"PostSend":  qp.PostSend([]ibv.SendWR{{}}),
		"PostRecv":  srq.PostRecv([]ibv.RecvWR{{}}),
		"Modify":    qp.Modify(ibv.QPAttr{State: ibv.QPSErr}, ibv.QPAttrState),
		"ReqNotify": cq.ReqNotify(false),
	}
	_, uses["Poll"] = cq.Poll(make([]ibv.WC, 1))
	_, uses["AllocPD"] = dev.AllocPD()
	_, uses["RegMR"] = pd.RegMR(make([]byte, 8), 0)
	_, uses["NextAsyncEvent"] = dev.NextAsyncEvent(context.Background())
	_, uses["WaitCQ"] = ch.WaitCQ(context.Background())
	_, uses["QueryDevice"] = dev.QueryDevice()
	_, _, uses["Query"] = qp.Query(0)
	for name, err := range uses {
		if !errors.Is(err, ibv.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
}

func TestLimits(t *testing.T) {
	e := newEnv(t, soft.Config{Limits: soft.Limits{MaxQP: 1, MaxQPWR: 4, MaxSGE: 4, MaxCQ: 2, MaxCQE: 8, MaxSRQ: 1, MaxSRQWR: 4, MaxMR: 1, MaxPD: 1}})
	cq := e.cq(8)
	e.mr(8, 0)
	e.srq(4, 0)
	e.qp2(cq, ibv.QPCap{MaxSendWR: 4})
	_, errPD := e.dev.AllocPD()
	_, errMR := e.pd.RegMR(make([]byte, 8), 0)
	_, errSRQ := e.pd.CreateSRQ(ibv.SRQAttr{MaxWR: 1})
	_, errQP := e.pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: ibv.QPTRC})
	_, errCQE := e.dev.CreateCQ(9, nil)
	e.cq(1)
	_, errCQ := e.dev.CreateCQ(1, nil)
	for name, err := range map[string]error{"PD": errPD, "MR": errMR, "SRQ": errSRQ, "QP": errQP, "CQ": errCQ} {
		if !errors.Is(err, ibv.ErrResourceLimit) {
			t.Errorf("%s beyond its limit: %v, want ErrResourceLimit", name, err)
		}
	}
	if !errors.Is(errCQE, ibv.ErrInvalidArgument) {
		t.Errorf("CQ beyond max_cqe: %v, want ErrInvalidArgument (EINVAL, as rxe_cq_chk_attr)", errCQE)
	}
	e2 := newEnv(t, soft.Config{Name: "soft1", Limits: soft.Limits{MaxQPWR: 4, MaxSGE: 2, MaxSRQWR: 4}})
	cq2 := e2.cq(8)
	for name, c := range map[string]ibv.QPCap{"send WRs": {MaxSendWR: 5}, "recv WRs": {MaxRecvWR: 5}, "SGEs": {MaxSendSGE: 3}} {
		if _, err := e2.pd.CreateQP(ibv.QPInitAttr{SendCQ: cq2, RecvCQ: cq2, Type: ibv.QPTRC, Cap: c}); !errors.Is(err, ibv.ErrInvalidArgument) {
			t.Errorf("QP with too many %s: %v, want ErrInvalidArgument (EINVAL, as rxe_qp_chk_cap)", name, err)
		}
	}
	if _, err := e2.pd.CreateSRQ(ibv.SRQAttr{MaxWR: 5}); !errors.Is(err, ibv.ErrInvalidArgument) {
		t.Errorf("SRQ beyond max_srq_wr: %v", err)
	}
	if _, err := e2.pd.CreateQP(ibv.QPInitAttr{SendCQ: cq2, RecvCQ: cq2, Type: ibv.QPTUD}); !errors.Is(err, ibv.ErrNotSupported) {
		t.Errorf("UD QP: %v, want ErrNotSupported", err)
	}
}

// qp2 creates a QP with the given capabilities.
func (e *env) qp2(cq ibv.CQ, c ibv.QPCap) *soft.QP {
	e.t.Helper()
	q, err := e.pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: ibv.QPTRC, Cap: c})
	if err != nil {
		e.t.Fatalf("CreateQP: %v", err)
	}
	e.closeLater(q)
	return q.(*soft.QP)
}

func TestQueueFullPostError(t *testing.T) {
	e := newEnv(t, soft.Config{})
	cq := e.cq(16)
	a, b := e.qp2(cq, ibv.QPCap{MaxSendWR: 2, MaxRecvWR: 1, MaxSendSGE: 1}), e.qp2(cq, ibv.QPCap{MaxSendWR: 2, MaxRecvWR: 1})
	connect(t, a, b, 1)
	// Sends wait for receives (RNR), so they stay in the 2-deep queue.
	err := a.PostSend([]ibv.SendWR{{ID: 1}, {ID: 2}, {ID: 3}})
	var pe *ibv.PostError
	if !errors.As(err, &pe) || pe.Index != 2 || !errors.Is(err, ibv.ErrQueueFull) {
		t.Errorf("third send into a 2-deep queue: %v, want PostError at 2 wrapping ErrQueueFull", err)
	}
	err = a.PostSend([]ibv.SendWR{{ID: 4, SGL: make([]ibv.SGE, 2)}})
	if !errors.As(err, &pe) || pe.Index != 0 || !errors.Is(err, ibv.ErrInvalidArgument) {
		t.Errorf("two SGEs into a 1-SGE QP: %v", err)
	}
	err = a.PostRecv([]ibv.RecvWR{{ID: 5}, {ID: 6}})
	if !errors.As(err, &pe) || pe.Index != 1 || !errors.Is(err, ibv.ErrQueueFull) {
		t.Errorf("second receive into a 1-deep queue: %v", err)
	}
}

func TestAsyncEvents(t *testing.T) {
	dev, err := soft.Open(soft.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	if _, err := dev.NextAsyncEvent(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("NextAsyncEvent with no event: %v, want the context's error", err)
	}
	// A waiter blocked in NextAsyncEvent is woken by Close.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := dev.NextAsyncEvent(context.Background()); !errors.Is(err, ibv.ErrClosed) {
			t.Errorf("NextAsyncEvent across Close: %v, want ErrClosed", err)
		}
	}()
	time.Sleep(time.Millisecond)
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

func TestCompChannel(t *testing.T) {
	e := newEnv(t, soft.Config{})
	ch, err := e.dev.CreateCompChannel()
	if err != nil {
		t.Fatal(err)
	}
	e.closeLater(ch)
	cq, err := e.dev.CreateCQ(16, ch)
	if err != nil {
		t.Fatal(err)
	}
	e.closeLater(cq)
	b := e.qp(e.cq(16), nil)
	a := e.qp(cq, nil)
	connect(t, a, b, 1)
	wait := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		defer cancel()
		got, err := ch.WaitCQ(ctx)
		if err == nil && got != cq {
			t.Errorf("WaitCQ returned another CQ")
		}
		return err
	}
	sig := ibv.SendWR{Opcode: ibv.WRRDMAWrite, Flags: ibv.SendSignaled}
	post(t, a, sig)
	if err := wait(); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitCQ on an unarmed CQ: %v, want a timeout", err)
	}
	if err := cq.ReqNotify(false); err != nil {
		t.Fatal(err)
	}
	post(t, a, sig, sig)
	if err := wait(); err != nil {
		t.Errorf("WaitCQ after ReqNotify: %v", err)
	}
	if err := wait(); err == nil {
		t.Error("one arming signalled twice")
	} else if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitCQ after the arming was spent: %v, want a timeout", err)
	}
	// Solicited only: a plain receive does not signal, a solicited one does.
	postRecv(t, a, ibv.RecvWR{ID: 1}, ibv.RecvWR{ID: 2})
	if err := cq.ReqNotify(true); err != nil {
		t.Fatal(err)
	}
	post(t, b, ibv.SendWR{Opcode: ibv.WRSend})
	if err := wait(); err == nil {
		t.Error("an unsolicited receive signalled a solicited-only CQ")
	} else if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitCQ after an unsolicited receive: %v, want a timeout", err)
	}
	post(t, b, ibv.SendWR{Opcode: ibv.WRSend, Flags: ibv.SendSolicited})
	if err := wait(); err != nil {
		t.Errorf("solicited receive: %v", err)
	}
}

func TestProgress(t *testing.T) {
	fab := soft.NewFabric()
	fab.SetAutoProgress(false)
	e := newEnv(t, soft.Config{Fabric: fab})
	cq := e.cq(64) // both pairs complete into one CQ, so it shows the global order
	a1, b1, a2, b2 := e.qp(cq, nil), e.qp(cq, nil), e.qp(cq, nil), e.qp(cq, nil)
	connect(t, a1, b1, 1)
	connect(t, a2, b2, 1)
	w := func(id uint64) ibv.SendWR {
		return ibv.SendWR{ID: id, Opcode: ibv.WRRDMAWrite, Flags: ibv.SendSignaled}
	}
	post(t, a1, w(1))
	post(t, a2, w(2))
	post(t, a1, w(3), ibv.SendWR{ID: 4, Opcode: ibv.WRSend, Flags: ibv.SendSignaled}) // 4 waits for a receive
	post(t, a2, w(5))
	wantWCs(t, cq)
	if n := fab.Progress(2); n != 2 {
		t.Errorf("Progress(2) = %d", n)
	}
	wc := func(id uint64, q ibv.QP) ibv.WC { return ibv.WC{ID: id, Opcode: ibv.WCRDMAWrite, QPNum: q.Num()} }
	wantWCs(t, cq, wc(1, a1), wc(2, a2))
	if n := fab.Progress(0); n != 2 {
		t.Errorf("Progress(0) = %d, want 2 (WR 4 waits for a receive)", n)
	}
	wantWCs(t, cq, wc(3, a1), wc(5, a2))
	postRecv(t, b1, ibv.RecvWR{ID: 9})
	wantWCs(t, cq) // nothing runs without Progress
	fab.SetAutoProgress(true)
	wantWCs(t, cq, ibv.WC{ID: 9, Opcode: ibv.WCRecv, QPNum: b1.Num(), SrcQP: a1.Num(), SLID: 1},
		ibv.WC{ID: 4, Opcode: ibv.WCSend, QPNum: a1.Num()})
}

// Sends waiting in SQD when auto-progress is turned off are executed by
// Progress once the QP is back in RTS.
func TestAutoProgressOffWithWaitingSends(t *testing.T) {
	fab := soft.NewFabric()
	e := newEnv(t, soft.Config{Fabric: fab})
	p := newPair(t, e, e)
	toState(t, p.a, ibv.QPSSQD)
	post(t, p.a, ibv.SendWR{ID: 1, Opcode: ibv.WRRDMAWrite, Flags: ibv.SendSignaled})
	fab.SetAutoProgress(false)
	toState(t, p.a, ibv.QPSRTS)
	wantWCs(t, p.cqa)
	if n := fab.Progress(0); n != 1 {
		t.Errorf("Progress = %d, want 1", n)
	}
	wantWCs(t, p.cqa, ibv.WC{ID: 1, Opcode: ibv.WCRDMAWrite, QPNum: p.a.Num()})
}

// Concurrent callers on one fabric: run under -race.
func TestConcurrent(t *testing.T) {
	fab := soft.NewFabric()
	x := newEnv(t, soft.Config{Name: "x", Fabric: fab})
	y := newEnv(t, soft.Config{Name: "y", Fabric: fab})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		p := newPair(t, x, y)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				if err := p.b.PostRecv([]ibv.RecvWR{{ID: uint64(i), SGL: sge(p.mb, 0, 8)}}); err != nil {
					t.Error(err)
					return
				}
				if err := p.a.PostSend([]ibv.SendWR{{ID: uint64(i), Opcode: ibv.WRSend, Flags: ibv.SendSignaled, SGL: sge(p.ma, 0, 8)}}); err != nil {
					t.Error(err)
					return
				}
				wcs := make([]ibv.WC, 2)
				na, errA := p.cqa.Poll(wcs)
				nb, errB := p.cqb.Poll(wcs)
				if na != 1 || nb != 1 || errA != nil || errB != nil {
					t.Errorf("polled %d, %d completions (%v, %v), want 1 each", na, nb, errA, errB)
					return
				}
			}
		}()
	}
	wg.Wait()
}

package soft_test

import (
	"context"
	"fmt"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/soft"
)

// Two devices on one fabric, a connected pair of RC QPs, one SEND.
func Example() {
	fab := soft.NewFabric()
	x, _ := soft.Open(soft.Config{Name: "x", Fabric: fab})
	y, _ := soft.Open(soft.Config{Name: "y", Fabric: fab})
	defer y.Close()
	defer x.Close()
	px, _ := x.AllocPD()
	py, _ := y.AllocPD()
	defer py.Close()
	defer px.Close()
	cqx, _ := x.CreateCQ(8, nil)
	cqy, _ := y.CreateCQ(8, nil)
	defer cqy.Close()
	defer cqx.Close()
	buf, _ := px.RegMR([]byte("hello"), ibv.AccessLocalWrite)
	defer buf.Close()
	into, _ := py.RegMR(make([]byte, 16), ibv.AccessLocalWrite)
	defer into.Close()
	caps := ibv.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}
	a, _ := px.CreateQP(ibv.QPInitAttr{SendCQ: cqx, RecvCQ: cqx, Type: ibv.QPTRC, Cap: caps})
	b, _ := py.CreateQP(ibv.QPInitAttr{SendCQ: cqy, RecvCQ: cqy, Type: ibv.QPTRC, Cap: caps})
	defer b.Close()
	defer a.Close()
	if err := soft.Connect(a, b, 1); err != nil {
		fmt.Println(err)
		return
	}
	b.PostRecv([]ibv.RecvWR{{ID: 2, SGL: []ibv.SGE{{Addr: into.Addr(), Length: 16, LKey: into.LKey()}}}})
	a.PostSend([]ibv.SendWR{{ID: 1, Opcode: ibv.WRSend, Flags: ibv.SendSignaled,
		SGL: []ibv.SGE{{Addr: buf.Addr(), Length: 5, LKey: buf.LKey()}}}})
	wcs := make([]ibv.WC, 1)
	cqx.Poll(wcs)
	fmt.Println(wcs[0])
	cqy.Poll(wcs)
	fmt.Println(wcs[0], string(into.Buf()[:wcs[0].ByteLen]))
	// Output:
	// wr_id=1 qpn=17 status=SUCCESS opcode=SEND byte_len=5
	// wr_id=2 qpn=17 status=SUCCESS opcode=RECV byte_len=5 hello
}

// A provider that never raises Last WQE Reached (cxgb4 before 2025), and
// what a drain sees: the QP reaches ERROR and flushes, but no event comes.
func ExampleQuirks() {
	dev, _ := soft.Open(soft.Config{Quirks: soft.Quirks{NoLastWQEReached: true}})
	defer dev.Close()
	pd, _ := dev.AllocPD()
	defer pd.Close()
	cq, _ := dev.CreateCQ(8, nil)
	defer cq.Close()
	srq, _ := pd.CreateSRQ(ibv.SRQAttr{MaxWR: 4, MaxSGE: 1})
	defer srq.Close()
	qp, _ := pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, SRQ: srq, Type: ibv.QPTRC, Cap: ibv.QPCap{MaxSendWR: 4}})
	defer qp.Close()
	qp.Modify(ibv.QPAttr{State: ibv.QPSErr}, ibv.QPAttrState)
	qp.PostSend([]ibv.SendWR{{ID: 99}}) // the drain WR
	wcs := make([]ibv.WC, 1)
	n, _ := cq.Poll(wcs)
	fmt.Println(n, wcs[0].Status)
	ctx, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	_, err := dev.NextAsyncEvent(ctx)
	fmt.Println(err)
	// Output:
	// 1 WR_FLUSH_ERR
	// context deadline exceeded
}

// An adversarial schedule: the flushes of a QP moved to ERROR come over
// later calls, and Outstanding says how many are still to come.
func ExampleSchedule() {
	dev, _ := soft.Open(soft.Config{Schedule: soft.Schedule{Seed: 7}})
	defer dev.Close()
	pd, _ := dev.AllocPD()
	defer pd.Close()
	cq, _ := dev.CreateCQ(8, nil)
	defer cq.Close()
	caps := ibv.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}
	a, _ := pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: ibv.QPTRC, Cap: caps})
	b, _ := pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: ibv.QPTRC, Cap: caps})
	defer b.Close()
	defer a.Close()
	if err := soft.Connect(a, b, 1); err != nil {
		fmt.Println(err)
		return
	}
	a.PostRecv([]ibv.RecvWR{{ID: 1}, {ID: 2}, {ID: 3}, {ID: 4}})
	a.Modify(ibv.QPAttr{State: ibv.QPSErr}, ibv.QPAttrState)
	fmt.Println("outstanding after the move to ERROR:", a.(*soft.QP).Outstanding())
	wc := make([]ibv.WC, 4)
	for a.(*soft.QP).Outstanding() > 0 {
		n, _ := cq.Poll(wc)
		fmt.Println("polled", n, "flushes,", a.(*soft.QP).Outstanding(), "to come")
	}
	// Output:
	// outstanding after the move to ERROR: 4
	// polled 2 flushes, 2 to come
	// polled 2 flushes, 0 to come
}

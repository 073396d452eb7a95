package rcsetup_test

import (
	"fmt"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/rcsetup"
	"github.com/qpdrain/qpdrain/soft"
	"github.com/qpdrain/qpdrain/teardown"
)

// Two RC QPs of one device connected in loopback, one SEND between them;
// the same code runs on a libibverbs device (ibv.Open("rxe0")).
func Example() {
	var objs teardown.List
	defer objs.Close()
	dev, err := soft.Open(soft.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	objs.Add(dev)
	pd, _ := dev.AllocPD()
	objs.Add(pd)
	cq, _ := dev.CreateCQ(8, nil)
	objs.Add(cq)
	buf, _ := ibv.AllocBuffer(4096)
	defer ibv.FreeBuffer(buf)
	copy(buf, "hello")
	mr, _ := pd.RegMR(buf, rcsetup.AllAccess)
	objs.Add(mr)
	caps := ibv.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}
	a, _ := pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: ibv.QPTRC, Cap: caps})
	objs.Add(a)
	b, _ := pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: ibv.QPTRC, Cap: caps})
	objs.Add(b)

	route, err := rcsetup.Loopback(dev, 1)
	if err == nil {
		err = route.Connect(a, b)
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	b.PostRecv([]ibv.RecvWR{{ID: 2, SGL: []ibv.SGE{{Addr: mr.Addr() + 64, Length: 64, LKey: mr.LKey()}}}})
	a.PostSend([]ibv.SendWR{{ID: 1, Opcode: ibv.WRSend, Flags: ibv.SendSignaled,
		SGL: []ibv.SGE{{Addr: mr.Addr(), Length: 5, LKey: mr.LKey()}}}})
	wcs := make([]ibv.WC, 2)
	n, _ := cq.Poll(wcs)
	for _, wc := range wcs[:n] {
		fmt.Println(wc.ID, wc.Status, wc.Opcode)
	}
	fmt.Println(string(buf[64:69]))
	// Output:
	// 2 SUCCESS RECV
	// 1 SUCCESS SEND
	// hello
}

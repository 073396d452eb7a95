package drain_test

import (
	"context"
	"fmt"
	"time"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/rcsetup"
	"github.com/qpdrain/qpdrain/soft"
	"github.com/qpdrain/qpdrain/teardown"
)

// Drain one SRQ-attached QP whose CQ the caller owns: drain.QP moves it to
// ERROR, waits for Last WQE Reached (reading the device's events), posts the
// drain WR and polls the CQ until the WR's flush completion comes back.
func Example() {
	dev, cq, qps, closeAll := exampleSetup(1)
	defer closeAll()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rep, err := drain.QP(ctx, qps[0], drain.Options{}, drain.Feed{Events: dev})
	if err != nil {
		fmt.Println("not safe to destroy:", err)
		return
	}
	for _, s := range rep.Steps {
		// A drain WR's ID is WRIDTag and its number among all the drain
		// WRs of the process: print the tag alone.
		s.WRID &= drain.WRIDMask
		fmt.Println(s)
	}
	fmt.Println("cq still usable:", cq.CQE() > 0)
	// Output:
	// state RTS -> ERR
	// event QP_LAST_WQE_REACHED
	// drain WR 0xd7a1000000000000 posted on qpn 17 for a batch of 1
	// drain WR 0xd7a1000000000000 on qpn 17 completed status=WR_FLUSH_ERR
	// safe
	// cq still usable: true
}

// A caller that polls its own CQ hands every completion and every async
// event to the reaper, which claims only its own. The QPs post no sends
// (IPoIB-CM's receive QPs): only their SRQ side is open, so they share
// barrier drain WRs, one outstanding at a time.
func ExampleReaper() {
	dev, cq, qps, closeAll := exampleSetup(4)
	defer closeAll()

	reaper := drain.NewReaper(cq, drain.Options{})
	var handles []*drain.Handle
	for _, qp := range qps {
		h, err := reaper.Add(qp, drain.AddOptions{NoSends: true})
		if err != nil {
			fmt.Println(err)
			return
		}
		handles = append(handles, h)
	}

	// The caller's event loop and poll loop, reduced to what the example
	// needs: four Last WQE Reached events, then the CQ until it is empty.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range qps {
		ev, err := dev.NextAsyncEvent(ctx)
		if err != nil {
			fmt.Println(err)
			return
		}
		if !reaper.HandleEvent(ev) {
			fmt.Println("caller's event:", ev)
		}
	}
	wcs := make([]ibv.WC, 16)
	for reaper.Stats().Pending > 0 {
		n, err := cq.Poll(wcs)
		if err != nil {
			fmt.Println(err)
			return
		}
		if n == 0 {
			reaper.CQEmpty()
		}
		for _, wc := range wcs[:n] {
			if !reaper.HandleWC(wc) {
				fmt.Println("caller's completion:", wc)
			}
		}
	}

	for _, h := range handles {
		rep, err := h.Wait(ctx)
		fmt.Printf("qpn %d: %s, batch of %d, err %v\n", rep.QPNum, rep.Outcome, rep.Batch, err)
		// Safe: h.Destroy() may run now.
	}
	fmt.Println("drain WRs:", reaper.Stats().DrainWRs)
	// Output:
	// qpn 17: safe, batch of 1, err <nil>
	// qpn 19: safe, batch of 3, err <nil>
	// qpn 21: safe, batch of 3, err <nil>
	// qpn 23: safe, batch of 3, err <nil>
	// drain WRs: 2
}

// exampleSetup opens a soft device with n SRQ-attached RC QPs on one CQ,
// each connected to a peer in loopback and in RTS (rcsetup), and returns a
// function closing it all, children first (teardown).
func exampleSetup(n int) (*soft.Device, ibv.CQ, []ibv.QP, func()) {
	var objs teardown.List
	closeAll := func() {
		if err := objs.Close(); err != nil {
			panic(err)
		}
	}
	dev := must(soft.Open(soft.Config{}))
	objs.Add(dev)
	pd := must(dev.AllocPD())
	objs.Add(pd)
	cq := must(dev.CreateCQ(256, nil))
	objs.Add(cq)
	srq := must(pd.CreateSRQ(ibv.SRQAttr{MaxWR: 64, MaxSGE: 1}))
	objs.Add(srq)
	route := must(rcsetup.Loopback(dev, 1))
	var qps []ibv.QP
	for range n {
		qp := must(pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, SRQ: srq, Cap: qpCap, Type: ibv.QPTRC}))
		objs.Add(qp)
		peer := must(pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: qpCap, Type: ibv.QPTRC}))
		objs.Add(peer)
		if err := route.Connect(qp, peer); err != nil {
			panic(err)
		}
		qps = append(qps, qp)
	}
	return dev, cq, qps, closeAll
}

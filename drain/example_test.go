package drain_test

import (
	"context"
	"fmt"
	"time"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/soft"
)

// Drain one SRQ-attached QP whose CQ the caller owns: drain.QP moves it to
// ERROR, waits for Last WQE Reached (reading the device's events), posts the
// drain WR and polls the CQ until the WR's flush completion comes back.
func Example() {
	dev, cq, qps, closeAll := exampleSetup(1)
	defer closeAll()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rep, err := drain.QP(ctx, qps[0], drain.Options{Events: dev})
	if err != nil {
		fmt.Println("not safe to destroy:", err)
		return
	}
	for _, s := range rep.Steps {
		fmt.Println(s)
	}
	fmt.Println("cq still usable:", cq.CQE() > 0)
	// Output:
	// state RTS -> ERR
	// event QP_LAST_WQE_REACHED
	// drain WR 0xd7a1000000000001 posted on qpn 0x11 for a batch of 1
	// drain WR 0xd7a1000000000001 on qpn 0x11 completed status=WR_FLUSH_ERR
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
		fmt.Printf("qpn %#x: %s, batch of %d, err %v\n", rep.QPNum, rep.Outcome, rep.Batch, err)
		// Safe: h.QP().Close() may run now.
	}
	fmt.Println("drain WRs:", reaper.Stats().DrainWRs)
	// Output:
	// qpn 0x11: safe, batch of 1, err <nil>
	// qpn 0x13: safe, batch of 3, err <nil>
	// qpn 0x15: safe, batch of 3, err <nil>
	// qpn 0x17: safe, batch of 3, err <nil>
	// drain WRs: 2
}

// exampleSetup opens a soft device with n SRQ-attached RC QPs on one CQ,
// each connected to a peer and in RTS, and returns a function closing it
// all, children first.
func exampleSetup(n int) (*soft.Device, ibv.CQ, []ibv.QP, func()) {
	var closers []func() error
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			if err := closers[i](); err != nil {
				panic(err)
			}
		}
	}
	dev := must(soft.Open(soft.Config{}))
	closers = append(closers, dev.Close)
	pd := must(dev.AllocPD())
	closers = append(closers, pd.Close)
	cq := must(dev.CreateCQ(256, nil))
	closers = append(closers, cq.Close)
	srq := must(pd.CreateSRQ(ibv.SRQAttr{MaxWR: 64, MaxSGE: 1}))
	closers = append(closers, srq.Close)
	var qps []ibv.QP
	for range n {
		qp := must(pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, SRQ: srq, Cap: qpCap, Type: ibv.QPTRC}))
		closers = append(closers, qp.Close)
		peer := must(pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: qpCap, Type: ibv.QPTRC}))
		closers = append(closers, peer.Close)
		for _, p := range [][2]ibv.QP{{qp, peer}, {peer, qp}} {
			exampleConnect(dev, p[0], p[1])
		}
		qps = append(qps, qp)
	}
	return dev, cq, qps, closeAll
}

// exampleConnect moves qp through INIT and RTR to RTS, towards peer.
func exampleConnect(dev *soft.Device, qp, peer ibv.QP) {
	for _, s := range []struct {
		attr ibv.QPAttr
		mask ibv.QPAttrMask
	}{
		{ibv.QPAttr{State: ibv.QPSInit, PortNum: 1},
			ibv.QPAttrState | ibv.QPAttrPKeyIndex | ibv.QPAttrPort | ibv.QPAttrAccessFlags},
		{ibv.QPAttr{State: ibv.QPSRTR, PathMTU: ibv.MTU1024, DestQPNum: peer.Num(), MaxDestRdAtomic: 1, MinRNRTimer: 12,
			AH: ibv.AHAttr{DLID: dev.LID(), PortNum: 1}},
			ibv.QPAttrState | ibv.QPAttrAV | ibv.QPAttrPathMTU | ibv.QPAttrDestQPN | ibv.QPAttrRQPSN | ibv.QPAttrMaxDestRdAtomic | ibv.QPAttrMinRNRTimer},
		{ibv.QPAttr{State: ibv.QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1},
			ibv.QPAttrState | ibv.QPAttrTimeout | ibv.QPAttrRetryCnt | ibv.QPAttrRNRRetry | ibv.QPAttrSQPSN | ibv.QPAttrMaxQPRdAtomic},
	} {
		if err := qp.Modify(s.attr, s.mask); err != nil {
			panic(err)
		}
	}
}

package drain_test

import (
	"context"
	"fmt"
	"log"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/rcsetup"
	"github.com/qpdrain/qpdrain/soft"
)

// Drain three receive QPs of an SRQ (IPoIB-CM's, which post no sends) that
// complete into one CQ, on the soft device. DrainAll moves each to ERROR,
// waits for its Last WQE Reached (reading the device's events), posts one
// barrier drain WR and polls the CQ until its completion proves every QP
// finished: the QPs may then be destroyed.
func ExampleDrainAll() {
	check := func(err error) {
		if err != nil {
			log.Fatal(err)
		}
	}
	dev, err := soft.Open(soft.Config{})
	check(err)
	defer dev.Close()
	pd, err := dev.AllocPD()
	check(err)
	defer pd.Close()
	cq, err := dev.CreateCQ(64, nil)
	check(err)
	defer cq.Close()
	srq, err := pd.CreateSRQ(ibv.SRQAttr{MaxWR: 16, MaxSGE: 1})
	check(err)
	defer srq.Close()
	route, err := rcsetup.Loopback(dev, 1)
	check(err)
	caps := ibv.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}
	var qps []ibv.QP
	for range 3 {
		qp, err := pd.CreateQP(ibv.QPInitAttr{Type: ibv.QPTRC, SendCQ: cq, RecvCQ: cq, SRQ: srq, Cap: caps})
		check(err)
		peer, err := pd.CreateQP(ibv.QPInitAttr{Type: ibv.QPTRC, SendCQ: cq, RecvCQ: cq, Cap: caps})
		check(err)
		defer qp.Close()
		defer peer.Close()
		check(route.Connect(qp, peer))
		qps = append(qps, qp)
	}
	// Every wait of the drain is bounded (Options' timeouts): no deadline
	// is needed for it to end.
	reps, err := drain.DrainAll(context.Background(), qps, drain.AddOptions{NoSends: true}, drain.Options{}, drain.Feed{Events: dev})
	for _, rep := range reps {
		fmt.Printf("qpn %d: %s by %s\n", rep.QPNum, rep.Outcome, rep.Recv.By)
	}
	fmt.Println("every QP may be destroyed:", err == nil)
	// Output:
	// qpn 17: safe by Last WQE Reached and a barrier drain WR
	// qpn 19: safe by Last WQE Reached and a barrier drain WR
	// qpn 21: safe by Last WQE Reached and a barrier drain WR
	// every QP may be destroyed: true
}

// A caller with a poll loop of its own keeps it, and hands every
// completion and every async event to a Reaper, which claims only its
// own: the caller keeps the others, flushed completions included. Here
// the loop destroys each QP through its handle as its drain ends. The
// setup is ExampleDrainAll's, one QP with its own receive queue and one
// receive outstanding.
func ExampleReaper() {
	check := func(err error) {
		if err != nil {
			log.Fatal(err)
		}
	}
	dev, err := soft.Open(soft.Config{})
	check(err)
	defer dev.Close()
	pd, err := dev.AllocPD()
	check(err)
	defer pd.Close()
	cq, err := dev.CreateCQ(64, nil)
	check(err)
	defer cq.Close()
	route, err := rcsetup.Loopback(dev, 1)
	check(err)
	caps := ibv.QPCap{MaxSendWR: 1, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}
	qp, err := pd.CreateQP(ibv.QPInitAttr{Type: ibv.QPTRC, SendCQ: cq, RecvCQ: cq, Cap: caps})
	check(err)
	peer, err := pd.CreateQP(ibv.QPInitAttr{Type: ibv.QPTRC, SendCQ: cq, RecvCQ: cq, Cap: caps})
	check(err)
	defer peer.Close()
	check(route.Connect(qp, peer))
	check(qp.PostRecv([]ibv.RecvWR{{ID: 7}}))

	reaper, err := drain.NewReaper(cq, drain.Options{Headroom: 2})
	check(err)
	h, err := reaper.Add(qp, drain.AddOptions{})
	check(err)
	wcs := make([]ibv.WC, 16)
	for done := false; !done; {
		n, err := cq.Poll(wcs)
		check(err)
		if n == 0 {
			reaper.CQEmpty()
		}
		for _, wc := range wcs[:n] {
			if !reaper.HandleWC(wc) {
				fmt.Printf("caller's completion: wr_id %d %s\n", wc.ID, wc.Status)
			}
		}
		select {
		case <-h.Done():
			done = true
		default:
		}
	}
	rep := h.Report()
	fmt.Printf("qpn %d: %s\n  receive queue: %s\n  send queue: %s\n", rep.QPNum, rep.Outcome, rep.Recv.By, rep.Send.By)
	check(h.Destroy())
	// Output:
	// caller's completion: wr_id 7 WR_FLUSH_ERR
	// qpn 17: safe
	//   receive queue: receive drain WR
	//   send queue: drain WR on its own send queue
}

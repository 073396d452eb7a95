package ipoibcm_test

import (
	"context"
	"fmt"
	"time"

	"github.com/qpdrain/qpdrain/clock"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/ipoibcm"
	"github.com/qpdrain/qpdrain/rcsetup"
	"github.com/qpdrain/qpdrain/soft"
)

// A connection's life on a soft device, on a virtual clock: accepted, its
// peer disconnects, Last WQE Reached, one drain WR, reaped.
func ExampleManager() {
	dev, _ := soft.Open(soft.Config{})
	defer dev.Close()
	pd, _ := dev.AllocPD()
	defer pd.Close()
	peerCQ, _ := dev.CreateCQ(16, nil)
	defer peerCQ.Close()
	route, _ := rcsetup.Loopback(dev, 1)

	clock := clock.NewVirtual(time.Date(2008, 4, 1, 0, 0, 0, 0, time.UTC))
	m, err := ipoibcm.New(ipoibcm.Config{Context: dev, PD: pd, Clock: clock, RecvQueueSize: 8,
		Trace: func(e ipoibcm.Event) { fmt.Printf("%-16s -> %s\n", e.Kind, e.List) }})
	if err != nil {
		fmt.Println(err)
		return
	}
	peer, _ := pd.CreateQP(ibv.QPInitAttr{SendCQ: peerCQ, RecvCQ: peerCQ, Type: ibv.QPTRC,
		Cap: ibv.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	defer peer.Close()
	c, _ := m.Accept(peer.Num(), route)
	_ = route.Bring(peer, c.QPNum(), ibv.QPSRTS)

	_ = m.Disconnect(c) // DREQ: the QP goes to ERROR
	_ = m.Service()     // Last WQE Reached, the drain WR, its completion, the reap
	s := m.Snapshot()
	fmt.Println("QPs held:", s.QPs)
	_, _ = m.Stop(context.Background())
	// Output:
	// accepted         -> passive_ids
	// disconnect       -> passive_ids
	// last-wqe-reached -> rx_flush_list
	// drain-posted     -> rx_drain_list
	// drained          -> rx_reap_list
	// reaped           -> none
	// QPs held: 0
}

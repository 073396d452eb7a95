package cm_test

import (
	"context"
	"fmt"
	"log"
	"net/netip"
	"time"

	"github.com/qpdrain/qpdrain/cm"
	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/soft"
	"github.com/qpdrain/qpdrain/softcm"
)

// Tear a connection down as applications do (rping, SPDK, Ceph), then
// drain each side's QP with drain.DrainAll before destroying it: the
// client's Disconnect moves its QP to ERROR (SQD on iWARP); the server
// gets DISCONNECTED and disconnects in turn, which moves its own.
//
// Each side counts what its QP still owes it, the completions it has not
// polled: the client its two receives and the two sends it made to the
// server, the server the two receives those sends filled. A count proves
// a queue with no drain WR, which siw never completes on a user QP in
// ERROR (flushcheck's drain-wr probe; docs/PROVIDERS.md); a provider that
// completes drain WRs needs no count (drain.AddOptions without them).
// The CM moved the QP to ERROR before the drain, so its flushes are in
// the CQ already: each side states its QP the only one ever on its CQ
// (SoleQP, true of a CQ per connection), else the drain could not tell
// them from an earlier QP's with the same number and would not trust the
// counts. DrainAll hands every completion to the caller (Feed.OnWC) and
// calls a QP safe once its counts are back. The QP is then destroyed,
// through its ID (rdma_destroy_qp), and the ID after it.
func Example_drain() {
	check := func(err error) {
		if err != nil {
			log.Fatal(err)
		}
	}
	fab := soft.NewFabric()
	x, err := soft.Open(soft.Config{Name: "x", Fabric: fab})
	check(err)
	defer x.Close()
	y, err := soft.Open(soft.Config{Name: "y", Fabric: fab})
	check(err)
	defer y.Close()
	net := softcm.NewNetwork()
	check(net.Attach(x, netip.MustParseAddr("10.0.0.1")))
	check(net.Attach(y, netip.MustParseAddr("10.0.0.2")))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	listener, err := net.CreateID(cm.PSTCP)
	check(err)
	defer listener.Close()
	check(listener.Listen(netip.MustParseAddrPort("10.0.0.2:7471"), 1))
	type side struct {
		id cm.ID
		ep *endpoint
	}
	accepted := make(chan side, 1)
	go func() {
		id, err := listener.GetRequest(ctx)
		check(err)
		ep, err := newEndpoint(id)
		check(err)
		check(ep.qp.PostRecv([]ibv.RecvWR{{ID: 100}, {ID: 101}})) // zero-length receives
		check(id.Accept(ctx, cm.ConnParam{}))
		accepted <- side{id, ep}
	}()
	clientID, err := net.CreateID(cm.PSTCP)
	check(err)
	check(clientID.ResolveAddr(ctx, netip.MustParseAddr("10.0.0.1"), netip.MustParseAddrPort("10.0.0.2:7471")))
	check(clientID.ResolveRoute(ctx))
	c, err := newEndpoint(clientID)
	check(err)
	check(c.qp.PostRecv([]ibv.RecvWR{{ID: 200}, {ID: 201}}))
	check(clientID.Connect(ctx, cm.ConnParam{}))
	client, server := side{clientID, c}, <-accepted
	// Two signaled zero-length SENDs, whose completions nobody polls.
	check(c.qp.PostSend([]ibv.SendWR{{ID: 1, Opcode: ibv.WRSend, Flags: ibv.SendSignaled},
		{ID: 2, Opcode: ibv.WRSend, Flags: ibv.SendSignaled}}))

	check(client.id.Disconnect()) // rdma_disconnect: the client's QP is in ERROR (iWARP: SQD)
	e, err := server.id.NextEvent(ctx)
	check(err)
	fmt.Println("server:", e)
	check(server.id.Disconnect()) // the answer: the server's QP is in ERROR (iWARP: SQD)
	e, err = client.id.NextEvent(ctx)
	check(err)
	fmt.Println("client:", e)

	// The wr_ids tell the queues apart: receives from 100, sends below.
	o := drain.Options{Queue: func(wc ibv.WC) report.Queue {
		if wc.ID >= 100 {
			return report.QueueRecv
		}
		return report.QueueSend
	}}
	for _, s := range []struct {
		name  string
		sends int
		side
	}{{"client", 2, client}, {"server", 0, server}} {
		// Let DrainAll query the state and move the QP to ERROR: the CM
		// left it in ERROR on IB and RoCE (librdmacm's rdma_disconnect)
		// but in SQD on iWARP.
		add := drain.AddOptions{CountRecvs: true, Recvs: 2, CountSends: true, Sends: s.sends, SoleQP: true}
		f := drain.Feed{OnWC: func(wc ibv.WC) { fmt.Printf("%s: wr_id %d %s\n", s.name, wc.ID, wc.Status) }}
		reps, err := drain.DrainAll(ctx, []ibv.QP{s.ep.qp}, add, o, f)
		rep := reps[0]
		fmt.Printf("%s: qpn %d %s (%v)\n  receive queue: %s\n  send queue: %s\n", s.name, rep.QPNum, rep.Outcome, err, rep.Recv, rep.Send)
		s.ep.close() // rdma_destroy_qp, then the CQ and the PD
		fmt.Printf("%s: ID closed: %v\n", s.name, s.id.Close())
	}
	// Output:
	// server: RDMA_CM_EVENT_DISCONNECTED
	// client: RDMA_CM_EVENT_DISCONNECTED
	// client: wr_id 1 SUCCESS
	// client: wr_id 2 SUCCESS
	// client: wr_id 200 WR_FLUSH_ERR
	// client: wr_id 201 WR_FLUSH_ERR
	// client: qpn 17 safe (<nil>)
	//   receive queue: 2 receives counted back (the only QP on its CQ, stated by the caller)
	//   send queue: 2 sends counted back (the only QP on its CQ, stated by the caller)
	// client: ID closed: <nil>
	// server: wr_id 100 SUCCESS
	// server: wr_id 101 SUCCESS
	// server: qpn 17 safe (<nil>)
	//   receive queue: 2 receives counted back (the only QP on its CQ, stated by the caller)
	//   send queue: no sends outstanding (stated by the caller)
	// server: ID closed: <nil>
}

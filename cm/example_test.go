package cm_test

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/qpdrain/qpdrain/cm"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/soft"
	"github.com/qpdrain/qpdrain/softcm"
)

// endpoint is one side's verbs objects on the device of its CM ID.
type endpoint struct {
	pd ibv.PD
	cq ibv.CQ
	qp ibv.QP
}

// newEndpoint creates a PD, a CQ and the ID's QP on the ID's device.
func newEndpoint(id cm.ID) (*endpoint, error) {
	e := &endpoint{}
	var err error
	if e.pd, err = id.Context().AllocPD(); err != nil {
		return nil, err
	}
	if e.cq, err = id.Context().CreateCQ(8, nil); err != nil {
		return nil, err
	}
	e.qp, err = id.CreateQP(e.pd, ibv.QPInitAttr{SendCQ: e.cq, RecvCQ: e.cq, Type: ibv.QPTRC,
		Cap: ibv.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	return e, err
}

func (e *endpoint) close() {
	e.qp.Close()
	e.cq.Close()
	e.pd.Close()
}

// Two soft devices on one fabric, each with an address: a server listens,
// a client connects through the CM, and the client's Disconnect flushes
// the receive the server had posted once the server answers the
// DISCONNECTED event with its own Disconnect.
func Example() {
	fab := soft.NewFabric()
	x, _ := soft.Open(soft.Config{Name: "x", Fabric: fab})
	y, _ := soft.Open(soft.Config{Name: "y", Fabric: fab})
	defer y.Close()
	defer x.Close()
	net := softcm.NewNetwork()
	net.Attach(x, netip.MustParseAddr("10.0.0.1"))
	net.Attach(y, netip.MustParseAddr("10.0.0.2"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	listener, _ := net.CreateID(cm.PSTCP)
	defer listener.Close()
	listener.Listen(netip.MustParseAddrPort("10.0.0.2:7471"), 1)
	accepted := make(chan error, 1)
	var server *endpoint
	var serverID cm.ID
	go func() {
		var err error
		if serverID, err = listener.GetRequest(ctx); err == nil {
			if server, err = newEndpoint(serverID); err == nil {
				server.qp.PostRecv([]ibv.RecvWR{{ID: 7}}) // a zero-length receive
				err = serverID.Accept(ctx, cm.ConnParam{})
			}
		}
		accepted <- err
	}()

	client, _ := net.CreateID(cm.PSTCP)
	defer client.Close()
	client.ResolveAddr(ctx, netip.MustParseAddr("10.0.0.1"), netip.MustParseAddrPort("10.0.0.2:7471"))
	client.ResolveRoute(ctx)
	c, _ := newEndpoint(client)
	defer c.close()
	fmt.Println("connect:", client.Connect(ctx, cm.ConnParam{}), <-accepted)
	defer serverID.Close()
	defer server.close()

	client.Disconnect()
	e, _ := serverID.NextEvent(ctx)
	fmt.Println("server:", e)
	serverID.Disconnect()
	e, _ = client.NextEvent(ctx)
	fmt.Println("client:", e)
	wcs := make([]ibv.WC, 1)
	server.cq.Poll(wcs)
	fmt.Println(wcs[0].ID, wcs[0].Status)
	// Output:
	// connect: <nil> <nil>
	// server: RDMA_CM_EVENT_DISCONNECTED
	// client: RDMA_CM_EVENT_DISCONNECTED
	// 7 WR_FLUSH_ERR
}

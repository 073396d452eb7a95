package rcsetup_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/rcsetup"
	"github.com/qpdrain/qpdrain/soft"
	"github.com/qpdrain/qpdrain/softcm"
	"github.com/qpdrain/qpdrain/teardown"
)

// pairOn opens a soft device with transport tr and returns its PD, a CQ,
// a CM connector on it, and the list that closes them.
func pairOn(t *testing.T, tr ibv.TransportType) (*soft.Device, ibv.PD, ibv.CQ, *rcsetup.CM, *teardown.List) {
	t.Helper()
	objs := &teardown.List{}
	t.Cleanup(func() {
		if err := objs.Close(); err != nil {
			t.Error(err)
		}
	})
	dev, err := soft.Open(soft.Config{Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	objs.Add(dev)
	n := softcm.NewNetwork()
	addr := netip.MustParseAddr("10.0.0.1")
	if err := n.Attach(dev, addr); err != nil {
		t.Fatal(err)
	}
	c, err := rcsetup.ListenCM(n, addr)
	if err != nil {
		t.Fatal(err)
	}
	objs.Add(c)
	if c.Context() != ibv.Context(dev) {
		t.Fatalf("CM connector's device %v, want %s", c.Context(), dev.Name())
	}
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	objs.Add(pd)
	cq, err := dev.CreateCQ(16, nil)
	if err != nil {
		t.Fatal(err)
	}
	objs.Add(cq)
	return dev, pd, cq, c, objs
}

func rcAttr(cq ibv.CQ) ibv.QPInitAttr {
	return ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: ibv.QPTRC,
		Cap: ibv.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}}
}

// TestPairIWARP: on the soft device's iWARP personality the manual
// connection is refused (siw's -EINVAL for RTS) and the CM's works: a SEND
// goes from A to B and each QP is in RTS towards the other.
func TestPairIWARP(t *testing.T) {
	dev, pd, cq, c, objs := pairOn(t, ibv.TransportIWARP)
	if !rcsetup.NeedsCM(dev) {
		t.Fatal("NeedsCM is false on an iWARP device")
	}
	route, err := rcsetup.Loopback(dev, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := route.Pair(context.Background(), pd, rcAttr(cq), rcAttr(cq), rcsetup.DefaultRetry); !errors.Is(err, ibv.ErrInvalidArgument) {
		t.Fatalf("manual connection on iWARP: %v, want ErrInvalidArgument", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := c.Pair(ctx, pd, rcAttr(cq), rcAttr(cq), rcsetup.DefaultRetry)
	if err != nil {
		t.Fatal(err)
	}
	objs.Add(p)
	for _, q := range [][2]ibv.QP{{p.A, p.B}, {p.B, p.A}} {
		attr, _, err := q[0].Query(ibv.QPAttrState | ibv.QPAttrDestQPN)
		if err != nil {
			t.Fatal(err)
		}
		if attr.State != ibv.QPSRTS || attr.DestQPNum != q[1].Num() {
			t.Errorf("QP %d: %s towards %d, want RTS towards %d", q[0].Num(), attr.State, attr.DestQPNum, q[1].Num())
		}
	}
	if err := p.B.PostRecv([]ibv.RecvWR{{ID: 2}}); err != nil {
		t.Fatal(err)
	}
	if err := p.A.PostSend([]ibv.SendWR{{ID: 1, Opcode: ibv.WRSend, Flags: ibv.SendSignaled}}); err != nil {
		t.Fatal(err)
	}
	wcs := make([]ibv.WC, 4)
	n, err := cq.Poll(wcs)
	if err != nil || n != 2 || wcs[0].Status != ibv.WCSuccess || wcs[1].Status != ibv.WCSuccess {
		t.Fatalf("after a SEND: %v %v, want two SUCCESS", wcs[:n], err)
	}
}

// TestPairIB: on the InfiniBand personality both ways connect.
func TestPairIB(t *testing.T) {
	dev, pd, cq, c, objs := pairOn(t, ibv.TransportIB)
	if rcsetup.NeedsCM(dev) {
		t.Fatal("NeedsCM is true on an InfiniBand device")
	}
	route, err := rcsetup.Loopback(dev, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, conn := range []rcsetup.Connector{route, c} {
		p, err := conn.Pair(context.Background(), pd, rcAttr(cq), rcAttr(cq), rcsetup.DefaultRetry)
		if err != nil {
			t.Fatalf("%T: %v", conn, err)
		}
		objs.Add(p)
	}
}

// TestPairFails: a pair whose passive QP cannot be created fails at once,
// with the reason, and leaves nothing open (the device's close, the
// test's leak check, would fail otherwise).
func TestPairFails(t *testing.T) {
	_, pd, cq, c, _ := pairOn(t, ibv.TransportIWARP)
	bad := rcAttr(cq)
	bad.Type = ibv.QPTUD
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Pair(ctx, pd, rcAttr(cq), bad, rcsetup.DefaultRetry); !errors.Is(err, ibv.ErrInvalidArgument) || ctx.Err() != nil {
		t.Fatalf("Pair with a UD QP: %v (context: %v), want ErrInvalidArgument at once", err, ctx.Err())
	}
	p, err := c.Pair(ctx, pd, rcAttr(cq), rcAttr(cq), rcsetup.DefaultRetry)
	if err != nil {
		t.Fatalf("a pair after a failed one: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// Package cmtest holds the RDMA CM's device tests (package cm), written
// once: on the soft device (QPDRAIN_TEST_DEVICE unset, "soft" or
// "soft:adversarial") they run through package softcm on one soft device
// with an address, and on a real device ("rxe0") through librdmacm, on the
// address QPDRAIN_TEST_ADDR (the rxe VM stage sets it: the address of the
// netdev rxe0 sits on). Both sides of each connection are on that one
// address (loopback), as the device tests' QPs are on one device.
package cmtest

import (
	"context"
	"net/netip"
	"os"
	"testing"

	"github.com/qpdrain/qpdrain/cm"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/librdmacm"
	"github.com/qpdrain/qpdrain/soft"
	"github.com/qpdrain/qpdrain/softcm"
)

// EnvAddr names the IP address of the test device's netdev, which a real
// test device needs.
const EnvAddr = devtest.EnvAddr

// softAddr is the soft device's address.
var softAddr = netip.MustParseAddr("10.11.12.13")

// Open returns the CM of the test device and the address to connect on.
func Open(t testing.TB) (cm.Manager, netip.Addr) {
	t.Helper()
	if devtest.CurrentProvider() == devtest.ProviderSoft {
		dev := devtest.Open(t).(*soft.Device)
		n := softcm.NewNetwork()
		if err := n.Attach(dev, softAddr); err != nil {
			t.Fatal(err)
		}
		return n, softAddr
	}
	m, err := librdmacm.Open()
	if err != nil {
		t.Fatalf("opening the RDMA CM for %s: %v", devtest.DeviceName(), err)
	}
	addr, err := netip.ParseAddr(os.Getenv(EnvAddr))
	if err != nil {
		t.Fatalf("%s=%q: the address of %s's netdev is needed: %v", EnvAddr, os.Getenv(EnvAddr), devtest.DeviceName(), err)
	}
	return m, addr
}

// NewID creates an ID in port space TCP, closed when the test ends.
func NewID(t testing.TB, m cm.Manager) cm.ID {
	t.Helper()
	id, err := m.CreateID(cm.PSTCP)
	if err != nil {
		t.Fatalf("creating CM ID: %v", err)
	}
	devtest.Close(t, id)
	return id
}

// Endpoint is the verbs side of one ID: a PD, a CQ, the ID's QP, a buffer
// and, for a QP that receives from one, an SRQ, on the ID's device, closed
// when the test ends (before the ID, which must be created first).
type Endpoint struct {
	PD  ibv.PD
	CQ  ibv.CQ
	QP  ibv.QP
	MR  ibv.MR
	SRQ ibv.SRQ
}

// NewEndpoint creates id's QP, an RC QP of 16 WRs each way, with its PD,
// CQ and a 4 KiB buffer.
func NewEndpoint(t testing.TB, id cm.ID) *Endpoint {
	t.Helper()
	return newEndpoint(t, id, false)
}

// NewSRQEndpoint is NewEndpoint with a QP that receives from an SRQ of 16
// WRs, created through the CM like any other (rdma_create_qp takes the
// init attributes' SRQ as ibv_create_qp does).
func NewSRQEndpoint(t testing.TB, id cm.ID) *Endpoint {
	t.Helper()
	return newEndpoint(t, id, true)
}

func newEndpoint(t testing.TB, id cm.ID, withSRQ bool) *Endpoint {
	t.Helper()
	ctx := id.Context()
	if ctx == nil {
		t.Fatal("the CM ID has no device")
	}
	e := &Endpoint{PD: devtest.NewPD(t, ctx)}
	e.CQ = devtest.NewCQ(t, ctx, 64)
	e.MR = devtest.Buffer(t, e.PD, 4096, devtest.AllAccess)
	attr := ibv.QPInitAttr{SendCQ: e.CQ, RecvCQ: e.CQ, Type: ibv.QPTRC,
		Cap: ibv.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}}
	if withSRQ {
		e.SRQ = devtest.NewSRQ(t, e.PD, ibv.SRQAttr{MaxWR: 16, MaxSGE: 1})
		attr.SRQ = e.SRQ
		attr.Cap.MaxRecvWR, attr.Cap.MaxRecvSGE = 0, 0
	}
	qp, err := id.CreateQP(e.PD, attr)
	if err != nil {
		t.Fatalf("creating the CM ID's QP: %v", err)
	}
	devtest.Close(t, qp)
	e.QP = qp
	return e
}

// Resolve resolves id's address and route to dst within the test bound.
func Resolve(t testing.TB, id cm.ID, dst netip.AddrPort) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), devtest.Timeout)
	defer cancel()
	if err := id.ResolveAddr(ctx, netip.Addr{}, dst); err != nil {
		t.Fatal(err)
	}
	if err := id.ResolveRoute(ctx); err != nil {
		t.Fatal(err)
	}
}

// WaitEvent returns id's next event of type want within devtest.Timeout,
// skipping RDMA_CM_EVENT_TIMEWAIT_EXIT (the IB CM raises it after a
// disconnect, when the QP leaves timewait).
func WaitEvent(t testing.TB, id cm.ID, want cm.EventType) cm.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), devtest.Timeout)
	defer cancel()
	for {
		e, err := id.NextEvent(ctx)
		if err != nil {
			t.Fatalf("waiting for %s: %v", want, err)
		}
		if e.Type == cm.EventTimewaitExit && want != cm.EventTimewaitExit {
			continue
		}
		if e.Type != want {
			t.Fatalf("CM event %s, want %s", e, want)
		}
		return e
	}
}

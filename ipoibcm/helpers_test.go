package ipoibcm

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/clock"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/rcsetup"
	"github.com/qpdrain/qpdrain/soft"
)

// epoch is where the tests' virtual clocks start.
var epoch = time.Date(2008, 4, 1, 0, 0, 0, 0, time.UTC)

// rig is a Manager on a test device with peers on the same device
// (loopback), on a virtual clock.
type rig struct {
	t      *testing.T
	dev    ibv.Context
	pd     ibv.PD
	clock  *clock.Virtual
	m      *Manager
	route  rcsetup.Route
	peerCQ ibv.CQ
	peerMR ibv.MR
	events []Event
}

// skipIWARP skips a test on the test device when that is iWARP.
// IPoIB-CM is an InfiniBand protocol (RFC 4755): its connections are set up
// over the IB CM, and Manager.Accept, as ipoib_cm_req_handler does, takes
// the RX QP RESET -> INIT -> RTR -> RTS by hand, which an iWARP QP cannot
// do: it reaches RTS only through iw_cm with its connection's socket
// (siw_qp_nextstate_from_idle, drivers/infiniband/sw/siw/siw_qp.c: EINVAL,
// "no socket"; on siw0 every Accept was rejected so).
func skipIWARP(t *testing.T) {
	t.Helper()
	if devtest.IWARP() {
		t.Skipf("%s is iWARP: IPoIB-CM (RFC 4755) connects its QPs by hand after the IB CM's REQ/REP, and an iWARP QP reaches RTS only through iw_cm (siw_qp_nextstate_from_idle in drivers/infiniband/sw/siw/siw_qp.c)", devtest.DeviceName())
	}
}

// newRig opens the test device (or dev, when not nil) and a Manager on it.
func newRig(t *testing.T, dev ibv.Context, cfg Config) *rig {
	t.Helper()
	if dev == nil {
		skipIWARP(t)
		dev = devtest.Open(t)
	}
	r := &rig{t: t, dev: dev, clock: clock.NewVirtual(epoch)}
	r.pd = devtest.NewPD(t, dev)
	route, err := rcsetup.Loopback(dev, devtest.Port)
	if err != nil {
		t.Fatal(err)
	}
	r.route = route
	cfg.Context, cfg.PD, cfg.Clock = dev, r.pd, r.clock
	if cfg.RecvQueueSize == 0 {
		cfg.RecvQueueSize = 8
	}
	cfg.Trace = func(e Event) { r.events = append(r.events, e) }
	m, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	r.m = m
	t.Cleanup(func() {
		if !m.stopped {
			if _, err := m.Stop(context.Background()); err != nil {
				t.Errorf("Stop: %v", err)
			}
		}
	})
	r.peerCQ = devtest.NewCQ(t, dev, 256)
	r.peerMR = devtest.Buffer(t, r.pd, 4096, ibv.AccessLocalWrite)
	return r
}

// softDevice opens a soft device with quirks, closed when the test ends.
func softDevice(t *testing.T, q soft.Quirks) ibv.Context {
	t.Helper()
	dev, err := soft.Open(soft.Config{Quirks: q})
	if err != nil {
		t.Fatal(err)
	}
	devtest.Close(t, dev)
	return dev
}

// connect creates a peer QP, has the Manager accept it, and connects the
// peer back.
func (r *rig) connect() (*Conn, ibv.QP) {
	r.t.Helper()
	peer := devtest.NewRC(r.t, r.pd, devtest.RCConfig{SendCQ: r.peerCQ})
	c, err := r.m.Accept(peer.Num(), r.route)
	if err != nil {
		r.t.Fatalf("Accept: %v", err)
	}
	if err := r.route.Bring(peer, c.QPNum(), ibv.QPSRTS); err != nil {
		r.t.Fatal(err)
	}
	return c, peer
}

// disconnect has the Manager handle a DREQ for c.
func (r *rig) disconnect(c *Conn) {
	r.t.Helper()
	if err := r.m.Disconnect(c); err != nil {
		r.t.Fatalf("Disconnect: %v", err)
	}
}

// disconnected connects n peers and disconnects each, servicing after
// each DREQ, and returns their connections.
func (r *rig) disconnected(n int) []*Conn {
	r.t.Helper()
	conns := make([]*Conn, n)
	for i := range conns {
		conns[i], _ = r.connect()
	}
	for _, c := range conns {
		r.disconnect(c)
		r.service()
	}
	return conns
}

// send posts one SEND from peer and waits for its completion and for the
// Manager to have handled the receive.
func (r *rig) send(peer ibv.QP) {
	r.t.Helper()
	wr := ibv.SendWR{ID: 1, Opcode: ibv.WRSend, Flags: ibv.SendSignaled,
		SGL: []ibv.SGE{{Addr: r.peerMR.Addr(), Length: 64, LKey: r.peerMR.LKey()}}}
	if err := peer.PostSend([]ibv.SendWR{wr}); err != nil {
		r.t.Fatalf("posting a send: %v", err)
	}
	wcs := devtest.Poll(r.t, r.peerCQ, 1)
	if wcs[0].Status != ibv.WCSuccess {
		r.t.Fatalf("peer send completed with %s", wcs[0].Status)
	}
	want := r.m.Stats().Receives + 1
	r.until("the receive handled", func() bool { return r.m.Stats().Receives == want })
}

// service runs the Manager's Service once.
func (r *rig) service() {
	r.t.Helper()
	if err := r.m.Service(); err != nil {
		r.t.Fatalf("Service: %v", err)
	}
}

// until services the Manager until cond holds, in real time on a real
// device (events and completions arrive asynchronously), failing after
// devtest.Timeout.
func (r *rig) until(what string, cond func() bool) {
	r.t.Helper()
	deadline := time.Now().Add(devtest.Timeout)
	for {
		r.service()
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s: not within %v; lists %v", what, devtest.Timeout, r.m.Counts())
		}
		time.Sleep(time.Millisecond)
	}
}

// quiet services the Manager for d of real time and fails if cond stops
// holding: what must not happen does not.
func (r *rig) quiet(what string, d time.Duration, cond func() bool) {
	r.t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(time.Millisecond) {
		r.service()
		if !cond() {
			r.t.Fatalf("%s: no longer so; lists %v", what, r.m.Counts())
		}
	}
}

// advance moves the virtual clock by d and services.
func (r *rig) advance(d time.Duration) {
	r.t.Helper()
	r.clock.Advance(d)
	r.service()
}

// kinds returns the kinds of the traced events of qpn, in order.
func (r *rig) kinds(qpn uint32) []EventKind {
	var k []EventKind
	for _, e := range r.events {
		if e.QPNum == qpn {
			k = append(k, e.Kind)
		}
	}
	return k
}

// wantKinds fails unless qpn's traced events are want.
func (r *rig) wantKinds(qpn uint32, want ...EventKind) {
	r.t.Helper()
	if got := r.kinds(qpn); !slices.Equal(got, want) {
		r.t.Errorf("qpn %d events %v, want %v", qpn, got, want)
	}
}

// lastWQEReached reports whether the test device raises Last WQE Reached
// for SRQ QPs: every device but rxe before devtest.RXELastWQEReached.
func lastWQEReached() bool { return !devtest.RXELacks(devtest.RXELastWQEReached) }

// event returns qpn's first traced event of kind k.
func (r *rig) event(qpn uint32, k EventKind) (Event, bool) {
	for _, e := range r.events {
		if e.QPNum == qpn && e.Kind == k {
			return e, true
		}
	}
	return Event{}, false
}

// repeatsLastWQE says the test device raises Last WQE Reached again after a
// send is posted on the QP in ERROR, as rxe does from
// devtest.RXELastWQERepeated on (docs/PROVIDERS.md; soft's
// LastWQEReachedTwice): ipoib_cm.c's handler then moves the entry back to
// the flush list and posts another drain WR.
func repeatsLastWQE() bool { return devtest.RXEHas(devtest.RXELastWQERepeated) }

// wantKernelDrain fails unless qpn's traced events are before, Last WQE
// Reached and a drain WR (repeated where the device repeats the event),
// then drained and reaped.
func (r *rig) wantKernelDrain(qpn uint32, before ...EventKind) {
	r.t.Helper()
	got := r.kinds(qpn)
	pair := []EventKind{EventLastWQE, EventDrainPosted}
	i := len(before)
	ok := len(got) >= i+4 && slices.Equal(got[:i], before) && slices.Equal(got[i:i+2], pair)
	// A repeat comes before the drain WR's completion or after it (the
	// drained entry then goes back to the flush list first).
	for i += 2; ok && repeatsLastWQE(); {
		if len(got) >= i+2 && slices.Equal(got[i:i+2], pair) {
			i += 2
		} else if len(got) >= i+3 && got[i] == EventDrained && slices.Equal(got[i+1:i+3], pair) {
			i += 3
		} else {
			break
		}
		r.t.Logf("qpn %d: Last WQE Reached again after the drain WR, another drain WR (ipoib_cm_rx_event_handler)", qpn)
	}
	if !ok || !slices.Equal(got[i:], []EventKind{EventDrained, EventReaped}) {
		r.t.Errorf("qpn %d events %v, want %v, %v, then drained, reaped", qpn, got, before, pair)
	}
}

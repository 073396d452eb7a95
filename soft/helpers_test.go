package soft_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/testmain"
	"github.com/qpdrain/qpdrain/soft"
)

func TestMain(m *testing.M) { testmain.Run(m) }

// env is one soft device with a PD, and everything a test creates on it,
// closed in reverse order when the test ends.
type env struct {
	t   testing.TB
	dev *soft.Device
	pd  ibv.PD
}

type closer interface{ Close() error }

func (e *env) closeLater(c closer) {
	e.t.Helper()
	e.t.Cleanup(func() {
		if err := c.Close(); err != nil {
			e.t.Errorf("closing %T: %v", c, err)
		}
	})
}

// newEnv opens a device; cfg.Name and cfg.Fabric pick it, the rest configure it.
func newEnv(t testing.TB, cfg soft.Config) *env {
	t.Helper()
	dev, err := soft.Open(cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	e := &env{t: t, dev: dev}
	e.closeLater(dev)
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatalf("AllocPD: %v", err)
	}
	e.closeLater(pd)
	e.pd = pd
	return e
}

func (e *env) cq(n int) ibv.CQ {
	e.t.Helper()
	cq, err := e.dev.CreateCQ(n, nil)
	if err != nil {
		e.t.Fatalf("CreateCQ(%d): %v", n, err)
	}
	e.closeLater(cq)
	return cq
}

func (e *env) mr(size int, access ibv.AccessFlags) ibv.MR {
	e.t.Helper()
	mr, err := e.pd.RegMR(make([]byte, size), access)
	if err != nil {
		e.t.Fatalf("RegMR: %v", err)
	}
	e.closeLater(mr)
	return mr
}

func (e *env) srq(maxWR, limit uint32) ibv.SRQ {
	e.t.Helper()
	s, err := e.pd.CreateSRQ(ibv.SRQAttr{MaxWR: maxWR, MaxSGE: 4, SRQLimit: limit})
	if err != nil {
		e.t.Fatalf("CreateSRQ: %v", err)
	}
	e.closeLater(s)
	return s
}

// qp creates an RC QP with 64-deep queues of 4 SGEs completing into cq.
func (e *env) qp(cq ibv.CQ, srq ibv.SRQ) *soft.QP {
	e.t.Helper()
	q, err := e.pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, SRQ: srq, Type: ibv.QPTRC,
		Cap: ibv.QPCap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 4, MaxRecvSGE: 4}})
	if err != nil {
		e.t.Fatalf("CreateQP: %v", err)
	}
	e.closeLater(q)
	return q.(*soft.QP)
}

func connect(t testing.TB, a, b ibv.QP, rdAtomic uint8) {
	t.Helper()
	if err := soft.Connect(a, b, rdAtomic); err != nil {
		t.Fatalf("Connect: %v", err)
	}
}

// pair is two connected QPs, each with its own CQ and a 4 KiB MR.
type pair struct {
	a, b     *soft.QP
	cqa, cqb ibv.CQ
	ma, mb   ibv.MR
}

func newPair(t testing.TB, ea, eb *env) *pair {
	t.Helper()
	const all = ibv.AccessLocalWrite | ibv.AccessRemoteWrite | ibv.AccessRemoteRead | ibv.AccessRemoteAtomic
	p := &pair{cqa: ea.cq(256), cqb: eb.cq(256), ma: ea.mr(4096, all), mb: eb.mr(4096, all)}
	p.a, p.b = ea.qp(p.cqa, nil), eb.qp(p.cqb, nil)
	connect(t, p.a, p.b, 4)
	return p
}

func sge(mr ibv.MR, off, n int) []ibv.SGE {
	return []ibv.SGE{{Addr: mr.Addr() + uint64(off), Length: uint32(n), LKey: mr.LKey()}}
}

func post(t testing.TB, q ibv.QP, wrs ...ibv.SendWR) {
	t.Helper()
	if err := q.PostSend(wrs); err != nil {
		t.Fatalf("PostSend: %v", err)
	}
}

func postRecv(t testing.TB, q ibv.QP, wrs ...ibv.RecvWR) {
	t.Helper()
	if err := q.PostRecv(wrs); err != nil {
		t.Fatalf("PostRecv: %v", err)
	}
}

// pollAll drains cq.
func pollAll(t testing.TB, cq ibv.CQ) []ibv.WC {
	t.Helper()
	var out []ibv.WC
	wcs := make([]ibv.WC, 16)
	for {
		n, err := cq.Poll(wcs)
		if err != nil {
			t.Fatalf("Poll: %v", err)
		}
		out = append(out, wcs[:n]...)
		if n < len(wcs) {
			return out
		}
	}
}

// flushed is the completion a flushed WR must give: only ID, Status and QPNum set.
func flushed(id uint64, qpn uint32) ibv.WC {
	return ibv.WC{ID: id, Status: ibv.WCWRFlushErr, QPNum: qpn}
}

func wantWCs(t testing.TB, cq ibv.CQ, want ...ibv.WC) {
	t.Helper()
	got := pollAll(t, cq)
	if len(got) != len(want) {
		t.Fatalf("polled %d completions, want %d:\n got %v\nwant %v", len(got), len(want), got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("completion %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

// events returns every async event queued on dev, without waiting.
func events(t testing.TB, dev *soft.Device) []string {
	t.Helper()
	var out []string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		ev, err := dev.NextAsyncEvent(ctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			return out
		}
		if err != nil {
			t.Fatalf("NextAsyncEvent: %v", err)
		}
		out = append(out, ev.String())
	}
}

func wantEvents(t testing.TB, dev *soft.Device, want ...string) {
	t.Helper()
	got := events(t, dev)
	if len(got) != len(want) {
		t.Fatalf("events %q, want %q", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("events %q, want %q", got, want)
		}
	}
}

func state(t testing.TB, q ibv.QP) ibv.QPState {
	t.Helper()
	a, _, err := q.Query(ibv.QPAttrState)
	if err != nil {
		t.Fatalf("Query: %v", err)
	}
	return a.State
}

func toState(t testing.TB, q ibv.QP, s ibv.QPState) {
	t.Helper()
	if err := q.Modify(ibv.QPAttr{State: s}, ibv.QPAttrState); err != nil {
		t.Fatalf("Modify to %s: %v", s, err)
	}
}

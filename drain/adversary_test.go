package drain_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/ibv"
)

// adversary stands between the reaper and a device and makes, against the
// drain, choices the specification leaves open (completions are ordered
// within a work queue, not across the work queues of one CQ; send slots
// return when their completions are polled, ibv_poll_cq(3); async events
// travel apart from completions):
//   - the completions of the work queues in hold reach the poller delay
//     late, still in order within each queue;
//   - a QP's send queue holds at most its MaxSendWR WRs until their
//     completions are polled (slots freed on poll, as rdma-core providers do);
//   - events reach the caller evDelay late.
//
// It also watches for what the drain must never do: a completion of a QP
// polled after the reaper declared that QP safe (a false safe), and more
// drain WRs outstanding on the CQ, as the device sees them, than the
// headroom.
type adversary struct {
	inner   ibv.CQ
	view    *advCQ
	delay   time.Duration
	evDelay time.Duration

	mu        sync.Mutex
	hold      map[workQueue]bool
	held      []heldWC
	ready     []ibv.WC
	recvDrain map[uint64]bool // drain WRs posted as receives
	qps       map[ibv.QP]*advQP
	sqUsed    map[uint32]int // send WRs posted and not polled, per QP
	handles   map[uint32]*drain.Handle
	inFlight  int // drain WRs posted and not polled
	maxFlight int
	falseSafe []string
}

type workQueue struct {
	qpn   uint32
	queue report.Queue
}

type heldWC struct {
	wc    ibv.WC
	until time.Time
}

func newAdversary(cq ibv.CQ, delay time.Duration) *adversary {
	a := &adversary{inner: cq, delay: delay, hold: map[workQueue]bool{}, recvDrain: map[uint64]bool{},
		qps: map[ibv.QP]*advQP{}, sqUsed: map[uint32]int{}, handles: map[uint32]*drain.Handle{}}
	a.view = &advCQ{CQ: cq, a: a}
	return a
}

// advCQ is the adversary's view of the CQ.
type advCQ struct {
	ibv.CQ
	a *adversary
}

// advQP is a QP whose queues complete into the adversary's CQ.
type advQP struct {
	ibv.QP
	a      *adversary
	sendWR int
}

// wrap returns qp as the reaper must see it: completing into the
// adversary's CQ.
func (a *adversary) wrap(qp ibv.QP, sendWR int) *advQP {
	q := &advQP{QP: qp, a: a, sendWR: sendWR}
	a.mu.Lock()
	a.qps[qp] = q
	a.mu.Unlock()
	return q
}

func (a *adversary) cq() ibv.CQ { return a.view }

// holdBack delays the completions of a QP's queue.
func (a *adversary) holdBack(qp ibv.QP, q report.Queue) {
	a.mu.Lock()
	a.hold[workQueue{qp.Num(), q}] = true
	a.mu.Unlock()
}

// watch lets the adversary check h's QP for completions after it was
// declared safe.
func (a *adversary) watch(h *drain.Handle) {
	a.mu.Lock()
	a.handles[h.QP().Num()] = h
	a.mu.Unlock()
}

func (q *advQP) SendCQ() ibv.CQ { return q.a.cq() }
func (q *advQP) RecvCQ() ibv.CQ { return q.a.cq() }

func (q *advQP) PostSend(wrs []ibv.SendWR) error {
	a := q.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.sqUsed[q.Num()]+len(wrs) > q.sendWR {
		return &ibv.PostError{Index: 0, Err: fmt.Errorf("send queue of qpn %d holds %d unpolled WRs: %w", q.Num(), q.sendWR, ibv.ErrQueueFull)}
	}
	if err := q.QP.PostSend(wrs); err != nil {
		return err
	}
	a.sqUsed[q.Num()] += len(wrs)
	for _, wr := range wrs {
		if drain.IsDrainWRID(wr.ID) {
			a.inFlight++
			a.maxFlight = max(a.maxFlight, a.inFlight)
		}
	}
	return nil
}

func (q *advQP) PostRecv(wrs []ibv.RecvWR) error {
	a := q.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := q.QP.PostRecv(wrs); err != nil {
		return err
	}
	for _, wr := range wrs {
		if drain.IsDrainWRID(wr.ID) {
			a.recvDrain[wr.ID] = true
			a.inFlight++
			a.maxFlight = max(a.maxFlight, a.inFlight)
		}
	}
	return nil
}

// queueOf tells a completion's work queue: the tests' own IDs carry it,
// and the adversary saw where each drain WR was posted.
func (a *adversary) queueOf(wc ibv.WC) report.Queue {
	if drain.IsDrainWRID(wc.ID) {
		if a.recvDrain[wc.ID] {
			return report.QueueRecv
		}
		return report.QueueSend
	}
	return queueOf(wc)
}

func (c *advCQ) Poll(wcs []ibv.WC) (int, error) {
	a := c.a
	buf := make([]ibv.WC, len(wcs))
	n, err := a.inner.Poll(buf)
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, wc := range buf[:n] {
		if a.hold[workQueue{wc.QPNum, a.queueOf(wc)}] {
			a.held = append(a.held, heldWC{wc, now.Add(a.delay)})
		} else {
			a.ready = append(a.ready, wc)
		}
	}
	// Held completions of one queue leave in order; relative to the
	// others, late.
	for len(a.held) > 0 && !now.Before(a.held[0].until) {
		a.ready = append(a.ready, a.held[0].wc)
		a.held = a.held[1:]
	}
	k := copy(wcs, a.ready)
	a.ready = a.ready[k:]
	watched := make([]*drain.Handle, k)
	for i, wc := range wcs[:k] {
		if a.queueOf(wc) == report.QueueSend {
			a.sqUsed[wc.QPNum]--
		}
		if drain.IsDrainWRID(wc.ID) {
			a.inFlight--
		}
		watched[i] = a.handles[wc.QPNum]
	}
	a.mu.Unlock()
	// Outside a.mu: the reaper posts, through the adversary, under its own
	// lock. Only the caller hands completions over, after Poll returns, so
	// no outcome can change meanwhile to Safe.
	var found []string
	for i, h := range watched {
		if h == nil {
			continue
		}
		if rep := h.Report(); rep.Outcome == report.Safe {
			found = append(found, fmt.Sprintf("qpn %d: completion wr_id %#x polled after it was declared safe\n%s", wcs[i].QPNum, wcs[i].ID, rep))
		}
	}
	a.mu.Lock()
	a.falseSafe = append(a.falseSafe, found...)
	return k, err
}

// pending reports whether the adversary still holds completions.
func (a *adversary) pending() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.held)+len(a.ready) > 0
}

// advCtx delivers a device's events evDelay late, with the QP the reaper
// knows.
type advCtx struct {
	ibv.Context
	a *adversary
}

func (c *advCtx) NextAsyncEvent(ctx context.Context) (ibv.AsyncEvent, error) {
	ev, err := c.Context.NextAsyncEvent(ctx)
	if err != nil {
		return ev, err
	}
	c.a.mu.Lock()
	if q := c.a.qps[ev.QP]; q != nil {
		ev.QP = q
	}
	c.a.mu.Unlock()
	select {
	case <-time.After(c.a.evDelay):
	case <-ctx.Done():
		return ibv.AsyncEvent{}, ctx.Err()
	}
	return ev, nil
}

// check fails t on every false safe the adversary saw and on drain WRs in
// excess of the headroom.
func (a *adversary) check(t testing.TB, headroom int) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, f := range a.falseSafe {
		t.Errorf("false safe: %s", f)
	}
	if a.maxFlight > headroom {
		t.Errorf("%d drain WRs were outstanding on the CQ at once, headroom %d", a.maxFlight, headroom)
	}
}

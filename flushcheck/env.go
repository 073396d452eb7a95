package flushcheck

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/qpdrain/qpdrain/clock"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/rcsetup"
	"github.com/qpdrain/qpdrain/teardown"
)

// env is one probe's run: the device, the objects the probe created (closed
// in reverse order by close) and bounded waits for completions and events.
type env struct {
	ctx  context.Context
	dev  ibv.Context
	o    Options
	name string // the probe's, for Options.OnWait
	// clk is Options.Clock, stepped when simulated: every wait runs on it.
	clk  clock.Clock
	real bool // clk is the wall clock
	// iwarp: the device is iWARP (rcsetup.NeedsCM), where no send waits
	// on an RNR: the probes hold receives outstanding instead.
	iwarp bool
	// t0 is what the probe's times are relative to: the moment the QP
	// entered ERROR, or the request that caused an error was posted.
	t0 time.Time

	// recvSGE is the SGE of every receive the probe posts: on iWARP one
	// into a buffer of the probe's PD (pd), since libsiw refuses a
	// receive without one (push_recv_wqe in rdma-core's
	// providers/siw/siw.c: EINVAL); none elsewhere.
	recvSGE []ibv.SGE

	route *rcsetup.Route
	objs  teardown.List // closed by close, last created first
	calls callRecord    // the verbs call the probe is in
	qps   []ibv.QP
	srqs  []ibv.SRQ
	cqs   []ibv.CQ
}

// newEnv starts a probe's run on dev with o (defaults applied), marked
// now.
func newEnv(ctx context.Context, dev ibv.Context, o Options) *env {
	e := &env{ctx: ctx, dev: dev, o: o, clk: o.Clock, iwarp: rcsetup.NeedsCM(dev)}
	if _, e.real = o.Clock.(clock.Real); !e.real {
		e.clk = stepped{o.Clock}
	}
	e.mark()
	return e
}

// close closes every object the probe created, children first, all of them
// even when one fails.
func (e *env) close() error { return e.objs.Close() }

// buffer is memory from ibv.AllocBuffer; closing it frees it.
type buffer []byte

func (b buffer) Close() error { return ibv.FreeBuffer(b) }

// mark makes now the moment the probe's times are relative to.
func (e *env) mark() { e.t0 = e.clk.Now() }

// since is the time from the mark, rounded for reading.
func (e *env) since() time.Duration { return roundDur(e.clk.Now().Sub(e.t0)) }

func roundDur(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}

func (e *env) pd() (ibv.PD, error) {
	var pd ibv.PD
	if err := e.verb("ibv_alloc_pd", func() (err error) { pd, err = e.dev.AllocPD(); return err }); err != nil {
		return nil, fmt.Errorf("allocating a PD: %w", err)
	}
	e.own("ibv_dealloc_pd", pd)
	if e.iwarp {
		mr, err := e.buffer(pd, recvBytes, ibv.AccessLocalWrite)
		if err != nil {
			return nil, err
		}
		e.recvSGE = []ibv.SGE{{Addr: mr.Addr(), Length: recvBytes, LKey: mr.LKey()}}
	}
	return pd, nil
}

// recvBytes is the size of the receives' buffer on iWARP: the probes'
// sends carry no data, so any size takes them.
const recvBytes = 64

func (e *env) cq(cqe int) (ibv.CQ, error) {
	var cq ibv.CQ
	if err := e.verb("ibv_create_cq", func() (err error) { cq, err = e.dev.CreateCQ(cqe, nil); return err }); err != nil {
		return nil, fmt.Errorf("creating a CQ: %w", err)
	}
	e.own("ibv_destroy_cq", cq)
	e.cqs = append(e.cqs, cq)
	return cq, nil
}

func (e *env) srq(pd ibv.PD) (ibv.SRQ, error) {
	var srq ibv.SRQ
	if err := e.verb("ibv_create_srq", func() (err error) {
		srq, err = pd.CreateSRQ(ibv.SRQAttr{MaxWR: 16, MaxSGE: 1})
		return err
	}); err != nil {
		return nil, fmt.Errorf("creating an SRQ: %w", err)
	}
	e.own("ibv_destroy_srq", srq)
	e.srqs = append(e.srqs, srq)
	return srq, nil
}

// rc creates an RC QP in RESET, to be connected by hand, with a CQ of its
// own for sends and receives.
func (e *env) rc(pd ibv.PD) (ibv.QP, error) {
	cq, err := e.cq(64)
	if err != nil {
		return nil, err
	}
	var qp ibv.QP
	if err := e.verb("ibv_create_qp", func() (err error) { qp, err = pd.CreateQP(rcAttr(cq, nil, 16)); return err }); err != nil {
		return nil, fmt.Errorf("creating an RC QP: %w", err)
	}
	e.own(fmt.Sprintf("ibv_destroy_qp on QP %d", qp.Num()), qp)
	e.qps = append(e.qps, qp)
	return qp, nil
}

// rcAttr is the init attributes of an RC QP that completes its sends and
// receives on cq, takes its receives from srq when not nil, and has room
// for maxSend sends.
func rcAttr(cq ibv.CQ, srq ibv.SRQ, maxSend int) ibv.QPInitAttr {
	return ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, SRQ: srq, Type: ibv.QPTRC,
		Cap: ibv.QPCap{MaxSendWR: uint32(maxSend), MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}}
}

// connect brings a and b, two RC QPs in RESET, to RTS connected to each
// other by hand with the retry attributes rt (reset-reuse's second life).
func (e *env) connect(a, b ibv.QP, rt rcsetup.Retry) error {
	r, err := e.loopback()
	if err != nil {
		return err
	}
	r.Retry = &rt
	return e.verb(fmt.Sprintf("ibv_modify_qp on QP %d and QP %d to RTS (rcsetup)", a.Num(), b.Num()), func() error { return r.Connect(a, b) })
}

// connectPair creates an RC QP with attrA on pd and a peer with a CQ of
// its own, connected to each other (RTS) with the retry attributes rt:
// through Options.Connector, or by hand over the loopback route.
func (e *env) connectPair(pd ibv.PD, attrA ibv.QPInitAttr, rt rcsetup.Retry) (a, b ibv.QP, err error) {
	cq, err := e.cq(64)
	if err != nil {
		return nil, nil, err
	}
	var conn rcsetup.Connector = e.o.Connector
	if conn == nil {
		if conn, err = e.loopback(); err != nil {
			return nil, nil, err
		}
	}
	var p *rcsetup.Pair
	if err := e.verb("creating and connecting an RC QP pair (rcsetup)", func() (err error) {
		p, err = conn.Pair(e.ctx, pd, attrA, rcAttr(cq, nil, 16), rt)
		return err
	}); err != nil {
		return nil, nil, err
	}
	// The pair closes what connected it (the CM IDs) after its QPs.
	e.own("closing the QP pair (rdma_destroy_id when through the CM)", p)
	for _, qp := range []ibv.QP{p.A, p.B} {
		e.own(fmt.Sprintf("ibv_destroy_qp on QP %d", qp.Num()), qp)
		e.qps = append(e.qps, qp)
	}
	return p.A, p.B, nil
}

// pair creates two RC QPs, the first taking its receives from srq when not
// nil, and connects them to each other (RTS).
func (e *env) pair(pd ibv.PD, srq ibv.SRQ) (a, b ibv.QP, err error) {
	return e.pairWith(pd, srq, rcsetup.DefaultRetry)
}

// pairWith is pair with the retry attributes rt.
func (e *env) pairWith(pd ibv.PD, srq ibv.SRQ, rt rcsetup.Retry) (a, b ibv.QP, err error) {
	cq, err := e.cq(64)
	if err != nil {
		return nil, nil, err
	}
	return e.connectPair(pd, rcAttr(cq, srq, 16), rt)
}

// connected allocates a PD and creates two RC QPs on it connected to each
// other (RTS) with the retry attributes rt: most probes' start.
func (e *env) connected(rt rcsetup.Retry) (pd ibv.PD, a, b ibv.QP, err error) {
	if pd, err = e.pd(); err != nil {
		return nil, nil, nil, err
	}
	if a, b, err = e.pairWith(pd, nil, rt); err != nil {
		return nil, nil, nil, err
	}
	return pd, a, b, nil
}

// outstanding connects a pair with the default retry attributes and posts
// nRecv receives, then nSend sends, on its first QP a. The sends wait on an
// RNR: the peer b has no receive and rnr_retry is infinite.
func (e *env) outstanding(nRecv, nSend int) (pd ibv.PD, a, b ibv.QP, err error) {
	if pd, a, b, err = e.connected(rcsetup.DefaultRetry); err != nil {
		return nil, nil, nil, err
	}
	if nRecv > 0 {
		if err := e.postRecv(a, e.recvs(recvBase, nRecv)); err != nil {
			return nil, nil, nil, fmt.Errorf("posting receives: %w", err)
		}
	}
	if nSend > 0 {
		if err := e.postSend(a, sends(sendBase, nSend)); err != nil {
			return nil, nil, nil, fmt.Errorf("posting sends: %w", err)
		}
	}
	return pd, a, b, nil
}

// onSRQ allocates a PD and an SRQ and creates n connected pairs whose
// first QP takes its receives from the SRQ; it returns those first QPs.
func (e *env) onSRQ(n int) (ibv.SRQ, []ibv.QP, error) {
	pd, err := e.pd()
	if err != nil {
		return nil, nil, err
	}
	srq, err := e.srq(pd)
	if err != nil {
		return nil, nil, err
	}
	qps := make([]ibv.QP, n)
	for i := range qps {
		if qps[i], _, err = e.pair(pd, srq); err != nil {
			return nil, nil, err
		}
	}
	return srq, qps, nil
}

func (e *env) loopback() (rcsetup.Route, error) {
	if e.route == nil {
		var r rcsetup.Route
		if err := e.verb(fmt.Sprintf("ibv_query_port and ibv_query_gid on port %d (rcsetup)", e.o.Port), func() (err error) {
			r, err = rcsetup.Loopback(e.dev, e.o.Port)
			return err
		}); err != nil {
			return rcsetup.Route{}, err
		}
		e.route = &r
	}
	return *e.route, nil
}

// buffer registers size bytes of memory outside the Go heap.
func (e *env) buffer(pd ibv.PD, size int, access ibv.AccessFlags) (ibv.MR, error) {
	buf, err := ibv.AllocBuffer(size)
	if err != nil {
		return nil, fmt.Errorf("allocating %d bytes: %w", size, err)
	}
	e.objs.Add(buffer(buf))
	var mr ibv.MR
	if err := e.verb("ibv_reg_mr", func() (err error) { mr, err = pd.RegMR(buf, access); return err }); err != nil {
		return nil, fmt.Errorf("registering %d bytes: %w", size, err)
	}
	e.own("ibv_dereg_mr", mr)
	return mr, nil
}

// toError moves qp to ERROR and marks the moment.
func (e *env) toError(qp ibv.QP) error {
	e.mark()
	if err := e.modify(qp, ibv.QPAttr{State: ibv.QPSErr}, ibv.QPAttrState); err != nil {
		return fmt.Errorf("moving QP %d to ERR: %w", qp.Num(), err)
	}
	return nil
}

func (e *env) state(qp ibv.QP) (ibv.QPState, error) {
	attr, err := e.query(qp, ibv.QPAttrState)
	if err != nil {
		return 0, fmt.Errorf("querying QP %d: %w", qp.Num(), err)
	}
	return attr.State, nil
}

// unreadState is why a siw QP's state reads RESET whatever it is.
const unreadState = "siw_query_qp in the kernel's drivers/infiniband/sw/siw/siw_verbs.c fills in no qp_state before commit 0b988c1bee28 (\"RDMA/siw: Set qp_state in siw_query_qp\", Linux 6.8)"

// stateUnread says why qp's state cannot be read, "" when it can: qp is
// connected and nothing has gone wrong on it yet, so it is in RTS, and a
// device that reports anything else does not report the state at all. A
// verdict then comes from what the state would have caused, never from
// the state read.
func (e *env) stateUnread(qp ibv.QP) (string, error) {
	st, err := e.state(qp)
	if err != nil || st == ibv.QPSRTS {
		return "", err
	}
	why := fmt.Sprintf("QP %d in RTS reads %s, so its state cannot be read", qp.Num(), st)
	if e.iwarp {
		why += " (" + unreadState + ")"
	}
	return why, nil
}

// stateOrUnread reads qp's state, or says it cannot be read (unread, from
// stateUnread, not empty).
func (e *env) stateOrUnread(qp ibv.QP, unread string) (ibv.QPState, string, error) {
	if unread != "" {
		return 0, "unreadable", nil
	}
	st, err := e.state(qp)
	return st, st.String(), err
}

// ctxErr is the error of a wait that the probe's context ended.
func (e *env) ctxErr(what string) error {
	return fmt.Errorf("%s: %w", what, context.Cause(e.ctx))
}

// sleep lets d pass on the probe's clock, or fails when the probe's
// context ends first.
func (e *env) sleep(d time.Duration) error {
	if err := e.clk.Sleep(e.ctx, d); err != nil {
		return e.ctxErr("waiting for the device to settle")
	}
	return nil
}

// pollIdle is how long poll lets pass between empty polls, and the step a
// simulated clock takes at a time (stepped).
const pollIdle = 200 * time.Microsecond

// stepped is a simulated clock (a soft device's fabric) that lets time
// pass pollIdle at a time, yielding between steps: a device timer fires
// at its time, and a goroutine waiting on the device, such as the reaper
// of drain-wr, sees what it brought before the clock passes a deadline of
// its own, as it would in real time.
type stepped struct{ clock.Clock }

// Sleep lets d pass a step at a time, or returns ctx.Err() when ctx ends.
func (c stepped) Sleep(ctx context.Context, d time.Duration) error {
	for {
		step := min(d, pollIdle)
		if err := c.Clock.Sleep(ctx, step); err != nil {
			return err
		}
		if d -= step; d <= 0 {
			return nil
		}
		runtime.Gosched()
	}
}

// poll polls cq until it has returned n completions or d has passed on
// the probe's clock, and returns what it got: fewer than n is the device's
// doing, not an error. It fails only when a poll fails or the probe's
// context ends.
func (e *env) poll(cq ibv.CQ, n int, d time.Duration) ([]ibv.WC, error) {
	got := make([]ibv.WC, 0, n)
	batch := make([]ibv.WC, 16)
	deadline := e.clk.Now().Add(d)
	tellAt := e.tellAt(deadline)
	for len(got) < n {
		var k int
		err := e.verb("ibv_poll_cq", func() (err error) { k, err = cq.Poll(batch[:min(len(batch), n-len(got))]); return err })
		if err != nil {
			return got, fmt.Errorf("polling a CQ: %w", err)
		}
		got = append(got, batch[:k]...)
		if k > 0 {
			continue
		}
		now := e.clk.Now()
		left := deadline.Sub(now)
		if left <= 0 {
			break
		}
		if !tellAt.IsZero() && !now.Before(tellAt) {
			tellAt = time.Time{}
			e.tell(plural(n-len(got), "completion"), d)
		}
		if err := e.clk.Sleep(e.ctx, min(pollIdle, left)); err != nil {
			return got, e.ctxErr(fmt.Sprintf("polling for %d completions", n))
		}
	}
	return got, nil
}

// tellAt is when Options.OnWait hears of a wait that ends at deadline:
// LongWait after its start, when the wait is on the wall clock and may
// last longer; zero for none.
func (e *env) tellAt(deadline time.Time) time.Time {
	at := e.clk.Now().Add(LongWait)
	if e.o.OnWait == nil || !e.real || !at.Before(deadline) {
		return time.Time{}
	}
	return at
}

// tell calls Options.OnWait for a wait of up to d for what, unless the
// probe's context has ended (Probe.Run may have returned).
func (e *env) tell(what string, d time.Duration) {
	if e.ctx.Err() == nil {
		e.o.OnWait(Wait{Probe: e.name, For: what, Up: d})
	}
}

// plural is "1 completion", "2 completions".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// event is an async event of one of the probe's objects and when it came.
type event struct {
	ibv.AsyncEvent
	at time.Duration // since the mark
}

// events collects the async events of the probe's own objects for d, or
// until one satisfies until (nil: for all of d). Events of other objects
// are dropped. It fails only when the device fails or the context ends.
func (e *env) events(d time.Duration, until func(ibv.AsyncEvent) bool) ([]event, error) {
	var got []event
	deadline := e.clk.Now().Add(d)
	tellAt := e.tellAt(deadline)
	for {
		next := deadline
		if !tellAt.IsZero() {
			next = tellAt
		}
		ev, err := e.nextEvent(next)
		if err != nil {
			if e.ctx.Err() != nil {
				return got, e.ctxErr("waiting for async events")
			}
			if errors.Is(err, context.DeadlineExceeded) && !tellAt.IsZero() {
				tellAt = time.Time{}
				what := "async events"
				if until != nil {
					what = "an async event"
				}
				e.tell(what, d)
				continue
			}
			if errors.Is(err, context.DeadlineExceeded) {
				return got, nil
			}
			return got, fmt.Errorf("waiting for async events: %w", err)
		}
		if !e.owns(ev) {
			continue
		}
		got = append(got, event{ev, e.since()})
		if until != nil && until(ev) {
			return got, nil
		}
	}
}

// nextEvent returns the device's next async event, or an error wrapping
// context.DeadlineExceeded once deadline has passed on the probe's clock.
// On the wall clock it blocks until then; on a simulated one it asks for
// an event without waiting and lets a step pass while there is none,
// since a blocked caller would wait for time that only the probe moves.
func (e *env) nextEvent(deadline time.Time) (ibv.AsyncEvent, error) {
	if e.real {
		wctx, cancel := context.WithDeadline(e.ctx, deadline)
		defer cancel()
		return e.dev.NextAsyncEvent(wctx)
	}
	for {
		ev, err := e.dev.NextAsyncEvent(ended)
		if !errors.Is(err, context.Canceled) {
			return ev, err
		}
		left := deadline.Sub(e.clk.Now())
		if left <= 0 {
			return ibv.AsyncEvent{}, context.DeadlineExceeded
		}
		if err := e.clk.Sleep(e.ctx, min(pollIdle, left)); err != nil {
			return ibv.AsyncEvent{}, err
		}
	}
}

// ended is a context that has ended: NextAsyncEvent with it returns an
// event already there, or context.Canceled at once.
var ended = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// eventsThrough collects the probe's events until one satisfies until or
// Timeout has passed and, when one did, those that follow within Quiet.
func (e *env) eventsThrough(until func(ibv.AsyncEvent) bool) ([]event, error) {
	evs, err := e.events(e.o.Timeout, until)
	if err != nil || !hasEvent(evs, until) {
		return evs, err
	}
	more, err := e.events(e.o.Quiet, nil)
	return append(evs, more...), err
}

// isLastWQE matches the Last WQE Reached event of qp.
func isLastWQE(qp ibv.QP) func(ibv.AsyncEvent) bool {
	return func(ev ibv.AsyncEvent) bool { return ev.Type == ibv.EventQPLastWQEReached && ev.QP == qp }
}

func (e *env) owns(ev ibv.AsyncEvent) bool {
	for _, qp := range e.qps {
		if ev.QP != nil && ev.QP == qp {
			return true
		}
	}
	for _, srq := range e.srqs {
		if ev.SRQ != nil && ev.SRQ == srq {
			return true
		}
	}
	for _, cq := range e.cqs {
		if ev.CQ != nil && ev.CQ == cq {
			return true
		}
	}
	return false
}

// checkFlushed reports whether got are exactly the WRs want, in order, each
// completed with WR_FLUSH_ERR on QP qpn; if not, it says what came instead.
func checkFlushed(what string, want []uint64, got []ibv.WC, qpn uint32) (bool, string) {
	ok := len(got) == len(want)
	for i := 0; ok && i < len(got); i++ {
		ok = got[i].ID == want[i] && got[i].Status == ibv.WCWRFlushErr && got[i].QPNum == qpn
	}
	if ok {
		return true, ""
	}
	return false, fmt.Sprintf("%s: got %s, want wr_id %s each WR_FLUSH_ERR in this order", what, wcList(got, qpn), idList(want))
}

// wcList formats completions as "[1 WR_FLUSH_ERR, 2 SUCCESS]", naming the
// QP only when it is not qpn.
func wcList(wcs []ibv.WC, qpn uint32) string {
	if len(wcs) == 0 {
		return "nothing"
	}
	parts := make([]string, len(wcs))
	for i, wc := range wcs {
		parts[i] = fmt.Sprintf("%d %s", wc.ID, wc.Status)
		if wc.QPNum != qpn {
			parts[i] += fmt.Sprintf(" on qpn %d", wc.QPNum)
		}
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// withStatus counts the completions of wcs that have status s.
func withStatus(wcs []ibv.WC, s ibv.WCStatus) int {
	n := 0
	for _, wc := range wcs {
		if wc.Status == s {
			n++
		}
	}
	return n
}

func idList(ids []uint64) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprint(id)
	}
	return strings.Join(parts, ",")
}

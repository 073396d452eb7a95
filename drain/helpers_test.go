package drain_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/soft"
)

// The tests' own wr_ids: receives and sends in two ranges, so that a
// flushed completion (which carries no valid opcode) tells its queue.
const (
	recvIDBase uint64 = 1 << 32
	sendIDBase uint64 = 2 << 32
)

var queueOf = drain.QueueByIDPrefix(32, recvIDBase, sendIDBase)

// noLastWQE reports whether the test device raises no Last WQE Reached:
// rxe before Linux 6.5 (devtest.RXELastWQEReached), and iWARP (siw raises
// IB_EVENT_QP_LAST_WQE_REACHED nowhere in drivers/infiniband/sw/siw; the
// soft device's iWARP rules neither). There the drain of an SRQ QP can
// only end by its policy, and the tests that need the event skip.
func noLastWQE() bool { return devtest.RXELacks(devtest.RXELastWQEReached) || devtest.IWARP() }

func skipWithoutLastWQE(t *testing.T) {
	t.Helper()
	if noLastWQE() {
		t.Skip("the device raises no Last WQE Reached (rxe before Linux 6.5; iWARP: siw raises it nowhere in drivers/infiniband/sw/siw; docs/PROVIDERS.md)")
	}
}

// siwUserQPs reports whether the test device is siw, whose user QPs
// complete no WR posted in ERROR: siw_post_receive refuses a receive on a
// user QP (EINVAL, "no kernel post_recv for user mapped rq"), and a user
// QP's sends are written into its mapped send queue, which siw reads only
// in RTS, while siw_post_send in ERROR flushes only the WRs it is handed
// (drivers/infiniband/sw/siw/siw_verbs.c). The soft device's iWARP rules
// flush them.
func siwUserQPs() bool { return devtest.IWARP() && devtest.CurrentProvider() != devtest.ProviderSoft }

// siwNoDrainWR is why a test that needs a drain WR to complete skips on siw.
const siwNoDrainWR = "siw completes no drain WR posted on a user QP in ERROR (siw_verbs.c: siw_post_receive refuses it, siw_post_send flushes only the WRs it is handed, and a user QP's are in its mapped send queue): a siw QP is proven by counts (AddOptions.CountRecvs, CountSends; TestDisconnectDrain), docs/PROVIDERS.md"

// skipWithoutDrainWR skips the test on siw, whose user QPs never complete
// a send drain WR.
func skipWithoutDrainWR(t *testing.T) {
	t.Helper()
	if siwUserQPs() {
		t.Skip(siwNoDrainWR)
	}
}

// skipWithoutRecvDrainWR skips the test where a receive drain WR never
// completes: rxe before Linux 6.12 and siw.
func skipWithoutRecvDrainWR(t *testing.T) {
	t.Helper()
	skipWithoutDrainWR(t)
	if devtest.RXELacks(devtest.RXERecvInErrorFlushed) {
		t.Skip("rxe before Linux 6.12 never completes a receive posted in ERROR (docs/PROVIDERS.md)")
	}
}

// withSendCount is o for a test whose subject is not the send queue's
// proof: on siw, whose user QPs complete no send drain WR, the caller's
// count of the completions its send queue owes (none: these tests post no
// send), elsewhere o as it is, so that a drain WR proves it.
func withSendCount(o drain.AddOptions) drain.AddOptions {
	if siwUserQPs() {
		o.CountSends, o.Sends = true, 0
	}
	return o
}

// rig is a PD, the CQ of the QPs to drain, a CQ for their peers and an SRQ.
type rig struct {
	t      testing.TB
	dev    ibv.Context
	pd     ibv.PD
	cq     ibv.CQ
	peerCQ ibv.CQ
	srq    ibv.SRQ
	nRecv  uint64
	mr     ibv.MR // the buffer of receives on siw (postRecvs), made on first need
	// sendWR is the MaxSendWR of the QPs to drain, qpCap's when 0: 1 is an
	// IPoIB-CM receive QP's, whose send queue holds only the reaper's slot.
	sendWR uint32
}

func newRig(t testing.TB, dev ibv.Context, cq ibv.CQ, srqWR int) *rig {
	t.Helper()
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatalf("allocating PD: %v", err)
	}
	devtest.Close(t, pd)
	if cq == nil {
		cq = devtest.NewCQ(t, dev, 1024)
	}
	srq, err := pd.CreateSRQ(ibv.SRQAttr{MaxWR: uint32(srqWR), MaxSGE: 1})
	if err != nil {
		t.Fatalf("creating SRQ: %v", err)
	}
	devtest.Close(t, srq)
	return &rig{t: t, dev: dev, pd: pd, cq: cq, peerCQ: devtest.NewCQ(t, dev, 1024), srq: srq}
}

// toReset moves each QP to RESET, as a caller about to reuse it does.
func toReset(t testing.TB, qps ...ibv.QP) {
	t.Helper()
	for _, q := range qps {
		if err := q.Modify(ibv.QPAttr{State: ibv.QPSReset}, ibv.QPAttrState); err != nil {
			t.Fatal(err)
		}
	}
}

// wantEventForgotten drains qp, an SRQ QP in ERROR on a device that raises
// no Last WQE Reached, and fails unless the drain stalls for the event:
// the one rp was handed in an earlier episode (what) is not used.
func (r *rig) wantEventForgotten(rp *drain.Reaper, qp ibv.QP, what string) {
	r.t.Helper()
	h := add(r.t, rp, qp, drain.AddOptions{NoSends: true})
	pollAll(r.t, rp, r.cq)
	rep, err := h.Wait(testCtx(r.t))
	checkProof(r.t, rep)
	wantErr(r.t, err, drain.ErrNoLastWQE)
	if has(rep, report.StepLastWQEStated) {
		r.t.Errorf("%s was taken for the next episode:\n%s", what, rep)
	}
}

// newCQ creates a CQ of cqe entries on dev, on a completion channel of
// its own if channel (ch is nil otherwise), both closed when the test ends.
func newCQ(t testing.TB, dev ibv.Context, cqe int, channel bool) (ch ibv.CompChannel, cq ibv.CQ) {
	t.Helper()
	if channel {
		var err error
		if ch, err = dev.CreateCompChannel(); err != nil {
			t.Fatal(err)
		}
		devtest.Close(t, ch)
	}
	cq, err := dev.CreateCQ(cqe, ch)
	if err != nil {
		t.Fatal(err)
	}
	devtest.Close(t, cq)
	return ch, cq
}

// testRig is a rig on the test device (devtest.Open) with an SRQ of 64.
func testRig(t testing.TB) *rig {
	t.Helper()
	return newRig(t, devtest.Open(t), nil, 64)
}

// openSoft opens a soft device on the test's schedule, closed when the
// test ends.
func openSoft(t testing.TB, cfg soft.Config) *soft.Device {
	t.Helper()
	cfg.Schedule = devtest.Schedule(t)
	dev, err := soft.Open(cfg)
	if err != nil {
		t.Fatalf("opening soft device: %v", err)
	}
	devtest.Close(t, dev)
	return dev
}

var qpCap = ibv.QPCap{MaxSendWR: 32, MaxRecvWR: 32, MaxSendSGE: 1, MaxRecvSGE: 1}

// qpConfig sizes a QP on the rig's CQ, from the SRQ if srq.
func (r *rig) qpConfig(srq bool) devtest.RCConfig {
	cfg := devtest.RCConfig{SendCQ: r.cq, Cap: qpCap}
	if r.sendWR != 0 {
		cfg.Cap.MaxSendWR = r.sendWR
	}
	if srq {
		cfg.SRQ = r.srq
	}
	return cfg
}

// newQP creates a QP on the rig's CQ, from the SRQ if srq, in RESET.
func (r *rig) newQP(srq bool) ibv.QP { return devtest.NewRC(r.t, r.pd, r.qpConfig(srq)) }

// pair creates a QP to drain and a peer, connected in RTS.
func (r *rig) pair(srq bool) ibv.QP {
	r.t.Helper()
	qp, _ := r.pairAndPeer(srq)
	return qp
}

// pairAndPeer is pair, returning the peer too.
func (r *rig) pairAndPeer(srq bool) (qp, peer ibv.QP) {
	r.t.Helper()
	return devtest.Pair(r.t, r.pd, r.qpConfig(srq), devtest.RCConfig{SendCQ: r.peerCQ, Cap: qpCap})
}

// pairs creates n pairs.
func (r *rig) pairs(n int, srq bool) []ibv.QP {
	qps := make([]ibv.QP, n)
	for i := range qps {
		qps[i] = r.pair(srq)
	}
	return qps
}

// ownPairs is n connected pairs whose QPs have their own receive queue,
// each with recvs receives posted.
func (r *rig) ownPairs(n, recvs int) []ibv.QP {
	qps := r.pairs(n, false)
	for _, qp := range qps {
		r.postRecvs(qp, recvs)
	}
	return qps
}

// postRecvs posts n receives on qp's receive queue, or on the SRQ when qp
// is nil.
func (r *rig) postRecvs(qp ibv.QP, n int) {
	r.t.Helper()
	wrs := make([]ibv.RecvWR, n)
	for i := range wrs {
		wrs[i].ID = recvIDBase | r.nRecv
		r.nRecv++
		if siwUserQPs() {
			// siw0 refused a receive with no SGE (EINVAL, observed on
			// 6.12); the others take one, which zero-length SENDs fill.
			if r.mr == nil {
				r.mr = devtest.Buffer(r.t, r.pd, 4096, devtest.AllAccess)
			}
			wrs[i].SGL = []ibv.SGE{{Addr: r.mr.Addr(), Length: 64, LKey: r.mr.LKey()}}
		}
	}
	var err error
	if qp == nil {
		err = r.srq.PostRecv(wrs)
	} else {
		err = qp.PostRecv(wrs)
	}
	if err != nil {
		r.t.Fatalf("posting %d receives: %v", n, err)
	}
}

// caller is a caller's own poll and event loop: it hands every completion
// and event to the reaper and keeps what the reaper does not claim.
type caller struct {
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	wcs     []ibv.WC
	claimed int
	events  []ibv.AsyncEvent
	err     error
}

// startCaller runs a caller loop until the test ends (or stop).
func startCaller(t testing.TB, rp *drain.Reaper, cq ibv.CQ, dev ibv.Context) *caller {
	ctx, cancel := context.WithCancel(context.Background())
	c := &caller{cancel: cancel}
	c.wg.Go(func() {
		wcs := make([]ibv.WC, 16)
		for ctx.Err() == nil {
			n, err := cq.Poll(wcs)
			if err != nil {
				c.fail(err)
				return
			}
			if n == 0 {
				rp.CQEmpty()
				time.Sleep(50 * time.Microsecond)
			}
			c.take(rp, wcs[:n])
		}
	})
	c.wg.Go(func() {
		for {
			ev, err := dev.NextAsyncEvent(ctx)
			if err != nil {
				if ctx.Err() == nil {
					c.fail(err)
				}
				return
			}
			if !rp.HandleEvent(ev) {
				c.mu.Lock()
				c.events = append(c.events, ev)
				c.mu.Unlock()
			}
		}
	})
	t.Cleanup(c.stop)
	return c
}

func (c *caller) take(rp *drain.Reaper, wcs []ibv.WC) {
	for _, wc := range wcs {
		claimed := rp.HandleWC(wc)
		c.mu.Lock()
		if claimed {
			c.claimed++
		} else {
			c.wcs = append(c.wcs, wc)
		}
		c.mu.Unlock()
	}
}

func (c *caller) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
	}
}

func (c *caller) stop() {
	c.cancel()
	c.wg.Wait()
}

// pollAll polls cq empty, handing each completion to rp, from the test's
// goroutine: a deterministic caller loop.
func pollAll(t testing.TB, rp *drain.Reaper, cq ibv.CQ) (kept []ibv.WC, claimed int) {
	t.Helper()
	wcs := make([]ibv.WC, 16)
	for {
		n, err := cq.Poll(wcs)
		if err != nil {
			t.Fatalf("polling: %v", err)
		}
		if n == 0 {
			rp.CQEmpty()
			checkInFlight(t, rp)
			return kept, claimed
		}
		for _, wc := range wcs[:n] {
			if rp.HandleWC(wc) {
				claimed++
			} else {
				kept = append(kept, wc)
			}
		}
	}
}

// pollUntilDone is a caller's poll loop run from the test's goroutine until
// the reaper has nothing pending: on a device that completes
// asynchronously (rxe), one pass may come before the completions do.
func pollUntilDone(t testing.TB, rp *drain.Reaper, cq ibv.CQ) (kept []ibv.WC, claimed int) {
	t.Helper()
	deadline := time.Now().Add(devtest.Timeout)
	for rp.Stats().Pending > 0 {
		k, c := pollAll(t, rp, cq)
		kept, claimed = append(kept, k...), claimed+c
		if time.Now().After(deadline) {
			t.Fatalf("drains pending after %v: %+v", devtest.Timeout, rp.Stats())
		}
		if len(k)+c == 0 {
			time.Sleep(100 * time.Microsecond)
		}
	}
	return kept, claimed
}

// handEvents reads the device's pending events (waiting up to d for the
// first ones) and hands them to rp; it returns the unclaimed ones.
func handEvents(t testing.TB, rp *drain.Reaper, dev ibv.Context, n int) (kept []ibv.AsyncEvent) {
	t.Helper()
	for range n {
		ev := devtest.WaitEvent(t, dev, devtest.Timeout)
		if !rp.HandleEvent(ev) {
			kept = append(kept, ev)
		}
	}
	return kept
}

// kinds lists the kinds of a report's steps.
func kinds(rep *report.Report) []report.StepKind {
	steps := rep.Steps()
	out := make([]report.StepKind, len(steps))
	for i, s := range steps {
		out[i] = s.Kind
	}
	return out
}

// inOrder reports whether want appears in got as a subsequence.
func inOrder(got, want []report.StepKind) bool {
	i := 0
	for _, k := range got {
		if i < len(want) && k == want[i] {
			i++
		}
	}
	return i == len(want)
}

func has(rep *report.Report, k report.StepKind) bool {
	for _, s := range rep.Steps() {
		if s.Kind == k {
			return true
		}
	}
	return false
}

// waitAll waits for every handle and fails the test on an error.
func waitAll(t testing.TB, hs []*drain.Handle) []*report.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), devtest.Timeout)
	defer cancel()
	reps := make([]*report.Report, len(hs))
	for i, h := range hs {
		rep, err := h.Wait(ctx)
		if err != nil {
			t.Fatalf("draining qpn %d: %v\n%s", h.QP().Num(), err, rep)
		}
		checkProof(t, rep)
		reps[i] = rep
	}
	return reps
}

// counted states that a QP has no receive outstanding on its own receive
// queue (ignored for an SRQ QP): the receive queue needs no receive drain
// WR, which rxe before Linux 6.12 never flushes (docs/PROVIDERS.md).
var counted = drain.AddOptions{CountRecvs: true}

// checkProof checks a report's outcome against its proofs: a safe report
// has a proof for every queue, each backed by the step it names; a QP
// released by the policy names what was missing.
func checkProof(t testing.TB, rep *report.Report) {
	t.Helper()
	if rep == nil {
		return
	}
	steps := rep.Steps()
	index := func(k report.StepKind, id uint64) int {
		for i, s := range steps {
			if s.Kind == k && (id == 0 || s.WRID == id) {
				return i
			}
		}
		return -1
	}
	switch rep.Outcome {
	case report.Safe:
		if !rep.Proven() {
			t.Errorf("qpn %d is safe without a proof for every queue:\n%s", rep.QPNum, rep)
		}
	case report.DestroyedAfterEmptyCQ:
		if rep.Proven() || rep.Stall == nil {
			t.Errorf("qpn %d released by the policy with every queue proven or no stall:\n%s", rep.QPNum, rep)
		}
	}
	for _, p := range []report.QueueProof{rep.Recv, rep.Send} {
		ok := true
		switch p.By {
		case report.ProofNone:
			ok = rep.Outcome == report.Pending || p.Missing != report.MissingNothing
		case report.ProofSendDrainWR:
			done := index(report.StepDrainDone, p.WRID)
			ok = done >= 0 && p.Carrier == rep.QPNum && steps[done].Carrier == rep.QPNum
		case report.ProofBarrier:
			done := index(report.StepDrainDone, p.WRID)
			seen := index(report.StepEvent, 0)
			if p.Stated {
				seen = index(report.StepLastWQEStated, 0)
			}
			ok = rep.SRQ && done >= 0 && seen >= 0 && seen < done
		case report.ProofRecvDrainWR:
			ok = !rep.SRQ && index(report.StepRecvDrainDone, p.WRID) >= 0
		case report.ProofRecvCount, report.ProofSendCount:
			// Counted back, past earlier QPs with the number: a poll
			// found the CQ empty first, or the caller stated the QP the
			// only one on it.
			q := report.QueueRecv
			if p.By == report.ProofSendCount {
				q = report.QueueSend
			}
			past := index(report.StepCQEmpty, 0) >= 0
			if p.Stated {
				past = index(report.StepSoleQPStated, 0) >= 0
			}
			ok = (q == report.QueueSend || !rep.SRQ) && rep.Flushed[q].Flushed+rep.Flushed[q].Other >= p.Count && (past || p.Count == 0)
		case report.ProofNoSends:
		default:
			ok = false
		}
		if !ok {
			t.Errorf("qpn %d: proof %v not backed by the report:\n%s", rep.QPNum, p, rep)
		}
	}
}

// checkInFlight fails t unless every drain WR rp counts against its
// headroom is one it can still match to its completion: a WR whose ID was
// overwritten would hold its slot for good.
func checkInFlight(t testing.TB, rp *drain.Reaper) {
	t.Helper()
	if err := rp.CheckInFlight(); err != nil {
		t.Fatal(err)
	}
}

func add(t testing.TB, rp *drain.Reaper, qp ibv.QP, o drain.AddOptions) *drain.Handle {
	t.Helper()
	h, err := rp.Add(qp, o)
	if err != nil {
		t.Fatalf("adding qpn %d: %v", qp.Num(), err)
	}
	return h
}

func wantErr(t testing.TB, err error, targets ...error) {
	t.Helper()
	for _, target := range targets {
		if !errors.Is(err, target) {
			t.Errorf("error %v: want errors.Is(err, %v)", err, target)
		}
	}
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }

// newReaper is drain.NewReaper for a test, which it fails on an error.
func newReaper(t testing.TB, cq ibv.CQ, o drain.Options) *drain.Reaper {
	t.Helper()
	rp, err := drain.NewReaper(cq, o)
	if err != nil {
		t.Fatal(err)
	}
	return rp
}

// drainQP is drain.DrainAll of qp alone: its report, and the error.
func drainQP(ctx context.Context, qp ibv.QP, add drain.AddOptions, o drain.Options, f drain.Feed) (*report.Report, error) {
	reps, err := drain.DrainAll(ctx, []ibv.QP{qp}, add, o, f)
	if len(reps) == 0 {
		return nil, err
	}
	return reps[0], err
}

// drainWith drains qps on rp, which the caller feeds: AddAll, then Wait
// on each handle, the last first (the QPs end about in the order they
// were added). A QP AddAll refused has no report.
func drainWith(ctx context.Context, rp *drain.Reaper, qps []ibv.QP, add drain.AddOptions) ([]*report.Report, error) {
	hs, err := rp.AddAll(qps, add)
	errs := []error{err}
	reps := make([]*report.Report, len(qps))
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i] != nil {
			var e error
			reps[i], e = hs[i].Wait(ctx)
			errs = append(errs, e)
		}
	}
	return reps, errors.Join(errs...)
}

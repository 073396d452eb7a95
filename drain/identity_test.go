package drain_test

import (
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

// The bodies in this file are the schedules where a proof could be taken
// from the wrong QP, episode or reaper: QP numbers reused while the old
// QP's completions are still in the CQ, a QP object reused through RESET,
// a reaper replaced on its CQ with drain WRs outstanding, and a released
// QP's drain WR under DestroyWhenEmpty. They run on the soft device, which
// can say what is still outstanding (soft.QP.Outstanding), and under its
// adversarial schedules in TestExplore.

// stepper is a caller's poll and event loop run one step at a time from
// the test's goroutine, so that nothing moves between a drain's outcome and
// the check of it: at every outcome Safe the QP must have nothing
// outstanding, no completion of it may be polled after that, and at every other outcome that lets the QP go the caller
// destroys it at once, as it may.
type stepper struct {
	t    *testing.T
	rp   *drain.Reaper
	cq   ibv.CQ
	dev  ibv.Context
	soft map[*drain.Handle]*soft.QP
	done map[*drain.Handle]bool
	// byNum names the watched drain each QP number stands for now.
	byNum map[uint32]*drain.Handle
	// lastWQE counts the Last WQE Reached events handed over, claimed or not.
	lastWQE map[ibv.QP]int
	// lag, if set, says which events the loop holds back (held) instead
	// of handing them over: an event loop that lags.
	lag  func(ibv.AsyncEvent) bool
	held []ibv.AsyncEvent
}

func newStepper(t *testing.T, rp *drain.Reaper, cq ibv.CQ, dev ibv.Context) *stepper {
	return &stepper{t: t, rp: rp, cq: cq, dev: dev, soft: map[*drain.Handle]*soft.QP{}, done: map[*drain.Handle]bool{}, byNum: map[uint32]*drain.Handle{}, lastWQE: map[ibv.QP]int{}}
}

// watch checks h's QP (the soft QP behind it) at h's outcome.
func (s *stepper) watch(h *drain.Handle, qp *soft.QP) {
	s.soft[h] = qp
	s.byNum[qp.Num()] = h
}

// step polls one completion (an empty poll is CQEmpty), hands over every
// deliverable event, and checks the drains that ended.
func (s *stepper) step() {
	s.t.Helper()
	wc := make([]ibv.WC, 1)
	n, err := s.cq.Poll(wc)
	if err != nil {
		s.t.Fatal(err)
	}
	if n == 0 {
		s.rp.CQEmpty()
	} else {
		if h := s.byNum[wc[0].QPNum]; h != nil && h.Report().Outcome == report.Safe {
			s.t.Errorf("false safe: completion wr_id %#x of qpn %d polled after it was called safe:\n%s", wc[0].ID, wc[0].QPNum, h.Report())
		}
		s.rp.HandleWC(wc[0])
	}
	s.check()
	now := endedCtx()
	for {
		ev, err := s.dev.NextAsyncEvent(now)
		if err != nil {
			break
		}
		if s.lag != nil && s.lag(ev) {
			s.held = append(s.held, ev)
			continue
		}
		s.handEvent(ev)
	}
}

// handEvent hands ev over and checks the drains that ended.
func (s *stepper) handEvent(ev ibv.AsyncEvent) {
	s.t.Helper()
	if ev.Type == ibv.EventQPLastWQEReached {
		s.lastWQE[ev.QP]++
	}
	s.rp.HandleEvent(ev)
	s.check()
}

// catchUp hands over the events the loop held back, oldest first.
func (s *stepper) catchUp() {
	s.t.Helper()
	held := s.held
	s.held = nil
	for _, ev := range held {
		s.handEvent(ev)
	}
}

// check looks at every watched drain that has just ended.
func (s *stepper) check() {
	s.t.Helper()
	for h, qp := range s.soft {
		if s.done[h] {
			continue
		}
		select {
		case <-h.Done():
		default:
			continue
		}
		s.done[h] = true
		rep := h.Report()
		checkProof(s.t, rep)
		switch {
		case rep.Outcome == report.Safe:
			if left := qp.Outstanding(); left != 0 {
				s.t.Errorf("false safe: qpn %d called safe with %d WRs still to complete:\n%s", rep.QPNum, left, rep)
			}
		case rep.Outcome != report.Quarantined:
			// Handed back: the caller may destroy it now.
			if err := h.Destroy(); err != nil {
				s.t.Error(err)
			}
		}
	}
}

// until steps until cond holds, at most devtest.Timeout.
func (s *stepper) until(what string, cond func() bool) {
	s.t.Helper()
	deadline := time.Now().Add(devtest.Timeout)
	for !cond() {
		if time.Now().After(deadline) {
			s.t.Fatalf("%s: not within %v: %+v", what, devtest.Timeout, s.rp.Stats())
		}
		s.step()
	}
}

// settled reports whether every watched drain has ended.
func (s *stepper) settled() bool {
	for h := range s.soft {
		if !s.done[h] {
			return false
		}
	}
	return true
}

// identityRig is a soft device on the test's schedule whose SRQ QPs take 2
// WQEs ahead, its rig, and 64 receives on the SRQ.
func identityRig(t *testing.T, q soft.Quirks) *rig {
	dev := openSoft(t, soft.Config{Quirks: q, SRQPrefetch: 2})
	r := newRig(t, dev, nil, 256)
	r.postRecvs(nil, 64)
	return r
}

// A QP number reused while the completions of the QP that had it are still
// in the CQ: the old QP's completions are not the new QP's. One old QP is
// the caller's own, destroyed in ERROR with flushes not yet polled, and
// the new QP with its number counts its receives; the other was another
// reaper's, shut down with its drain WRs outstanding, and the new QP with
// its number gets drain WRs. The reaper before QP numbers and drain WRs
// were tied to their QP counted the old flushes for the new QP and took
// the old drain WRs for the new ones: false safes.
func TestReusedNumberInFlight(t *testing.T) {
	r := identityRig(t, soft.Quirks{})
	opts := drain.Options{DrainTimeout: devtest.Timeout, Queue: queueOf}
	rp := newReaper(t, r.cq, opts)
	s := newStepper(t, rp, r.cq, r.dev)
	for range 3 {
		old := r.pair(false)
		r.postRecvs(old, 8)
		sends(t, old, 0, 2)
		devtest.ToError(t, old)
		r.destroyLater(old, old.Close)
		qp := r.pair(false)
		r.postRecvs(qp, 4)
		s.watch(add(t, rp, qp, drain.AddOptions{CountRecvs: true, Recvs: 4, NoSends: true}), qp.(*soft.QP))
		s.until("the counted QP's outcome", s.settled)

		// Room beside the drain WRs the last round's other reaper left.
		wide := opts
		wide.Headroom = 4
		other := newReaper(t, r.cq, wide)
		old = r.pair(false)
		r.postRecvs(old, 2)
		h := add(t, other, old, drain.AddOptions{})
		other.Shutdown(endedCtx())
		r.destroyLater(old, h.Destroy)
		qp = r.pair(false)
		r.postRecvs(qp, 4)
		s.watch(add(t, rp, qp, drain.AddOptions{}), qp.(*soft.QP))
		s.until("the drained QP's outcome", s.settled)
	}
}

// destroyLater destroys qp with destroy after a few posts to it, in which
// an adversarial schedule generates some of its flushes: they stay in the
// CQ.
func (r *rig) destroyLater(qp ibv.QP, destroy func() error) {
	r.t.Helper()
	for range 4 {
		r.postRecvs(qp, 1)
	}
	if err := destroy(); err != nil {
		r.t.Fatal(err)
	}
}

// A QP object reused through RESET, with the event history on: the Last
// WQE Reached of its first error episode is no proof for the second, whose
// WQEs taken from the SRQ the reaper must still see flushed. The reaper
// before episodes took the old event and declared the QP safe with its new
// WQEs still to be flushed.
func TestReusedQPEpisode(t *testing.T) {
	r := identityRig(t, soft.Quirks{})
	rp := newReaper(t, r.cq, drain.Options{LastWQETimeout: devtest.Timeout, DrainTimeout: devtest.Timeout, Queue: queueOf})
	s := newStepper(t, rp, r.cq, r.dev)
	qp, peer := r.pairAndPeer(true)
	devtest.ToError(t, qp)
	s.until("the first episode's Last WQE Reached", func() bool { return s.lastWQE[qp] == 1 })
	toReset(t, qp, peer)
	devtest.Connect(t, r.dev, qp, peer)
	devtest.ToError(t, qp)
	h := add(t, rp, qp, drain.AddOptions{NoSends: true})
	s.watch(h, qp.(*soft.QP))
	s.until("the second episode's drain", s.settled)
	if rep := h.Report(); rep.Outcome != report.Safe {
		t.Errorf("second episode: %s, want safe\n%s", rep.Outcome, rep)
	}
}

// A QP object reused through RESET while the event loop lags: the
// provider's second Last WQE Reached of the first episode (rxe 6.12 raises
// it twice; others again on a post in ERROR) reaches the reaper only after
// the QP was reset, took WQEs from the SRQ again and was added again. It
// is no proof for the second episode, whose taken WQEs may still be
// flushing. The reaper before error episodes were numbered
// (ibv.QP.Resets) took it: a false safe on 26 (twice) and 31 (again) of
// 300 adversarial seeds.
func TestReusedQPLateEvent(t *testing.T) {
	for _, c := range []struct {
		name string
		q    soft.Quirks
	}{{"Twice", soft.Quirks{LastWQEReachedTwice: true}}, {"Again", soft.Quirks{LastWQEReachedAgain: true}}} {
		t.Run(c.name, func(t *testing.T) {
			r := identityRig(t, c.q)
			rp := newReaper(t, r.cq, drain.Options{LastWQETimeout: devtest.Timeout, DrainTimeout: devtest.Timeout, Queue: queueOf})
			s := newStepper(t, rp, r.cq, r.dev)
			qp, peer := r.pairAndPeer(true)
			// Every Last WQE Reached of qp after the first waits.
			s.lag = func(ev ibv.AsyncEvent) bool {
				return ev.Type == ibv.EventQPLastWQEReached && ev.QP == qp && s.lastWQE[qp] > 0
			}
			s.watch(add(t, rp, qp, drain.AddOptions{NoSends: true}), qp.(*soft.QP))
			s.until("the first episode's drain", s.settled)
			toReset(t, qp, peer)
			devtest.Connect(t, r.dev, qp, peer)
			s.lag = nil
			h := add(t, rp, qp, drain.AddOptions{NoSends: true})
			s.watch(h, qp.(*soft.QP))
			s.catchUp()
			s.until("the second episode's drain", s.settled)
			if rep := h.Report(); rep.Outcome != report.Safe {
				t.Errorf("second episode: %s, want safe\n%s", rep.Outcome, rep)
			}
		})
	}
}

// A reaper shut down with drain WRs outstanding and a new one started on
// the same CQ, as ipoibcm's bounded policy once did between rounds: the old
// reaper's drain WRs, completing late, are none of the new reaper's. The
// reapers before drain WR IDs were unique per CQ numbered theirs from the
// same start, and the new reaper took the old WR's completion for its own
// QP's: a false safe.
func TestReaperReplaced(t *testing.T) {
	r := identityRig(t, soft.Quirks{})
	opts := drain.Options{DrainTimeout: devtest.Timeout, Headroom: 4, Queue: queueOf}
	first := newReaper(t, r.cq, opts)
	var olds []*drain.Handle
	for range 2 {
		qp := r.pair(false)
		r.postRecvs(qp, 2)
		olds = append(olds, add(t, first, qp, drain.AddOptions{}))
	}
	if back := first.Shutdown(endedCtx()); len(back) != len(olds) {
		t.Fatalf("Shutdown handed back %d QPs, want %d", len(back), len(olds))
	}
	rp := newReaper(t, r.cq, opts)
	s := newStepper(t, rp, r.cq, r.dev)
	for range 2 {
		qp := r.pair(false)
		r.postRecvs(qp, 4)
		h := add(t, rp, qp, drain.AddOptions{})
		s.watch(h, qp.(*soft.QP))
	}
	s.until("the new reaper's drains", s.settled)
	if st := rp.Stats(); st.Safe != 2 {
		t.Errorf("stats %+v: want both QPs safe", st)
	}
}

// countingQP counts, for the headroom check, the drain WRs posted on a
// soft QP whose completions can still take a CQ slot.
type countingQP struct {
	*soft.QP
	o *occupancy
}

// occupancy is the number of drain WRs that hold or may still take a CQ
// slot: posted, not polled, on a QP not destroyed since (a destroyed QP's
// unflushed WRs complete never). The drain WRs here are each QP's only WR.
// The poll loop, the reaper's posts and the caller's destroys may update it
// from different goroutines.
type occupancy struct {
	t        *testing.T
	headroom int
	mu       sync.Mutex
	live     map[uint64]*soft.QP // drain WR -> the QP it was posted on
}

// stallTimeout is the DrainTimeout of stallingDestroyWhenEmpty's reaper.
const stallTimeout = 20 * time.Millisecond

// stallingDestroyWhenEmpty is a rig on a device whose drain WRs never
// complete (eHCA's), with 64 receives on its SRQ, a reaper on its CQ with
// DestroyWhenEmpty, Headroom 1 and stallTimeout, and the occupancy check
// of that headroom.
func stallingDestroyWhenEmpty(t *testing.T) (*rig, *drain.Reaper, *occupancy) {
	dev := openSoft(t, soft.Config{Quirks: soft.Quirks{SendInErrorNotFlushed: true}})
	r := newRig(t, dev, nil, 64)
	rp := newReaper(t, r.cq, drain.Options{Policy: drain.DestroyWhenEmpty, DrainTimeout: stallTimeout, Queue: queueOf})
	return r, rp, newOccupancy(t, 1)
}

func newOccupancy(t *testing.T, headroom int) *occupancy {
	return &occupancy{t: t, headroom: headroom, live: map[uint64]*soft.QP{}}
}

func (q countingQP) PostSend(wrs []ibv.SendWR) error {
	if err := q.QP.PostSend(wrs); err != nil {
		return err
	}
	q.o.mu.Lock()
	defer q.o.mu.Unlock()
	for _, wr := range wrs {
		if drain.IsDrainWRID(wr.ID) {
			q.o.live[wr.ID] = q.QP
		}
	}
	q.o.measure()
	return nil
}

// Close destroys the QP, which takes its unflushed drain WRs off the count.
func (q countingQP) Close() error {
	q.o.destroyed(q.QP)
	return q.QP.Close()
}

// measure checks the count; o.mu must be held.
func (o *occupancy) measure() {
	o.t.Helper()
	if len(o.live) > o.headroom {
		o.t.Errorf("%d drain WRs may take a CQ slot at once, headroom %d", len(o.live), o.headroom)
	}
}

// polled and destroyed keep the count.
func (o *occupancy) polled(id uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.live, id)
}

func (o *occupancy) destroyed(qp *soft.QP) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if qp.Outstanding() == 0 {
		return // its drain WR completed into the CQ: it holds a slot until polled
	}
	for id, q := range o.live {
		if q == qp {
			delete(o.live, id)
		}
	}
}

// Slow drain WRs under DestroyWhenEmpty, the CQ occupancy checked against
// Headroom at every post: a QP released after an empty poll keeps its
// drain WR's headroom slot until the caller destroyed it (here at once,
// from the poll loop) and a poll after that found the CQ empty. The
// reaper before counted the slot free at the release and posted the next
// QP's drain WR in the same call: two drain WRs that could take a CQ slot,
// headroom 1.
func TestDestroyWhenEmptyHeadroom(t *testing.T) {
	r, rp, o := stallingDestroyWhenEmpty(t)
	var hs []*drain.Handle
	var destroyed []bool
	wc := make([]ibv.WC, 1)
	check := func() {
		for i, h := range hs {
			select {
			case <-h.Done():
			default:
				continue
			}
			if !destroyed[i] {
				checkProof(t, h.Report())
				if err := h.Destroy(); err != nil {
					t.Fatal(err)
				}
				destroyed[i] = true
			}
		}
	}
	deadline := time.Now().Add(devtest.Timeout)
	next := time.Now()
	for len(hs) < 4 || rp.Stats().Pending > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("drains pending after %v: %+v", devtest.Timeout, rp.Stats())
		}
		if len(hs) < 4 && time.Now().After(next) {
			// One QP every half DrainTimeout: each waits for the headroom
			// the one before holds.
			hs = append(hs, add(t, rp, countingQP{r.pair(false).(*soft.QP), o}, counted))
			destroyed = append(destroyed, false)
			next = time.Now().Add(stallTimeout / 2)
		}
		n, err := r.cq.Poll(wc)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			rp.CQEmpty()
		} else {
			o.polled(wc[0].ID)
			rp.HandleWC(wc[0])
		}
		check()
	}
	if st := rp.Stats(); st.DrainWRs < 2 || st.AfterEmptyCQ+st.Failed != 4 {
		t.Errorf("stats %+v: want every QP handed back, at least 2 of them with a drain WR", st)
	}
	// Released after an empty poll, or, where a loaded host starved this
	// loop past the empty poll's own bound (DrainTimeout), failed for want
	// of one: handed back and destroyed either way, which is what the
	// occupancy is about.
	for _, h := range hs {
		if rep := h.Report(); rep.Outcome == report.Failed && !errors.Is(rep.Err, drain.ErrCQNotEmpty) {
			t.Errorf("qpn %d failed: %v, want released after an empty poll\n%s", rep.QPNum, rep.Err, rep)
		}
	}
}

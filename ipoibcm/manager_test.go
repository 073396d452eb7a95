package ipoibcm

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/soft"
)

func TestAcceptLive(t *testing.T) {
	for _, noSRQ := range []bool{false, true} {
		t.Run(map[bool]string{false: "srq", true: "nonsrq"}[noSRQ], func(t *testing.T) {
			r := newRig(t, nil, Config{NoSRQ: noSRQ})
			c, peer := r.connect()
			if s := devtest.State(t, c.qp); s != ibv.QPSRTS {
				t.Errorf("RX QP in %s, want RTS", s)
			}
			if c.List() != ListPassive || c.State() != StateLive {
				t.Errorf("on %s in %s, want passive_ids in LIVE", c.List(), c.State())
			}
			r.send(peer)
			r.wantKinds(c.QPNum(), EventAccepted)
			if got := r.m.Snapshot(); got.QPs != 1 || !slices.Equal(got.Lists[ListPassive], []uint32{c.QPNum()}) {
				t.Errorf("snapshot %+v", got)
			}
		})
	}
}

// Activity moves a connection to the head of passive_ids, but at most every
// UpdateTime and only for receives whose ring index has the mask bits clear.
func TestActivityRefreshesLRU(t *testing.T) {
	r := newRig(t, nil, Config{UpdateTime: time.Minute, RecvQueueSize: 4})
	a, peerA := r.connect()
	b, _ := r.connect()
	order := func() []uint32 { s := r.m.Snapshot(); return s.Lists[ListPassive] }
	if want := []uint32{b.QPNum(), a.QPNum()}; !slices.Equal(order(), want) {
		t.Fatalf("passive_ids %v, want %v", order(), want)
	}
	// Too soon: the stamp is not refreshed, a stays behind b.
	r.send(peerA)
	if want := []uint32{b.QPNum(), a.QPNum()}; !slices.Equal(order(), want) {
		t.Errorf("after a receive within UpdateTime: passive_ids %v, want %v", order(), want)
	}
	r.clock.Advance(time.Minute)
	// The SRQ hands out slots in order: the next receive is slot 1 (mask
	// bits set, no refresh), then 2, 3, then 0 refreshes.
	for range 3 {
		r.send(peerA)
	}
	if want := []uint32{b.QPNum(), a.QPNum()}; !slices.Equal(order(), want) {
		t.Errorf("after receives in slots with the update mask set: passive_ids %v, want %v", order(), want)
	}
	r.send(peerA)
	if want := []uint32{a.QPNum(), b.QPNum()}; !slices.Equal(order(), want) {
		t.Errorf("after a receive in slot 0 past UpdateTime: passive_ids %v, want %v", order(), want)
	}
}

// Kernel policy, SRQ: a DREQ moves the QP to ERROR without moving the
// entry; Last WQE Reached moves it to the flush list, the drain WR to the
// drain list, its completion to the reap list, and the reap destroys it.
func TestKernelDisconnectDrainReap(t *testing.T) {
	r := newRig(t, nil, Config{})
	c, peer := r.connect()
	r.send(peer)
	r.disconnect(c)
	if s := devtest.State(t, c.qp); s != ibv.QPSErr {
		t.Errorf("after DREQ the RX QP is in %s, want ERR", s)
	}
	if c.List() != ListPassive {
		t.Errorf("after DREQ on %s, want passive_ids (ipoib_cm_rx_handler moves no entry)", c.List())
	}
	if !lastWQEReached() {
		// rxe before 6.5: no Last WQE Reached, so the kernel's policy
		// never reaps the QP.
		r.quiet("no Last WQE Reached: the QP stays", time.Second, func() bool { return c.List() == ListPassive })
		return
	}
	r.until("reaped", func() bool { return c.List() == ListNone })
	r.wantKernelDrain(c.QPNum(), EventAccepted, EventDisconnect)
	if st := r.m.Stats(); st.Reaped != 1 || st.DrainWRs < 1 || st.DrainWRs > 1 && !repeatsLastWQE() || st.LateWCs != 0 {
		t.Errorf("stats %+v, want 1 reaped, 1 drain WR, no late completion", st)
	}
}

// The Bounded policy on the test device: Last WQE Reached hands the QP to
// the reaper, whose drain WR proves it finished. Without the event (rxe
// before 6.5) the Manager's wait for it ends after LastWQETimeout of the
// clock, the reaper's own after LastWQETimeout more, and the QP is given
// up and destroyed at the first empty poll begun after that stall, which
// on the virtual clock means one begun later on it.
func TestBoundedDisconnectReap(t *testing.T) {
	testBoundedDisconnectReap(t, nil)
}

// TestBoundedDisconnectReapNoLastWQE: the same on a soft device that never
// raises Last WQE Reached, so that the path of rxe before 6.5 is run on
// every test device.
func TestBoundedDisconnectReapNoLastWQE(t *testing.T) {
	testBoundedDisconnectReap(t, softDevice(t, soft.Quirks{NoLastWQEReached: true}))
}

func testBoundedDisconnectReap(t *testing.T, dev ibv.Context) {
	r := newRig(t, dev, Config{Policy: Bounded})
	raises := dev == nil && lastWQEReached()
	c, peer := r.connect()
	r.send(peer)
	r.disconnect(c)
	if c.List() != ListError && c.List() != ListDrain && c.List() != ListNone {
		t.Errorf("after DREQ on %s, want rx_error_list (or further)", c.List())
	}
	if !raises {
		r.quiet("waiting for Last WQE Reached", 200*time.Millisecond, func() bool { return c.List() == ListError })
		r.advance(drain.DefaultLastWQETimeout)
		for i := 0; i < 2*int(drain.DefaultLastWQETimeout/time.Second) && c.List() != ListNone; i++ {
			r.advance(time.Second)
		}
	}
	r.until("reaped", func() bool { return c.List() == ListNone })
	if raises {
		r.wantKinds(c.QPNum(), EventAccepted, EventDisconnect, EventLastWQE, EventDrainPosted, EventDrained, EventReaped)
	} else {
		// No proof of the SRQ side can come: given up once the CQ is empty.
		r.wantKinds(c.QPNum(), EventAccepted, EventDisconnect, EventDrainPosted, EventGivenUp, EventReaped)
	}
	if st := r.m.Stats(); st.Reaped != 1 || st.LateWCs != 0 {
		t.Errorf("stats %+v, want 1 reaped, no late completion", st)
	}
}

// One drain WR at a time: QPs whose Last WQE Reached comes while a drain
// is outstanding wait on the flush list. A provider that never completes
// the drain WR (eHCA) leaves them there for ever.
func TestKernelDrainNeverFlushedLeaks(t *testing.T) {
	r := newRig(t, softDevice(t, soft.Quirks{SendInErrorNotFlushed: true}), Config{})
	r.disconnected(3)
	r.advance(24 * time.Hour)
	n := r.m.Counts()
	if n[ListDrain] != 1 || n[ListFlush] != 2 || n[ListReap] != 0 {
		t.Errorf("lists %v, want 1 on rx_drain_list and 2 on rx_flush_list for ever", n)
	}
	if st := r.m.Stats(); st.DrainWRs != 1 || st.Reaped != 0 {
		t.Errorf("stats %+v, want 1 drain WR and nothing reaped", st)
	}
}

// The same churn under the Bounded policy: the drain WR's wait ends after
// DrainTimeout of the clock, the CQ is found empty, the QPs are given up
// and destroyed.
func TestBoundedDrainNeverFlushedReaps(t *testing.T) {
	r := newRig(t, softDevice(t, soft.Quirks{SendInErrorNotFlushed: true}), Config{Policy: Bounded})
	conns := r.disconnected(3)
	if n := r.m.Counts(); n[ListDrain] != 3 {
		t.Fatalf("lists %v, want 3 with the reaper", n)
	}
	due := r.m.NextDeadline()
	if got := due.Sub(r.clock.Now()); got != 5*time.Second {
		t.Errorf("next deadline in %v, want the drain WR's 5 s", got)
	}
	r.clock.Set(due.Add(-time.Millisecond))
	r.service()
	if n := r.m.Counts(); n[ListDrain] != 3 {
		t.Errorf("before the deadline lists %v, want 3 still with the reaper", n)
	}
	for i := 0; r.m.Snapshot().QPs > 0 && i < 10; i++ {
		if d := r.m.NextDeadline(); !d.IsZero() {
			r.clock.Set(d)
		}
		r.service()
	}
	if st := r.m.Stats(); st.Reaped != 3 || st.LateWCs != 0 {
		t.Errorf("stats %+v, want all 3 reaped", st)
	}
	r.wantKinds(conns[0].QPNum(), EventAccepted, EventDisconnect, EventLastWQE, EventDrainPosted, EventGivenUp, EventReaped)
	if st := r.m.Stats(); st.GivenUp != 3 || st.DrainWRs == 0 {
		t.Errorf("stats %+v, want 3 given up, drain WRs posted", st)
	}
}

// Without Last WQE Reached (cxgb4 before 2025, rxe before 6.5) the Bounded
// policy hands the QP to the reaper after LastWQETimeout; the kernel's
// keeps it on its list.
func TestNoLastWQEReached(t *testing.T) {
	for _, p := range []Policy{Kernel, Bounded} {
		t.Run(p.String(), func(t *testing.T) {
			r := newRig(t, softDevice(t, soft.Quirks{NoLastWQEReached: true}), Config{Policy: p})
			c, _ := r.connect()
			r.disconnect(c)
			r.advance(4 * time.Second)
			for i := 0; i < 10; i++ {
				r.advance(time.Second)
			}
			if p == Kernel {
				if c.List() != ListPassive {
					t.Errorf("on %s, want passive_ids for ever", c.List())
				}
				return
			}
			if c.List() != ListNone {
				t.Errorf("on %s, want reaped", c.List())
			}
			r.wantKinds(c.QPNum(), EventAccepted, EventDisconnect, EventDrainPosted, EventGivenUp, EventReaped)
		})
	}
}

// The quarantine policy on a virtual clock: a drain WR that never
// completes (eHCA) stalls at the reaper's DrainTimeout on the Manager's
// clock and the QP is kept, counted, by the one reaper the Manager has.
func TestQuarantineOnVirtualClock(t *testing.T) {
	r := newRig(t, softDevice(t, soft.Quirks{SendInErrorNotFlushed: true}), Config{Policy: Bounded, QuarantinePolicy: true})
	c, _ := r.connect()
	r.disconnect(c)
	r.service()
	if c.List() != ListDrain {
		t.Fatalf("on %s, want the reaper's", c.List())
	}
	r.clock.Set(r.m.NextDeadline())
	r.service()
	if c.List() != ListQuarantine {
		t.Errorf("at the drain WR's deadline on %s, want the quarantine", c.List())
	}
	if st := r.m.Stats(); st.Quarantined != 1 || st.GivenUp != 0 {
		t.Errorf("stats %+v, want 1 quarantined, none given up", st)
	}
	r.wantKinds(c.QPNum(), EventAccepted, EventDisconnect, EventLastWQE, EventDrainPosted, EventQuarantined)
}

// The stale task: every Delay, connections idle longer than Timeout go to
// rx_error_list with their QP in ERROR, from the LRU tail. A connection
// whose peer vanished just after a run found it not quite idle enough waits
// one more Delay: Timeout+Delay, 1280 s, about 21 minutes with the kernel's
// timers (the eHCA thread's complaint).
func TestStaleTask(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		update, timeout, delay time.Duration
	}{
		{"kernel-timers", 0, 0, 0},
		{"configured", 5 * time.Second, 10 * time.Second, 15 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, nil, Config{UpdateTime: tc.update, Timeout: tc.timeout, Delay: tc.delay})
			cfg := r.m.Config()
			start := r.clock.Now()
			a, _ := r.connect() // vanishes at once
			if got := r.m.NextDeadline().Sub(start); got != cfg.Delay {
				t.Errorf("stale task due in %v, want Delay %v", got, cfg.Delay)
			}
			// b's peer vanishes just late enough to survive the first run.
			r.clock.Set(start.Add(cfg.Delay - cfg.Timeout + time.Second))
			b, _ := r.connect()
			bAt := r.clock.Now()
			r.clock.Set(start.Add(cfg.Delay))
			r.service()
			if e, ok := r.event(a.QPNum(), EventStale); !ok || !e.At.Equal(start.Add(cfg.Delay)) || e.List != ListError || e.State != StateError {
				t.Errorf("a idle %v > %v: stale event %+v, want one at the task's run moving it to rx_error_list in ERROR", cfg.Delay, cfg.Timeout, e)
			}
			if b.List() != ListPassive {
				t.Fatalf("b idle %v: on %s, want passive_ids", cfg.Timeout-time.Second, b.List())
			}
			next := r.m.NextDeadline()
			if got := next.Sub(r.clock.Now()); got != cfg.Delay {
				t.Errorf("stale task re-armed in %v, want %v", got, cfg.Delay)
			}
			r.clock.Set(next)
			r.service()
			if b.List() == ListPassive {
				t.Fatalf("b still live after %v idle", next.Sub(bAt))
			}
			took := next.Sub(bAt)
			if want := cfg.Timeout + cfg.Delay - time.Second; took != want {
				t.Errorf("vanished peer collected after %v, want %v", took, want)
			}
			t.Logf("Timeout %v, Delay %v: a vanished peer's connection is collected after up to %v (%v here)", cfg.Timeout, cfg.Delay, cfg.Timeout+cfg.Delay, took)
			if lastWQEReached() {
				r.until("reaped", func() bool { return r.m.Snapshot().QPs == 0 })
				r.wantKernelDrain(b.QPNum(), EventAccepted, EventStale)
			}
			if r.m.NextDeadline() != (time.Time{}) {
				t.Errorf("stale task still queued with passive_ids empty")
			}
		})
	}
}

// Without an SRQ there is no Last WQE step: each flushed receive counts
// down, and the last one puts the connection on rx_reap_list.
func TestNonSRQFlushReaps(t *testing.T) {
	for _, p := range []Policy{Kernel, Bounded} {
		t.Run(p.String(), func(t *testing.T) {
			r := newRig(t, nil, Config{NoSRQ: true, Policy: p})
			c, peer := r.connect()
			r.send(peer)
			r.disconnect(c)
			r.until("reaped", func() bool { return c.List() == ListNone })
			r.wantKinds(c.QPNum(), EventAccepted, EventDisconnect, EventFlushed, EventReaped)
			if st := r.m.Stats(); st.DrainWRs != 0 {
				t.Errorf("%d drain WRs posted, want none without an SRQ", st.DrainWRs)
			}
		})
	}
}

// Past max_nonsrq_conn_qp a REQ is rejected with IB_CM_REJ_NO_QP; once a
// connection is reaped there is room again.
func TestNonSRQLimit(t *testing.T) {
	r := newRig(t, nil, Config{NoSRQ: true, MaxNonSRQConn: 2})
	a, _ := r.connect()
	r.connect()
	peer := devtest.NewRC(t, r.pd, devtest.RCConfig{SendCQ: r.peerCQ})
	_, err := r.m.Accept(peer.Num(), r.route)
	var rej *RejectError
	if !errors.As(err, &rej) || rej.Reason != RejNoQP || !errors.Is(err, ErrRejected) {
		t.Fatalf("third Accept: %v, want a rejection with NO_QP", err)
	}
	if s := r.m.Snapshot(); s.QPs != 2 || s.NonSRQConns != 2 {
		t.Errorf("after the rejection %d QPs, nonsrq_conn_qp %d, want 2 and 2", s.QPs, s.NonSRQConns)
	}
	r.disconnect(a)
	r.until("reaped", func() bool { return a.List() == ListNone })
	if _, err := r.m.Accept(peer.Num(), r.route); err != nil {
		t.Fatalf("Accept after a reap: %v", err)
	}
	if st := r.m.Stats(); st.RejectNoQP != 1 || st.Accepted != 3 {
		t.Errorf("stats %+v, want 1 NO_QP rejection and 3 accepted", st)
	}
}

// A device that creates no more QPs: the REQ handler fails, the CM rejects
// with CONSUMER_DEFINED.
func TestRejectWhenNoQP(t *testing.T) {
	dev, err := soft.Open(soft.Config{Limits: soft.Limits{MaxQP: 3}})
	if err != nil {
		t.Fatal(err)
	}
	devtest.Close(t, dev)
	r := newRig(t, dev, Config{})
	r.connect() // two QPs: the peer's and the RX QP
	peer := devtest.NewRC(t, r.pd, devtest.RCConfig{SendCQ: r.peerCQ})
	_, err = r.m.Accept(peer.Num(), r.route)
	var rej *RejectError
	if !errors.As(err, &rej) || rej.Reason != RejConsumerDefined || !errors.Is(err, ibv.ErrResourceLimit) {
		t.Fatalf("Accept on a full device: %v, want CONSUMER_DEFINED wrapping ErrResourceLimit", err)
	}
	if st := r.m.Stats(); st.RejectOther != 1 {
		t.Errorf("stats %+v, want 1 CONSUMER_DEFINED rejection", st)
	}
}

// Device stop: every live connection to ERROR, a wait bounded by
// StopTimeout for the drains, then everything left is destroyed.
func TestStop(t *testing.T) {
	for _, tc := range []struct {
		name     string
		quirks   soft.Quirks
		policy   Policy
		timedOut bool
		forced   int
	}{
		{"kernel", soft.Quirks{}, Kernel, false, 0},
		{"bounded", soft.Quirks{}, Bounded, false, 0},
		{"kernel-drain-never-flushed", soft.Quirks{SendInErrorNotFlushed: true}, Kernel, true, 3},
		// The reaper's wait (4 s here) and the empty poll after its stall
		// that gives the QPs up end within the stop's (5 s).
		{"bounded-drain-never-flushed", soft.Quirks{SendInErrorNotFlushed: true}, Bounded, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, softDevice(t, tc.quirks), Config{Policy: tc.policy, Drain: drain.Options{DrainTimeout: 4 * time.Second}})
			for range 3 {
				r.connect()
			}
			rep, err := r.m.Stop(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if rep.TimedOut != tc.timedOut || rep.Forced != tc.forced || rep.Reaped+rep.Forced != 3 {
				t.Errorf("stop %+v, want timed out %v, %d forced, 3 in all", rep, tc.timedOut, tc.forced)
			}
			if tc.timedOut && rep.Waited <= DefaultStopTimeout {
				t.Errorf("gave up after %v, want past %v", rep.Waited, DefaultStopTimeout)
			}
			if _, err := r.m.Accept(1, r.route); !errors.Is(err, ErrStopped) {
				t.Errorf("Accept after Stop: %v, want ErrStopped", err)
			}
		})
	}
}

// A provider that raises Last WQE Reached again once the drain WR is posted
// in ERROR (rxe on Linux 6.12): ipoib_cm_rx_event_handler moves the entry
// back to the flush list, and a second drain WR is posted on it. With
// max_send_wr 1 and the first drain WR's completion not yet polled, the soft
// device (which frees a send slot when its completion is polled) refuses it:
// ipoib_warn "failed to post drain wr", and the entry goes to the drain list
// all the same, where the first WR's completion reaps it.
func TestKernelLastWQEReachedTwice(t *testing.T) {
	r := newRig(t, softDevice(t, soft.Quirks{LastWQEReachedTwice: true}), Config{})
	c, _ := r.connect()
	r.disconnect(c)
	r.until("reaped", func() bool { return c.List() == ListNone })
	r.wantKinds(c.QPNum(), EventAccepted, EventDisconnect, EventLastWQE, EventDrainPosted, EventLastWQE, EventDrainPosted, EventDrained, EventReaped)
	if st := r.m.Stats(); st.DrainWRs != 1 || st.DrainPostFailed != 1 || st.LateWCs != 0 {
		t.Errorf("stats %+v, want 1 drain WR posted, 1 refused, no late completion", st)
	}
}

// A completion for a QP the Manager already destroyed is counted: it is the
// evidence a "false safe" figure rests on.
func TestLateCompletionCounted(t *testing.T) {
	r := newRig(t, nil, Config{NoSRQ: true})
	c, _ := r.connect()
	r.disconnect(c)
	r.until("reaped", func() bool { return c.List() == ListNone })
	r.m.mu.Lock()
	err := r.m.handleWC(ibv.WC{ID: recvTag, QPNum: c.QPNum(), Status: ibv.WCWRFlushErr}, r.clock.Now())
	r.m.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if st := r.m.Stats(); st.LateWCs != 1 {
		t.Errorf("%d late completions counted, want 1", st.LateWCs)
	}
}

package flushcheck

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/rcsetup"
	"github.com/qpdrain/qpdrain/soft"
)

// TestSettingsPerQuirk: the settings follow from what each quirk breaks,
// and draining with them ends every drain safe, with nothing of a QP
// completing after it was called safe.
func TestSettingsPerQuirk(t *testing.T) {
	for _, tc := range []struct {
		name       string
		quirk      soft.Quirks
		countRecvs bool
		countSends bool
		maxBatch   int
		policy     drain.Policy
		viaRTS     bool
		repeats    bool // a "repeated Last WQE Reached" line
		stalls     bool // the SRQ QPs end quarantined: no drain WR proves their SRQ side
	}{
		{"none", soft.Quirks{}, false, false, 0, drain.Quarantine, false, false, false},
		{"SendInErrorNotFlushed", soft.Quirks{SendInErrorNotFlushed: true}, true, true, 1, drain.Quarantine, false, false, true},
		{"RecvInErrorNotFlushed", soft.Quirks{RecvInErrorNotFlushed: true}, true, false, 0, drain.Quarantine, false, false, false},
		{"RecvInErrorFlushDeferred", soft.Quirks{RecvInErrorFlushDeferred: true}, true, false, 0, drain.Quarantine, false, false, false},
		{"NoLastWQEReached", soft.Quirks{NoLastWQEReached: true}, false, false, 0, drain.DestroyWhenEmpty, false, false, false},
		{"LastWQEReachedTwice", soft.Quirks{LastWQEReachedTwice: true}, false, false, 0, drain.DestroyWhenEmpty, false, false, false},
		{"LastWQEReachedAgain", soft.Quirks{LastWQEReachedAgain: true}, false, false, 0, drain.Quarantine, false, true, false},
		{"DrainNeedsRTS", soft.Quirks{DrainNeedsRTS: true}, false, false, 0, drain.Quarantine, true, false, false},
		{"NoResponderErrorEvent", soft.Quirks{NoResponderErrorEvent: true}, false, false, 0, drain.Quarantine, false, false, false},
		{"FlushDeferred", soft.Quirks{FlushDeferred: true}, false, false, 1, drain.DestroyWhenEmpty, false, false, false},
		{"CQOverrunKeepsQPs", soft.Quirks{CQOverrunKeepsQPs: true}, false, false, 0, drain.Quarantine, false, false, false},
		// A drain never uses SQD: nothing changes.
		{"SQDrainedEarly", soft.Quirks{SQDrainedEarly: true}, false, false, 0, drain.Quarantine, false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := openSoft(t, tc.quirk)
			results := Run(context.Background(), dev, on(dev, quick))
			rec := Settings(results)
			o := rec.Options
			if r, _ := lookupResult(results, "flush-order"); tc.maxBatch == 0 && allowed(t, r) {
				tc.maxBatch = 1 // an adversarial schedule interleaved the flushes
			}
			if rec.CountRecvs != tc.countRecvs || rec.CountSends != tc.countSends || o.MaxBatch != tc.maxBatch || o.Policy != tc.policy || o.ViaRTS != tc.viaRTS {
				t.Errorf("CountRecvs %v CountSends %v MaxBatch %d Policy %s ViaRTS %v; want %v %v %d %s %v",
					rec.CountRecvs, rec.CountSends, o.MaxBatch, o.Policy, o.ViaRTS, tc.countRecvs, tc.countSends, tc.maxBatch, tc.policy, tc.viaRTS)
			}
			var names []string
			for _, s := range rec.Settings {
				names = append(names, s.Name)
				if s.Value == "" || s.Reason == "" {
					t.Errorf("setting %+v without a value or reason", s)
				}
			}
			want := []string{"receive drain WR", "send drain WR", "MaxBatch", "Policy", "LastWQETimeout", "DrainTimeout", "ViaRTS"}
			if tc.repeats {
				want = append(want, "repeated Last WQE Reached")
			}
			if want = append(want, "Headroom"); !slices.Equal(names, want) {
				t.Errorf("settings %v, want %v", names, want)
			}
			// Short bounds: the soft device answers at once.
			rec.Options.LastWQETimeout, rec.Options.DrainTimeout = 50*time.Millisecond, 50*time.Millisecond
			drainWithSettings(t, dev, rec, tc.stalls)
		})
	}
}

// A probe that did not run leaves its setting at the choice safe
// everywhere, and says so.
func TestSettingsUnknown(t *testing.T) {
	rec := Settings([]Result{{Name: "flush-order", Outcome: Error}})
	if o := rec.Options; !rec.CountRecvs || !rec.CountSends || o.MaxBatch != 1 || o.Policy != drain.Quarantine || !o.ViaRTS {
		t.Errorf("options without findings: %+v, CountRecvs %v, CountSends %v", o, rec.CountRecvs, rec.CountSends)
	}
	for _, s := range rec.Settings[:4] {
		if !strings.Contains(s.Reason, "did not run to a verdict") {
			t.Errorf("%s: reason %q does not say the probe did not run", s.Name, s.Reason)
		}
	}
}

// drainWithSettings drains, with o, QPs in the states a drain meets:
// four on an SRQ and four with their own receive queue (two receives
// each), all on one CQ, each with a send waiting on an RNR (but on iWARP,
// which has no RNR: its peer would end the connection), added with the
// counts rec asks for. Every drain must end, within its bounds, safe to
// destroy (or, with stalls, the SRQ QPs quarantined: counts prove no SRQ
// side), and no completion of a QP may come after it was called safe,
// nor be missing then.
func drainWithSettings(t *testing.T, dev ibv.Context, rec Recommendation, stalls bool) {
	t.Helper()
	o := rec.Options
	pd := devtest.NewPD(t, dev)
	cq := devtest.NewCQ(t, dev, 256)
	srq := devtest.NewSRQ(t, pd, ibv.SRQAttr{MaxWR: 32, MaxSGE: 1})
	// dev's transport, not the test device's: TestSettingsPerQuirk passes
	// soft devices with InfiniBand's rules wherever it runs (on siw0 too).
	iwarp := rcsetup.NeedsCM(dev)
	// On iWARP every receive carries an SGE, as the probes' do (env.recvSGE).
	var sgl []ibv.SGE
	if iwarp {
		mr := devtest.Buffer(t, pd, recvBytes, ibv.AccessLocalWrite)
		sgl = []ibv.SGE{{Addr: mr.Addr(), Length: recvBytes, LKey: mr.LKey()}}
	}
	recvWRs := func(base uint64, n int) []ibv.RecvWR {
		wrs := recvs(base, n)
		for i := range wrs {
			wrs[i].SGL = sgl
		}
		return wrs
	}
	if err := srq.PostRecv(recvWRs(recvBase+0x40, 8)); err != nil {
		t.Fatal(err)
	}
	type qpInfo struct {
		qp     ibv.QP
		posted int  // WRs of ours that must complete before the QP is safe
		sent   bool // one of them a send
	}
	var qps []qpInfo
	for i := range 8 {
		var s ibv.SRQ
		if i < 4 {
			s = srq
		}
		qp, _ := devtest.Pair(t, pd, devtest.RCConfig{SRQ: s, SendCQ: cq}, devtest.RCConfig{})
		posted := 0
		if s == nil {
			if err := qp.PostRecv(recvWRs(recvBase, 2)); err != nil {
				t.Fatal(err)
			}
			posted += 2
		}
		// The peer has no receive: the send waits on an RNR (rnr_retry 7).
		if !iwarp {
			if err := qp.PostSend(sends(sendBase, 1)); err != nil {
				t.Fatal(err)
			}
			posted++
		}
		qps = append(qps, qpInfo{qp, posted, !iwarp})
	}
	var mu sync.Mutex
	seen := make(map[uint32]int) // completions of each QP that the caller got
	o.Queue = drain.QueueByIDPrefix(8, recvBase, sendBase)
	feed := drain.Feed{Events: dev, OnWC: func(wc ibv.WC) {
		mu.Lock()
		seen[wc.QPNum]++
		mu.Unlock()
	}}
	r, err := drain.NewReaper(cq, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- r.Run(ctx, feed) }()
	defer func() {
		cancel()
		<-runDone
	}()
	var handles []*drain.Handle
	for _, q := range qps {
		var add drain.AddOptions
		if rec.CountRecvs && q.qp.SRQ() == nil {
			add.CountRecvs, add.Recvs = true, 2
		}
		if rec.CountSends {
			add.CountSends = true
			if q.sent {
				add.Sends = 1
			}
		}
		h, err := r.Add(q.qp, add)
		if err != nil {
			t.Fatal(err)
		}
		handles = append(handles, h)
	}
	// A drain is bounded by its two timeouts; twice that and a second
	// of scheduling is a stall.
	bound := 2*(o.LastWQETimeout+o.DrainTimeout) + time.Second
	wctx, wcancel := context.WithTimeout(context.Background(), bound)
	defer wcancel()
	counted := make(map[uint32]int) // completions each drain saw before its outcome
	for i, h := range handles {
		rep, err := h.Wait(wctx)
		if rep == nil {
			t.Fatalf("qpn %d: no report after %v: %v", qps[i].qp.Num(), bound, err)
		}
		if stalls && rep.SRQ {
			if rep.Outcome != report.Quarantined {
				t.Errorf("qpn %d: %s (%v), want quarantined: nothing proves it finished", rep.QPNum, rep.Outcome, err)
			}
			continue
		}
		if err != nil || !rep.Outcome.SafeToDestroy() {
			t.Errorf("qpn %d: %s, %v; want safe to destroy\n%s", rep.QPNum, rep.Outcome, err, rep)
			continue
		}
		for _, f := range rep.Flushed {
			counted[rep.QPNum] += f.Flushed + f.Other
		}
	}
	// A completion after the outcome would come within milliseconds; the
	// reaper passes it to OnWC without counting it in the report.
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for _, q := range qps {
		n, safe := counted[q.qp.Num()]
		if !safe {
			continue
		}
		if n != q.posted || seen[q.qp.Num()] != q.posted {
			t.Errorf("false safe: qpn %d called safe having seen %d of its %d completions; %d came in all", q.qp.Num(), n, q.posted, seen[q.qp.Num()])
		}
	}
}

package drain_test

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/soft"
	"github.com/qpdrain/qpdrain/teardown"
)

// The figure: SRQ-attached QPs on one CQ, each holding 64 receive
// WQEs taken from the SRQ and 16 sends outstanding, moved to ERROR and
// drained until every one is safe to destroy: 4,096 of them, and 65,536
// to show how the cost grows.
const (
	benchTaken   = 64
	benchSends   = 16
	benchTimeout = 5 * time.Minute
)

var benchSizes = []int{4096, 65536}

// benchCQE is the CQ for n QPs: their flushes and one drain WR each.
func benchCQE(n int) int { return n*(benchTaken+benchSends+1) + 1024 }

// benchSetup is built and torn down around each iteration, outside the
// timer; it does not use the test cleanups, which run only once per
// benchmark.
type benchSetup struct {
	dev     *soft.Device
	ch      ibv.CompChannel
	cq      ibv.CQ
	qps     []ibv.QP
	closers teardown.List
}

func (s *benchSetup) keep(c io.Closer) { s.closers.Add(c) }

func (s *benchSetup) close(b *testing.B) {
	if err := s.closers.Close(); err != nil {
		b.Fatal(err)
	}
}

// pollAllDrained adds every QP of qps to rp at once (Reaper.AddAll) and,
// as the caller's poll loop, feeds rp (Reaper.Poll) from this goroutine
// until none is pending, as the polling floor polls.
func pollAllDrained(b *testing.B, rp *drain.Reaper, qps []ibv.QP, add drain.AddOptions) {
	must(rp.AddAll(qps, add))
	pollUntil(b, rp, func() bool { return rp.Stats().Pending == 0 })
}

// pollUntil polls rp's CQ until done, as a caller that owns it does, and
// fails b once benchTimeout has passed with the CQ empty: the clock is read
// only on an empty poll, so the bound costs the timed loop nothing while
// completions come.
func pollUntil(b *testing.B, rp *drain.Reaper, done func() bool) {
	deadline := time.Now().Add(benchTimeout)
	for !done() {
		n, err := rp.Poll()
		if err != nil {
			b.Fatal(err)
		}
		if n == 0 && time.Now().After(deadline) {
			b.Fatalf("the CQ still empty after %v, before the completions waited for", benchTimeout)
		}
	}
}

// oneAtATime drains qps as ib_drain_qp does, the next QP added only once
// the previous one's drain WR completed and woke this goroutine up (Run
// polls the CQ).
func oneAtATime(ctx context.Context, b *testing.B, rp *drain.Reaper, qps []ibv.QP, add drain.AddOptions) {
	for _, qp := range qps {
		if _, err := must(rp.Add(qp, add)).Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// drainByRun drains qps through rp fed by Run on ch, with b's timer
// running from Run's start to the last outcome: every QP added at once
// (DrainAll) or, with headroom 1, each one's drain waited for before the
// next is added. It returns when the timer stopped, once Run has returned.
func drainByRun(b *testing.B, rp *drain.Reaper, ch ibv.CompChannel, qps []ibv.QP, headroom int, add drain.AddOptions) time.Time {
	ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
	runDone := make(chan error, 1)
	b.StartTimer()
	go func() { runDone <- rp.Run(ctx, drain.Feed{Channel: ch}) }()
	if headroom == 1 {
		oneAtATime(ctx, b, rp, qps, add)
	} else if _, err := drainWith(ctx, rp, qps, add); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	stopped := time.Now()
	cancel()
	<-runDone
	return stopped
}

// must unwraps a setup result; a failed setup is a broken benchmark, so it
// panics (b.Fatal cannot take a multi-value call).
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func setupBench(b *testing.B, n int) *benchSetup {
	fab := soft.NewFabric()
	fab.SetAutoProgress(false) // the sends stay outstanding
	s := &benchSetup{}
	s.dev = must(soft.Open(soft.Config{
		Fabric:      fab,
		SRQPrefetch: benchTaken,
		Limits:      soft.Limits{MaxQP: 2*n + 16, MaxCQE: benchCQE(n), MaxSRQWR: n * benchTaken},
	}))
	s.keep(s.dev)
	s.ch = must(s.dev.CreateCompChannel())
	s.keep(s.ch)
	s.cq = must(s.dev.CreateCQ(benchCQE(n), s.ch))
	s.keep(s.cq)
	peerCQ := must(s.dev.CreateCQ(1024, nil))
	s.keep(peerCQ)
	pd := must(s.dev.AllocPD())
	s.keep(pd)
	srq := must(pd.CreateSRQ(ibv.SRQAttr{MaxWR: uint32(n * benchTaken), MaxSGE: 1}))
	s.keep(srq)
	recvs := make([]ibv.RecvWR, n*benchTaken)
	for i := range recvs {
		recvs[i].ID = recvIDBase | uint64(i)
	}
	if err := srq.PostRecv(recvs); err != nil {
		b.Fatal(err)
	}
	sends := make([]ibv.SendWR, benchSends)
	for i := range sends {
		sends[i] = ibv.SendWR{ID: sendIDBase | uint64(i), Opcode: ibv.WRSend, Flags: ibv.SendSignaled}
	}
	for range n {
		qp := must(pd.CreateQP(ibv.QPInitAttr{SendCQ: s.cq, RecvCQ: s.cq, SRQ: srq, Cap: qpCap, Type: ibv.QPTRC}))
		s.keep(qp)
		peer := must(pd.CreateQP(ibv.QPInitAttr{SendCQ: peerCQ, RecvCQ: peerCQ, Cap: qpCap, Type: ibv.QPTRC}))
		s.keep(peer)
		devtest.Connect(b, s.dev, qp, peer)
		if err := qp.PostSend(sends); err != nil {
			b.Fatal(err)
		}
		s.qps = append(s.qps, qp)
	}
	return s
}

// BenchmarkDrain drains the QPs three ways. (a) "batched": every QP added
// at once, the reaper's headroom as large as the CQ room reserved for
// drain WRs (one per QP) so that every drain WR is outstanding together,
// the caller's poll loop feeding the reaper as BenchmarkPollFloor polls.
// (b) "one-at-a-time", as ib_drain_qp does: a drain WR on the QP's own
// send queue, a wait until its completion wakes the caller, then the next
// QP; Run polls, event-driven on a completion channel. (c) "batched-run":
// (a) fed by Run in a goroutine of its own, as a long-lived reaper is, the
// same wake-ups as (b). Each QP has sends
// outstanding, so each needs its own drain WR whichever way: batching
// saves the round trips, not the WRs.
//
// The QPs are all moved to ERROR before the timer starts and the caller's
// event loop has seen their Last WQE Reached (AddOptions.LastWQESeen).
func BenchmarkDrain(b *testing.B) {
	for _, n := range benchSizes {
		for _, mode := range []struct {
			name     string
			headroom int
			run      bool
		}{{"batched", n, false}, {"one-at-a-time", 1, true}, {"batched-run", n, true}} {
			b.Run(fmt.Sprintf("qps=%d/%s", n, mode.name), func(b *testing.B) {
				drainWRs := 0
				var cpu cpuMeter
				for b.Loop() {
					b.StopTimer()
					s := setupBench(b, n)
					toErrorSeen(b, s)
					rp := newReaper(b, s.cq, drain.Options{Headroom: mode.headroom, DrainTimeout: benchTimeout})
					// The caller moved them to ERROR and says so.
					add := drain.AddOptions{LastWQESeen: true, StateKnown: true, State: ibv.QPSErr}
					runtime.GC() // the setup's garbage is not the drain's
					if mode.run {
						drainByRun(b, rp, s.ch, s.qps, mode.headroom, add)
					} else {
						b.StartTimer()
						cpu.start()
						pollAllDrained(b, rp, s.qps, add)
						cpu.stop()
						b.StopTimer()
					}
					st := rp.Stats()
					if st.Safe != n || st.ForeignWCs != n*(benchTaken+benchSends) || st.MaxInFlight > mode.headroom {
						b.Fatalf("stats %+v: want %d safe, every flushed completion seen, at most %d drain WRs outstanding", st, n, mode.headroom)
					}
					drainWRs += st.DrainWRs
					s.close(b)
					b.StartTimer()
				}
				b.ReportMetric(float64(drainWRs)/float64(b.N), "drainWRs/op")
				cpu.report(b)
			})
		}
	}
}

// BenchmarkPollFloor is the floor under BenchmarkDrain, two ways, through
// a reaper that drains nothing. "flushes": polling the flushed completions
// that sit in the CQ ahead of any drain WR (80 per QP). "drain-WR": also
// posting, on each QP, one signaled send in its drain WR's place and
// polling its completion (81 per QP), as BenchmarkDrainDevice's floor
// does on a real device: the proof rules require that WR of every QP
// here, so it is work the device must do whatever the reaper does.
func BenchmarkPollFloor(b *testing.B) {
	send := []ibv.SendWR{{ID: sendIDBase | benchSends, Opcode: ibv.WRSend, Flags: ibv.SendSignaled}}
	for _, n := range benchSizes {
		for _, withWR := range []bool{false, true} {
			name, want := "flushes", n*(benchTaken+benchSends)
			if withWR {
				name, want = "drain-WR", want+n
			}
			b.Run(fmt.Sprintf("qps=%d/%s", n, name), func(b *testing.B) {
				var cpu cpuMeter
				for b.Loop() {
					b.StopTimer()
					s := setupBench(b, n)
					toErrorSeen(b, s)
					rp := newReaper(b, s.cq, drain.Options{})
					runtime.GC()
					b.StartTimer()
					cpu.start()
					if withWR {
						for _, qp := range s.qps {
							if err := qp.PostSend(send); err != nil {
								b.Fatal(err)
							}
						}
					}
					pollUntil(b, rp, func() bool { return rp.Stats().ForeignWCs >= want })
					cpu.stop()
					b.StopTimer()
					s.close(b)
					b.StartTimer()
				}
				cpu.report(b)
			})
		}
	}
}

// cpuMeter sums the CPU time of a benchmark's timed part on its own OS
// thread (threadCPU): on a machine shared with other work the wall time of
// a case swings with the load, its thread's CPU time much less, so that
// two cases compared by their cpu-ns/op are compared by their own work.
// It counts the thread's page faults too (threadFaults): memory the
// runtime returned to the kernel and takes again costs a fault a page.
// Every call happens on the benchmark's goroutine, which start locks to
// its thread.
type cpuMeter struct {
	sum, began           time.Duration
	faults, faultsBefore int64
	n                    int
}

func (m *cpuMeter) start() {
	runtime.LockOSThread()
	m.faultsBefore = threadFaults()
	m.began = threadCPU()
}

func (m *cpuMeter) stop() {
	m.sum += threadCPU() - m.began
	m.faults += threadFaults() - m.faultsBefore
	m.n++
	runtime.UnlockOSThread()
}

// report adds cpu-ns/op and faults/op to b's results, unless the platform
// has no thread CPU time.
func (m *cpuMeter) report(b *testing.B) {
	if m.n > 0 && m.sum > 0 {
		b.ReportMetric(float64(m.sum.Nanoseconds())/float64(m.n), "cpu-ns/op")
		b.ReportMetric(float64(m.faults)/float64(m.n), "faults/op")
	}
}

// toErrorSeen moves every QP of s to ERROR and consumes their Last WQE
// Reached events, as a caller's event loop would before handing them over.
func toErrorSeen(b *testing.B, s *benchSetup) {
	for _, qp := range s.qps {
		if err := qp.Modify(ibv.QPAttr{State: ibv.QPSErr}, ibv.QPAttrState); err != nil {
			b.Fatal(err)
		}
	}
	for range s.qps {
		ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
		ev, err := s.dev.NextAsyncEvent(ctx)
		cancel()
		if err != nil || ev.Type != ibv.EventQPLastWQEReached {
			b.Fatalf("event %v, %v: want QP_LAST_WQE_REACHED", ev, err)
		}
	}
}

// BenchmarkReaperMemory measures the heap the reaper holds per QP being
// drained: the QPs are already in ERROR, so Add allocates nothing on the
// device, and none of them has an outcome yet when the heap is measured
// (each waits for its Last WQE Reached).
func BenchmarkReaperMemory(b *testing.B) {
	n := benchSizes[0]
	for b.Loop() {
		b.StopTimer()
		s := setupBench(b, n)
		toErrorSeen(b, s)
		rp := newReaper(b, s.cq, drain.Options{LastWQETimeout: benchTimeout})
		hs := make([]*drain.Handle, len(s.qps))
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i, qp := range s.qps {
			hs[i] = must(rp.Add(qp, drain.AddOptions{}))
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(n), "B/QP")
		runtime.KeepAlive(hs)
		done, cancel := context.WithCancel(context.Background())
		cancel() // nothing drains here: fail what is pending at once
		rp.Shutdown(done)
		s.close(b)
		b.StartTimer()
	}
}

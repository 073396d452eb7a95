package drain_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/teardown"
)

// deviceRecvs is how many receives each QP of BenchmarkDrainDevice has
// posted on its own receive queue.
const deviceRecvs = 4

// How a case of BenchmarkDrainDevice feeds its reaper.
const (
	feedNone     = iota // the floor: no reaper
	feedPoll            // the caller's poll loop (Reaper.Poll)
	feedChannel         // Run on the CQ's completion channel, in a goroutine of its own
	feedDrainAll        // DrainAll: Run's loop on the channel in the caller's goroutine
)

// deviceCase is one way BenchmarkDrainDevice drains its QPs.
type deviceCase struct {
	name     string
	headroom int
	feed     int
	// queried leaves the QPs' state unstated: Add queries it.
	queried bool
	// grouped, for a floor, moves every QP to ERROR before it posts on
	// any, the order a batch's reaper takes; else each QP's send follows
	// its own move.
	grouped bool
	// counted, for a grouped floor, also does the least a reaper must:
	// each completion looked up by its QP number and counted, and a
	// report allocated for each QP once its receives and its send are in.
	counted bool
	// spin is the budget of Run's spin before it sleeps (Reaper.SetSpin):
	// 0 for the default, negative for none.
	spin time.Duration
}

// floorGrouped is the index of floor-grouped in deviceCases, after the
// floor.
const floorGrouped = 1

// deviceCases are BenchmarkDrainDevice's cases for n QPs, the floors
// first: every case, or with batchedOnly those the 1.10x target is about
// (the floors, batched-poll and batched), so that a run has the rounds
// their spread asks for in the same time.
func deviceCases(n int, batchedOnly bool) []deviceCase {
	cases := []deviceCase{
		{name: "floor"},
		{name: "floor-grouped", grouped: true},
		{name: "floor-counted", grouped: true, counted: true},
		{name: "batched-poll", headroom: n, feed: feedPoll},
		{name: "batched", headroom: n, feed: feedDrainAll},
	}
	if batchedOnly {
		return cases
	}
	return append(cases,
		deviceCase{name: "batched-queried", headroom: n, feed: feedDrainAll, queried: true},
		deviceCase{name: "batched-run", headroom: n, feed: feedChannel},
		deviceCase{name: "one-at-a-time", headroom: 1, feed: feedChannel},
		deviceCase{name: "one-at-a-time-nospin", headroom: 1, feed: feedChannel, spin: -1},
	)
}

// BenchmarkDrainDevice runs the same comparison on the test device
// (QPDRAIN_TEST_DEVICE: the soft device, or rxe in the VM): n RC QPs in
// RTS with their own receive queues, deviceRecvs receives posted on each
// and counted back (AddOptions.CountRecvs, which rxe 6.1 needs: it never
// flushes a receive drain WR), each moved to ERROR by Add (so that no
// poll can take a QP's flushes before its count is registered) and
// drained by a drain WR on its own send queue. "batched-poll": headroom
// n, every QP added at once (AddAll), the caller's poll loop feeding the
// reaper, as the floor polls; "batched": DrainAll, which feeds its
// reaper by Run's loop on the CQ's completion channel in the caller's
// goroutine; "batched-queried": "batched" with the QPs' state not stated,
// so that Add queries each one; "batched-run": a reaper fed by Run in a
// goroutine of its own, as a long-lived reaper is, with every QP added at
// once (AddAll) and waited for; "one-at-a-time": headroom 1, each QP's
// drain waited for before the next is added, Run on the channel, and
// "one-at-a-time-nospin" the same without the spin. The caller moved the
// QPs to RTS and says so (AddOptions.StateKnown) but in
// "batched-queried". "floor" is what the device allows: the same QPs
// moved to ERROR, one signaled send posted on each as its drain WR would
// be, and every flush and send completion polled by a loop that drains
// nothing, timed from the first modify to the last completion; each QP's
// send follows its move, as ib_drain_qp's does. "floor-grouped" is the
// same verbs in a batch's order, every move first, then every send,
// which rxe on Linux 6.1 runs in about 0.7x of the time (docs/BENCH.md);
// "floor-counted" is floor-grouped with the least bookkeeping a reaper
// that reports each QP must do: a look-up and a count per completion, a
// report allocated per QP. It tells how much of a batch's gap to the
// floors any reaper pays, and how much is this one's.
// Only the ibv API is used, so it measures a real provider's drain WR
// round trip where there is one. "qps=N/all" runs every case;
// "qps=N/batched" the floors, batched-poll and batched, for the rounds a
// ratio needs under an emulator, where one round's floor can take twice
// another's.
//
// One iteration is a round of every case, each on QPs of its own, in an
// order that turns by one case each round, so that the host's load, which
// swings by 2x within minutes on a shared host, falls on every case alike.
// Each case reports its median time per round ("-ms") and the median of
// its per-round ratio to the floor ("/floor"; a batch's also to
// floor-grouped, "/floor-grouped"), the same of the process's
// CPU time ("-cpu-ms", "-cpu/floor": every goroutine's, the reaper's Run
// and its spin included, and on rxe the system calls' kernel work); a
// case fed by Run's loop, how many times per round it slept on the completion
// channel ("-waits"), for how long in all ("-waited-ms"), the time from
// the first Wake of each sleep that one ended to the sleep's end, summed
// ("-wake-lag-ms"), and, for a reaper of the benchmark's own, how many of
// those sleeps began while a QP was pending ("-pending-waits"). With
// -test.v every round is logged.
func BenchmarkDrainDevice(b *testing.B) {
	for _, n := range []int{1024, 4096} {
		b.Run(fmt.Sprintf("qps=%d", n), func(b *testing.B) {
			b.Run("all", func(b *testing.B) { benchDevice(b, n, deviceCases(n, false)) })
			b.Run("batched", func(b *testing.B) { benchDevice(b, n, deviceCases(n, true)) })
		})
	}
}

// benchDevice is BenchmarkDrainDevice with n QPs a case, over cases.
func benchDevice(b *testing.B, n int, cases []deviceCase) {
	dev := devtest.Open(b)
	laps := make([][]deviceLap, len(cases))
	round := 0
	for b.Loop() {
		b.StopTimer()
		for k := range cases {
			i := (k + round) % len(cases)
			laps[i] = append(laps[i], deviceRound(b, dev, n, cases[i]))
		}
		round++
		b.StartTimer()
	}
	if testing.Verbose() {
		logRounds(b, cases, laps)
	}
	for i, c := range cases {
		b.ReportMetric(median(laps[i], func(l deviceLap) float64 { return ms(l.wall) }), c.name+"-ms")
		if processCPU() > 0 {
			b.ReportMetric(median(laps[i], func(l deviceLap) float64 { return ms(l.cpu) }), c.name+"-cpu-ms")
		}
		if c.feed == feedChannel || c.feed == feedDrainAll {
			b.ReportMetric(median(laps[i], func(l deviceLap) float64 { return float64(l.waits) }), c.name+"-waits")
			b.ReportMetric(median(laps[i], func(l deviceLap) float64 { return ms(l.waited) }), c.name+"-waited-ms")
			b.ReportMetric(median(laps[i], func(l deviceLap) float64 { return ms(l.wakeLag) }), c.name+"-wake-lag-ms")
		}
		if c.feed == feedChannel { // DrainAll's reaper is its own: its pending QPs cannot be counted
			b.ReportMetric(median(laps[i], func(l deviceLap) float64 { return float64(l.pendingWaits) }), c.name+"-pending-waits")
		}
		if i == 0 {
			continue
		}
		b.ReportMetric(medianRatio(laps[i], laps[0], func(l deviceLap) time.Duration { return l.wall }), c.name+"/floor")
		if processCPU() > 0 {
			b.ReportMetric(medianRatio(laps[i], laps[0], func(l deviceLap) time.Duration { return l.cpu }), c.name+"-cpu/floor")
		}
		if c.headroom == n {
			b.ReportMetric(medianRatio(laps[i], laps[floorGrouped], func(l deviceLap) time.Duration { return l.wall }), c.name+"/floor-grouped")
		}
	}
}

// logRounds logs every round of BenchmarkDrainDevice, each case's time
// and its ratio to the floor's in that round: the medians hide how far
// rounds swing, and whether a case's or the floor's time does.
func logRounds(b *testing.B, cases []deviceCase, laps [][]deviceLap) {
	for r := range laps[0] {
		var line strings.Builder
		fmt.Fprintf(&line, "round %d: %s %.2f ms", r+1, cases[0].name, ms(laps[0][r].wall))
		for i, c := range cases[1:] {
			l := laps[i+1][r]
			fmt.Fprintf(&line, ", %s %.2f ms %.3fx", c.name, ms(l.wall), float64(l.wall)/float64(laps[0][r].wall))
		}
		b.Log(line.String())
	}
}

// deviceLap is what one round of a case of BenchmarkDrainDevice took:
// wall time, the process's CPU time (every goroutine's: Run's spin
// included), and the waits on the completion channel (countingChannel).
type deviceLap struct {
	wall, cpu, waited, wakeLag time.Duration
	waits, pendingWaits        int
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// median returns the median of f over xs.
func median[T any](xs []T, f func(T) float64) float64 {
	vs := make([]float64, len(xs))
	for i, x := range xs {
		vs[i] = f(x)
	}
	slices.Sort(vs)
	return vs[len(vs)/2]
}

// medianRatio is the median over the rounds of f of a case's round over
// f of the floor's round.
func medianRatio(laps, floor []deviceLap, f func(deviceLap) time.Duration) float64 {
	ratios := make([]float64, len(laps))
	for r, l := range laps {
		ratios[r] = float64(f(l)) / float64(f(floor[r]))
	}
	return median(ratios, func(x float64) float64 { return x })
}

// deviceRound sets up n QPs on dev (untimed), drains them as c says and
// returns what it took, with b's timer running for that time only.
func deviceRound(b *testing.B, dev ibv.Context, n int, c deviceCase) deviceLap {
	var closers teardown.List
	defer func() {
		if err := closers.Close(); err != nil {
			b.Fatal(err)
		}
	}()
	ch, cq, qps := setupDevice(b, dev, n, &closers)
	runtime.GC()
	began := b.Elapsed()
	if c.feed == feedNone {
		b.StartTimer()
		cpu := processCPU()
		deviceFloor(b, cq, qps, n*(deviceRecvs+1), c.grouped, c.counted)
		cpu = processCPU() - cpu
		b.StopTimer()
		return deviceLap{wall: b.Elapsed() - began, cpu: cpu}
	}
	opts := drain.Options{Headroom: c.headroom, DrainTimeout: devtest.Timeout, Queue: queueOf}
	add := drain.AddOptions{CountRecvs: true, Recvs: deviceRecvs, StateKnown: !c.queried, State: ibv.QPSRTS}
	if c.feed == feedDrainAll {
		return drainAllOnDevice(b, ch, qps, add, opts, began)
	}
	rp := newReaper(b, cq, opts)
	rp.SetSpin(c.spin)
	cpu := processCPU()
	lap := drainOnDevice(b, rp, ch, qps, c.feed, c.headroom, add)
	lap.cpu = processCPU() - cpu
	lap.wall = b.Elapsed() - began
	if st := rp.Stats(); st.Safe != n || st.DrainWRs != n || st.MaxInFlight > c.headroom {
		b.Fatalf("%s: stats %+v: want %d safe with a drain WR each, at most %d outstanding", c.name, st, n, c.headroom)
	}
	return lap
}

// setupDevice creates, on dev, a CQ on a completion channel and n RC QPs
// completing into it, each connected to a peer, in RTS, with deviceRecvs
// receives posted; closers takes every object.
func setupDevice(b *testing.B, dev ibv.Context, n int, closers *teardown.List) (ibv.CompChannel, ibv.CQ, []ibv.QP) {
	keep := closers.Add
	ch := must(dev.CreateCompChannel())
	keep(ch)
	cq := must(dev.CreateCQ(n*(deviceRecvs+1)+16, ch))
	keep(cq)
	peerCQ := must(dev.CreateCQ(16, nil))
	keep(peerCQ)
	pd := must(dev.AllocPD())
	keep(pd)
	qps := make([]ibv.QP, n)
	for i := range qps {
		qps[i] = must(pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: qpCap, Type: ibv.QPTRC}))
		keep(qps[i])
		peer := must(pd.CreateQP(ibv.QPInitAttr{SendCQ: peerCQ, RecvCQ: peerCQ, Cap: qpCap, Type: ibv.QPTRC}))
		keep(peer)
		devtest.Connect(b, dev, qps[i], peer)
		wrs := make([]ibv.RecvWR, deviceRecvs)
		for j := range wrs {
			wrs[j].ID = recvIDBase | uint64(i*deviceRecvs+j)
		}
		if err := qps[i].PostRecv(wrs); err != nil {
			b.Fatal(err)
		}
	}
	return ch, cq, qps
}

// drainAllOnDevice drains qps with DrainAll on ch, its timer running for
// that call only (began is b.Elapsed() before it), and checks that every
// QP ended safe with a drain WR on its send queue.
func drainAllOnDevice(b *testing.B, ch ibv.CompChannel, qps []ibv.QP, add drain.AddOptions, opts drain.Options, began time.Duration) deviceLap {
	ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
	defer cancel()
	counted := &countingChannel{CompChannel: ch}
	b.StartTimer()
	cpu := processCPU()
	reps, err := drain.DrainAll(ctx, qps, add, opts, drain.Feed{Channel: counted})
	cpu = processCPU() - cpu
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	for _, rep := range reps {
		if rep.Outcome != report.Safe || rep.Send.By != report.ProofSendDrainWR {
			b.Fatalf("DrainAll: qpn %d ended %v, send queue proven by %v; want safe by a drain WR", rep.QPNum, rep.Outcome, rep.Send.By)
		}
	}
	lap := counted.lap()
	lap.wall, lap.cpu = b.Elapsed()-began, cpu
	return lap
}

// drainOnDevice drains qps through rp, fed as feed says, timing from the
// first Add to the last outcome: the caller's poll loop (pollAllDrained),
// or Run on ch with every QP added at once (AddAll) or, with headroom 1,
// one at a time. It returns Run's waits on ch (countingChannel), their
// time counted while the timer ran.
func drainOnDevice(b *testing.B, rp *drain.Reaper, ch ibv.CompChannel, qps []ibv.QP, feed, headroom int, add drain.AddOptions) deviceLap {
	if feed == feedPoll {
		b.StartTimer()
		pollAllDrained(b, rp, qps, add)
		b.StopTimer()
		return deviceLap{}
	}
	counted := &countingChannel{CompChannel: ch, rp: rp}
	stopped := drainByRun(b, rp, counted, qps, headroom, add)
	if counted.lastEnd.After(stopped) {
		// The wait that Run's end cut short: only its timed part counts.
		counted.waited -= min(counted.lastEnd.Sub(stopped), counted.lastEnd.Sub(counted.lastBegan))
	}
	return counted.lap()
}

// countingChannel counts the waits on a completion channel, and the time
// spent in them: each is a sleep after an empty poll and an arming of the
// CQ, and a wake-up. Those begun while a QP of rp was pending are counted
// apart: a wait begun with nothing pending (before an Add, after an
// outcome) ends when Add wakes Run (Wake), or at a completion event. It
// also sums, over the waits that a Wake ended, the time from the wait's
// first Wake to its end: how long the wake-up took to reach Run.
type countingChannel struct {
	ibv.CompChannel
	rp *drain.Reaper // nil for DrainAll's: no waits told apart
	// Only Run's goroutine waits; read once Run has returned.
	waits, pending     int
	waited, wakeLag    time.Duration
	lastBegan, lastEnd time.Time
	mu                 sync.Mutex
	wokeAt             time.Time // the first Wake not yet taken by a wait's end; guarded by mu
}

// lap is what c counted.
func (c *countingChannel) lap() deviceLap {
	return deviceLap{waits: c.waits, waited: c.waited, pendingWaits: c.pending, wakeLag: c.wakeLag}
}

func (c *countingChannel) Wake() {
	c.mu.Lock()
	if c.wokeAt.IsZero() {
		c.wokeAt = time.Now()
	}
	c.mu.Unlock()
	c.CompChannel.Wake()
}

func (c *countingChannel) WaitCQ(ctx context.Context) (ibv.CQ, error) {
	c.waits++
	if c.rp != nil && c.rp.Stats().Pending > 0 {
		c.pending++
	}
	c.lastBegan = time.Now()
	cq, err := c.CompChannel.WaitCQ(ctx)
	c.lastEnd = time.Now()
	c.waited += c.lastEnd.Sub(c.lastBegan)
	if errors.Is(err, ibv.ErrWoken) {
		c.mu.Lock()
		// Zero when the wake that ended this wait was recorded and taken
		// by the one before (Wake records, then wakes).
		if !c.wokeAt.IsZero() {
			c.wakeLag += c.lastEnd.Sub(c.wokeAt)
			c.wokeAt = time.Time{}
		}
		c.mu.Unlock()
	}
	return cq, err
}

// countedQP is what floor-counted keeps of a QP: the receives it has yet
// to see flushed, whether its send came back, and when it was taken in.
type countedQP struct {
	recvsLeft uint32
	sent      bool
	start     time.Time
}

// countedReport is what floor-counted reports of a QP.
type countedReport struct {
	qpn        uint32
	start, end time.Time
}

// deviceFloor moves every QP of qps to ERROR, posts one signaled send on
// each (the drain WR a reaper would post, with no reaper's ID), and polls
// cq until want completions came back, within devtest.Timeout. With
// counted it also counts each completion against its QP, found by number
// in a window as the reaper's table finds most, and reports each QP once
// its receives and its send came back.
func deviceFloor(b *testing.B, cq ibv.CQ, qps []ibv.QP, want int, grouped, counted bool) {
	var win []countedQP
	var base uint32
	var reps []*countedReport
	if counted {
		base = qps[0].Num()
		last := base
		for _, qp := range qps {
			base, last = min(base, qp.Num()), max(last, qp.Num())
		}
		win = make([]countedQP, last-base+1)
		reps = make([]*countedReport, 0, len(qps))
		now := time.Now()
		for _, qp := range qps {
			win[qp.Num()-base] = countedQP{recvsLeft: deviceRecvs, start: now}
		}
	}
	send := []ibv.SendWR{{ID: sendIDBase, Opcode: ibv.WRSend, Flags: ibv.SendSignaled}}
	post := func(qp ibv.QP) {
		if err := qp.PostSend(send); err != nil {
			b.Fatal(err)
		}
	}
	for _, qp := range qps {
		if err := qp.Modify(ibv.QPAttr{State: ibv.QPSErr}, ibv.QPAttrState); err != nil {
			b.Fatal(err)
		}
		if !grouped {
			post(qp)
		}
	}
	if grouped {
		for _, qp := range qps {
			post(qp)
		}
	}
	var wcs [64]ibv.WC
	deadline := time.Now().Add(devtest.Timeout)
	for got := 0; got < want; {
		k, err := cq.Poll(wcs[:])
		if err != nil {
			b.Fatal(err)
		}
		got += k
		if counted {
			for _, wc := range wcs[:k] {
				q := &win[wc.QPNum-base]
				if wc.ID == sendIDBase {
					q.sent = true
				} else {
					q.recvsLeft--
				}
				if q.sent && q.recvsLeft == 0 {
					reps = append(reps, &countedReport{qpn: wc.QPNum, start: q.start, end: time.Now()})
				}
			}
		}
		if k == 0 && time.Now().After(deadline) {
			b.Fatalf("%d of %d completions within %v", got, want, devtest.Timeout)
		}
	}
	if counted && len(reps) != len(qps) {
		b.Fatalf("floor-counted: %d QPs reported of %d", len(reps), len(qps))
	}
}

// BenchmarkWaitEnded is Handle.Wait of a drain that has ended, as a
// batch's Waits mostly are: the report it builds, per QP. The QPs are
// those of BenchmarkDrainDevice, drained once before the timer starts.
func BenchmarkWaitEnded(b *testing.B) {
	const n = 1024
	dev := devtest.Open(b)
	var closers teardown.List
	defer func() {
		if err := closers.Close(); err != nil {
			b.Fatal(err)
		}
	}()
	_, cq, qps := setupDevice(b, dev, n, &closers)
	rp := newReaper(b, cq, drain.Options{Headroom: n, DrainTimeout: devtest.Timeout, Queue: queueOf})
	hs := must(rp.AddAll(qps, drain.AddOptions{CountRecvs: true, Recvs: deviceRecvs, StateKnown: true, State: ibv.QPSRTS}))
	pollUntil(b, rp, func() bool { return rp.Stats().Pending == 0 })
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := hs[i%n].Wait(ctx); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

package soft_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/ibv/objtrace"
	"github.com/qpdrain/qpdrain/soft"
)

// BenchmarkSendRecv measures the message rate between two QPs on two
// devices of one fabric: 16 receives posted, 16 signaled 64-byte SENDs
// posted, both CQs polled, per batch; on the orderly schedule and on an
// adversarial one, side by side. msg/cpu-s divides by the CPU time the
// process used instead of the wall time: run with -cpu 1 it is the rate of
// one core even on a busy machine.
func BenchmarkSendRecv(b *testing.B) {
	for _, sc := range []struct {
		name  string
		sched soft.Schedule
	}{{"orderly", soft.Schedule{}}, {"adversarial", soft.Schedule{Seed: 1}}} {
		b.Run(sc.name, func(b *testing.B) {
			r := newSendRecvRig(b, sc.sched)
			b.ReportAllocs()
			b.ResetTimer()
			cpu := cpuTime()
			for n := 0; n < b.N; n += sendRecvBatch {
				r.batch(b)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
			if used := cpuTime() - cpu; used > 0 {
				b.ReportMetric(float64(b.N)/used.Seconds(), "msg/cpu-s")
			}
		})
	}
}

const sendRecvBatch = 16

// sendRecvRig is BenchmarkSendRecv's pair with its WRs made once.
type sendRecvRig struct {
	p     *pair
	sends []ibv.SendWR
	recvs []ibv.RecvWR
	wcs   []ibv.WC
}

func newSendRecvRig(tb testing.TB, sched soft.Schedule) *sendRecvRig {
	fab := soft.NewFabric()
	x := newEnv(tb, soft.Config{Name: "x", Fabric: fab, Schedule: sched})
	y := newEnv(tb, soft.Config{Name: "y", Fabric: fab, Schedule: sched})
	r := &sendRecvRig{p: newPair(tb, x, y), sends: make([]ibv.SendWR, sendRecvBatch),
		recvs: make([]ibv.RecvWR, sendRecvBatch), wcs: make([]ibv.WC, sendRecvBatch)}
	for i := range r.sends {
		r.sends[i] = ibv.SendWR{ID: uint64(i), Opcode: ibv.WRSend, Flags: ibv.SendSignaled, SGL: sge(r.p.ma, 64*i, 64)}
		r.recvs[i] = ibv.RecvWR{ID: uint64(i), SGL: sge(r.p.mb, 64*i, 64)}
	}
	return r
}

// batch posts 16 receives and 16 sends and polls their 32 completions.
func (r *sendRecvRig) batch(tb testing.TB) {
	if err := r.p.b.PostRecv(r.recvs); err != nil {
		tb.Fatal(err)
	}
	if err := r.p.a.PostSend(r.sends); err != nil {
		tb.Fatal(err)
	}
	for _, cq := range [2]ibv.CQ{r.p.cqa, r.p.cqb} {
		if k, err := cq.Poll(r.wcs); k != sendRecvBatch || err != nil {
			tb.Fatalf("polled %d completions (%v), want %d", k, err, sendRecvBatch)
		}
	}
}

// The orderly hot path (post, execute, complete, poll) allocates nothing.
func TestHotPathAllocatesNothing(t *testing.T) {
	r := newSendRecvRig(t, soft.Schedule{})
	if n := testing.AllocsPerRun(100, func() { r.batch(t) }); n != 0 {
		t.Errorf("%v allocations per batch of %d messages, want 0", n, sendRecvBatch)
	}
}

// BenchmarkFlush measures moving a QP with 1,000,000 outstanding WRs to
// ERROR: 500,000 sends waiting behind an RNR-blocked head and 500,000
// receives, all flushed into one CQ. It reports the heap the queued WRs
// take per WR.
func BenchmarkFlush(b *testing.B) {
	const half = 500_000
	var perWR float64
	var cpu time.Duration
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		var used time.Duration
		perWR, used = flushOnce(b, half)
		cpu += used
	}
	b.ReportMetric(perWR, "heapB/WR")
	if cpu > 0 {
		b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/op")
	}
}

// flushOnce sets up 2*half outstanding WRs, times the flush, checks it and
// closes everything; it returns the heap per queued WR and the flush's CPU
// time.
func flushOnce(b *testing.B, half int) (float64, time.Duration) {
	s := &scope{tb: b}
	defer s.close()
	must := s.add
	dev, err := soft.Open(soft.Config{Name: "flush", Limits: soft.Limits{MaxQPWR: half, MaxCQE: 2*half + 16}})
	must(dev, err)
	pd, err := dev.AllocPD()
	must(pd, err)
	cq, err := dev.CreateCQ(2*half+16, nil)
	must(cq, err)
	m, err := pd.RegMR(make([]byte, 64), ibv.AccessLocalWrite)
	must(m, err)
	qp, err := pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: ibv.QPTRC,
		Cap: ibv.QPCap{MaxSendWR: uint32(half), MaxRecvWR: uint32(half), MaxSendSGE: 1, MaxRecvSGE: 1}})
	must(qp, err)
	peer, err := pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: ibv.QPTRC, Cap: ibv.QPCap{MaxRecvWR: 1}})
	must(peer, err)
	connect(b, qp, peer, 1)
	sends := make([]ibv.SendWR, 1000)
	recvs := make([]ibv.RecvWR, 1000)
	for k := range sends {
		sends[k] = ibv.SendWR{ID: uint64(k), Opcode: ibv.WRSend, SGL: sge(m, 0, 8)}
		recvs[k] = ibv.RecvWR{ID: uint64(k), SGL: sge(m, 0, 8)}
	}
	before := heap()
	for k := 0; k < half; k += len(sends) {
		if err := qp.PostSend(sends); err != nil {
			b.Fatal(err)
		}
		if err := qp.PostRecv(recvs); err != nil {
			b.Fatal(err)
		}
	}
	perWR := float64(heap()-before) / float64(2*half)
	cpu := cpuTime()
	b.StartTimer()
	toState(b, qp, ibv.QPSErr)
	b.StopTimer()
	used := cpuTime() - cpu
	if n, _ := cq.Poll(make([]ibv.WC, 2*half+16)); n != 2*half {
		b.Fatalf("flushed %d WRs, want %d", n, 2*half)
	}
	return perWR, used
}

// BenchmarkIdleQPs measures the heap of 4,096 connected, idle RC QPs with
// 256-entry send and receive queues, sharing one CQ. The tests' object
// tracking (objtrace) adds a record per QP; it is reported apart.
func BenchmarkIdleQPs(b *testing.B) {
	const count = 4096
	var perQP, tracking float64
	for i := 0; i < b.N; i++ {
		perQP, tracking = idleOnce(b, count)
	}
	b.ReportMetric(perQP, "heapB/QP")
	b.ReportMetric(tracking, "objtraceB/QP")
}

func idleOnce(b *testing.B, count int) (perQP, tracking float64) {
	s := &scope{tb: b}
	defer s.close()
	must := s.add
	dev, err := soft.Open(soft.Config{Name: "idle"})
	must(dev, err)
	pd, err := dev.AllocPD()
	must(pd, err)
	cq, err := dev.CreateCQ(16, nil)
	must(cq, err)
	before := heap()
	qps := make([]ibv.QP, count)
	for k := range qps {
		qps[k], err = pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: ibv.QPTRC,
			Cap: ibv.QPCap{MaxSendWR: 256, MaxRecvWR: 256, MaxSendSGE: 1, MaxRecvSGE: 1}})
		must(qps[k], err)
	}
	for k := 0; k < count; k += 2 {
		connect(b, qps[k], qps[k+1], 1)
	}
	perQP = float64(heap()-before) / float64(count)
	before = heap()
	recs := make([]*objtrace.Record, count)
	for k := range recs {
		recs[k] = objtrace.Track("soft QP 12345 on idle")
	}
	tracking = float64(heap()-before) / float64(count)
	for _, r := range recs {
		r.Release()
	}
	return perQP, tracking
}

// scope closes what one benchmark iteration created, newest first, so that
// iterations do not pile up objects until the benchmark ends.
type scope struct {
	tb   testing.TB
	objs []closer
}

func (s *scope) add(c closer, err error) {
	if err != nil {
		s.tb.Fatal(err)
	}
	s.objs = append(s.objs, c)
}

func (s *scope) close() {
	for i := len(s.objs) - 1; i >= 0; i-- {
		if err := s.objs[i].Close(); err != nil {
			s.tb.Error(err)
		}
	}
}

// heap returns the live heap after a collection.
func heap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

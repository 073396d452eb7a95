package churn

import (
	"context"
	"runtime"
	"testing"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/ipoibcm"
	"github.com/qpdrain/qpdrain/soft"
)

// benchQuirks are the soft device's quirks the churn benchmark runs under.
var benchQuirks = []struct {
	name string
	q    soft.Quirks
}{
	{"none", soft.Quirks{}},
	{"send-in-error-not-flushed", soft.Quirks{SendInErrorNotFlushed: true}},
	{"no-last-wqe-reached", soft.Quirks{NoLastWQEReached: true}},
	{"last-wqe-reached-twice", soft.Quirks{LastWQEReachedTwice: true}},
	{"recv-in-error-flush-deferred", soft.Quirks{RecvInErrorFlushDeferred: true}},
	{"recv-in-error-not-flushed", soft.Quirks{RecvInErrorNotFlushed: true}},
	{"drain-needs-rts", soft.Quirks{DrainNeedsRTS: true}},
	{"no-responder-error-event", soft.Quirks{NoResponderErrorEvent: true}},
}

// BenchmarkChurn runs 100,000 churn events per iteration (SRQ mode, the
// kernel's timers, a quarter of the peers vanishing) for every quirk and
// both policies, and reports what docs/BENCH.md tabulates: events/s, peak
// QPs, QPs leaked and behind a hung drain at the end, false safe.
// Run with -benchtime=1x.
func BenchmarkChurn(b *testing.B) {
	for _, q := range benchQuirks {
		for _, p := range []ipoibcm.Policy{ipoibcm.Kernel, ipoibcm.Bounded} {
			b.Run(q.name+"/"+p.String(), func(b *testing.B) { benchChurn(b, q.q, p, false) })
		}
	}
	// The eHCA thread's configuration: no SRQ (max_nonsrq_conn_qp 128).
	for _, q := range benchQuirks[:2] {
		for _, p := range []ipoibcm.Policy{ipoibcm.Kernel, ipoibcm.Bounded} {
			b.Run("nonsrq/"+q.name+"/"+p.String(), func(b *testing.B) { benchChurn(b, q.q, p, true) })
		}
	}
}

func benchChurn(b *testing.B, q soft.Quirks, p ipoibcm.Policy, noSRQ bool) {
	var res *Result
	for b.Loop() {
		rx, peers := softPair(b, q, 0)
		var err error
		res, err = Run(context.Background(), Config{Seed: 1, Events: 100_000, Device: rx, PeerDevice: peers, DeviceClock: rx.Fabric(),
			VanishFraction: DefaultVanishFraction, Manager: ipoibcm.Config{Policy: p, NoSRQ: noSRQ, RecvQueueSize: 16}})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(res.Events.Total())/res.Wall.Seconds(), "events/s")
	b.ReportMetric(float64(res.PeakQPs), "peak-qps")
	b.ReportMetric(float64(res.Leaked), "leaked")
	b.ReportMetric(float64(res.HungDrains), "hung")
	b.ReportMetric(float64(res.LateWCs), "false-safe")
	b.ReportMetric(float64(res.RejectedNoQP+res.RejectedOther), "rejected")
	b.ReportMetric(float64(res.GivenUp), "given-up")
}

// BenchmarkLiveConnection measures the memory one live connection costs:
// the Manager's bookkeeping and the soft device's RX QP (without an SRQ,
// with its ring of 16 receives posted), peers' QPs excluded.
func BenchmarkLiveConnection(b *testing.B) {
	for _, noSRQ := range []bool{false, true} {
		b.Run(map[bool]string{false: "srq", true: "nonsrq"}[noSRQ], func(b *testing.B) {
			const n = 1000
			for range b.N {
				b.StopTimer()
				rx, peerDev := softPair(b, soft.Quirks{}, 0)
				toPeer, err := route(rx, peerDev)
				if err != nil {
					b.Fatal(err)
				}
				pd, err := rx.AllocPD()
				if err != nil {
					b.Fatal(err)
				}
				ppd, err := peerDev.AllocPD()
				if err != nil {
					b.Fatal(err)
				}
				pcq, err := peerDev.CreateCQ(16, nil)
				if err != nil {
					b.Fatal(err)
				}
				m, err := ipoibcm.New(ipoibcm.Config{Context: rx, PD: pd, NoSRQ: noSRQ, RecvQueueSize: 16, MaxNonSRQConn: 1024})
				if err != nil {
					b.Fatal(err)
				}
				peers := make([]ibv.QP, n)
				for i := range peers {
					if peers[i], err = ppd.CreateQP(ibv.QPInitAttr{SendCQ: pcq, RecvCQ: pcq, Type: ibv.QPTRC, Cap: ibv.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
						b.Fatal(err)
					}
				}
				before := heapBytes()
				b.StartTimer()
				for _, p := range peers {
					if _, err := m.Accept(p.Num(), toPeer); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(heapBytes()-before)/n, "B/conn")
				closeAll(b, m, peers, pcq, ppd, pd)
			}
		})
	}
}

func heapBytes() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func closeAll(b *testing.B, m *ipoibcm.Manager, peers []ibv.QP, cq ibv.CQ, ppd, pd ibv.PD) {
	if _, err := m.Stop(context.Background()); err != nil {
		b.Fatal(err)
	}
	for _, p := range peers {
		if err := p.Close(); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range []interface{ Close() error }{cq, ppd, pd} {
		if err := c.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

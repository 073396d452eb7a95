package drain_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/teardown"
)

// BenchmarkDrainDevice runs the same comparison on the test device
// (QPDRAIN_TEST_DEVICE: the soft device, or rxe in the VM): 1,024 RC QPs
// in RTS with their own receive queues, 4 receives posted on each and
// counted back (AddOptions.CountRecvs, which rxe 6.1 needs: it never
// flushes a receive drain WR), each moved to ERROR by Add (so that Run
// cannot poll a QP's flushes before its count is registered) and drained
// by a drain WR on its own send queue: batched (headroom 1,024) and one at
// a time. "floor" is what the device allows: the same QPs moved to ERROR,
// one signaled send posted on each as its drain WR would be, and every
// flush and send completion polled by a loop that drains nothing, timed
// from the first modify to the last completion. Only the ibv API is used,
// so it measures a real provider's drain WR round trip where there is one.
func BenchmarkDrainDevice(b *testing.B) {
	const n, recvs = 1024, 4
	for _, mode := range []struct {
		name     string
		headroom int
	}{{"batched", n}, {"one-at-a-time", 1}, {"floor", 0}} {
		b.Run(mode.name, func(b *testing.B) {
			dev := devtest.Open(b)
			drainWRs := 0
			for b.Loop() {
				b.StopTimer()
				var closers teardown.List
				keep := closers.Add
				ch := must(dev.CreateCompChannel())
				keep(ch)
				cq := must(dev.CreateCQ(n*(recvs+1)+16, ch))
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
					wrs := make([]ibv.RecvWR, recvs)
					for j := range wrs {
						wrs[j].ID = recvIDBase | uint64(i*recvs+j)
					}
					if err := qps[i].PostRecv(wrs); err != nil {
						b.Fatal(err)
					}
				}
				if mode.headroom == 0 {
					runtime.GC()
					b.StartTimer()
					deviceFloor(b, cq, qps, n*(recvs+1))
					b.StopTimer()
					drainWRs += n
					if err := closers.Close(); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					continue
				}
				rp := drain.NewReaper(cq, drain.Options{Headroom: mode.headroom, DrainTimeout: devtest.Timeout, Queue: queueOf})
				ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
				runDone := make(chan error, 1)
				add := drain.AddOptions{CountRecvs: true, Recvs: recvs}
				runtime.GC()
				b.StartTimer()
				go func() { runDone <- rp.Run(ctx, drain.Feed{Channel: ch}) }()
				if mode.headroom == 1 {
					oneAtATime(ctx, b, rp, qps, add)
				} else if _, err := rp.DrainAll(ctx, qps, add); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				cancel()
				<-runDone
				drainWRs += rp.Stats().DrainWRs
				if err := closers.Close(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(drainWRs)/float64(b.N), "drainWRs/op")
		})
	}
}

// deviceFloor moves every QP of qps to ERROR, posts one signaled send on
// each (the drain WR a reaper would post, with no reaper's ID), and polls
// cq until want completions came back, within devtest.Timeout.
func deviceFloor(b *testing.B, cq ibv.CQ, qps []ibv.QP, want int) {
	send := []ibv.SendWR{{ID: sendIDBase, Opcode: ibv.WRSend, Flags: ibv.SendSignaled}}
	for _, qp := range qps {
		if err := qp.Modify(ibv.QPAttr{State: ibv.QPSErr}, ibv.QPAttrState); err != nil {
			b.Fatal(err)
		}
		if err := qp.PostSend(send); err != nil {
			b.Fatal(err)
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
		if k == 0 && time.Now().After(deadline) {
			b.Fatalf("%d of %d completions within %v", got, want, devtest.Timeout)
		}
	}
}

package inventory

import (
	"context"
	"testing"

	"github.com/qpdrain/qpdrain/rdmanl"
)

// BenchmarkTake10k joins 10,000 QPs of one process (its rows name a
// thread) with a synthetic /proc: the cost Take adds to the netlink dump.
func BenchmarkTake10k(b *testing.B) {
	const n = 10000
	root := procTree(b, task{pid: 100, tgid: 100, comm: "app", fds: map[int]string{3: uv0}}, task{pid: 101, tgid: 100, comm: "worker"})
	src := &fakeSource{devs: []rdmanl.Device{{Index: 1, Name: "rxe0", Ports: 1}}}
	for i := range n {
		src.qps = append(src.qps, rdmanl.QP{Device: 1, DeviceName: "rxe0", Port: 1, LQPN: uint32(17 + i), PID: 101, PDN: 1, Type: rdmanl.QPTypeRC, State: rdmanl.QPStateRTS,
			Has: rdmanl.HasPort | rdmanl.HasPID | rdmanl.HasPDN | rdmanl.HasRQPN | rdmanl.HasSQPSN | rdmanl.HasRQPSN})
	}
	b.ReportAllocs()
	for b.Loop() {
		snap, err := Take(context.Background(), src, Options{Proc: Proc{Root: root}})
		if err != nil || len(snap.QPs) != n || !snap.QPs[0].HoldersCertain {
			b.Fatalf("%v", err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/QP")
}

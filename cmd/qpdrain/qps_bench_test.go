package main

import (
	"io"
	"testing"

	"github.com/qpdrain/qpdrain/rdmanl"
	"github.com/qpdrain/qpdrain/rdmanl/inventory"
)

// BenchmarkPrintQPsJSON10k writes qps -j of 10,000 QPs of one process:
// the cost of the output next to the netlink dump and the joins.
func BenchmarkPrintQPsJSON10k(b *testing.B) {
	const n = 10000
	owner := &inventory.Owner{PID: 100, TID: 101, Comm: "app", Via: inventory.FromQP}
	holders := []inventory.Holder{{PID: 100, Comm: "app", FDs: []int{3}}}
	snap := &inventory.Snapshot{QPs: make([]inventory.QP, n)}
	for i := range snap.QPs {
		snap.QPs[i] = inventory.QP{QP: rdmanl.QP{Device: 1, DeviceName: "rxe0", Port: 1, LQPN: uint32(17 + i), RQPN: uint32(18 + i), PID: 101, PDN: 1,
			Type: rdmanl.QPTypeRC, State: rdmanl.QPStateRTS, Has: rdmanl.HasPort | rdmanl.HasPID | rdmanl.HasPDN | rdmanl.HasRQPN | rdmanl.HasSQPSN | rdmanl.HasRQPSN | rdmanl.HasPathMigState},
			Comm: "worker", Owner: owner, Holders: holders, HoldersCertain: true}
	}
	f, _ := inventory.ParseFilter(nil)
	b.ReportAllocs()
	for b.Loop() {
		if err := printQPs(io.Discard, snap, &f, true, false); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/QP")
}

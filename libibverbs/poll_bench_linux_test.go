//go:build linux && cgo

package libibverbs

import (
	"fmt"
	"testing"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/cverbs"
)

// BenchmarkPollFakeCQ is the binding's own cost of CQ.Poll (lock, one cgo
// call, the provider's poll_cq through libibverbs' inline ibv_poll_cq)
// against a provider whose CQ is always empty, next to the same poll
// looped in C. It runs without a device; internal/testing/devtest's
// BenchmarkPollEmptyCQ measures a real device.
func BenchmarkPollFakeCQ(b *testing.B) {
	for _, batch := range []int{1, 16} {
		b.Run(fmt.Sprintf("go/batch=%d", batch), func(b *testing.B) {
			q := &verbsCQ{}
			if err := q.setCQ(cverbs.FakeCQ()); err != nil {
				b.Fatal(err)
			}
			wcs := make([]ibv.WC, batch)
			for b.Loop() {
				if n, err := q.Poll(wcs); n != 0 || err != nil {
					b.Fatalf("Poll = %d, %v", n, err)
				}
			}
		})
		b.Run(fmt.Sprintf("c/batch=%d", batch), func(b *testing.B) {
			ns := cverbs.CPollLoop(b.N, batch)
			if ns < 0 {
				b.Fatal("the fake CQ returned completions")
			}
			b.ReportMetric(ns, "c-ns/op")
		})
	}
}

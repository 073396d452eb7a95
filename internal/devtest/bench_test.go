package devtest

import (
	"fmt"
	"testing"

	"github.com/qpdrain/qpdrain/ibv"
)

// BenchmarkPollEmptyCQ is the cost of one CQ.Poll that finds nothing: on a
// libibverbs device that is one cgo call into ibv_poll_cq, to compare with
// the same loop in C (bench/cpoll).
func BenchmarkPollEmptyCQ(b *testing.B) {
	for _, batch := range []int{1, 16} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			ctx := Open(b)
			cq := NewCQ(b, ctx, 64)
			wcs := make([]ibv.WC, batch)
			for b.Loop() {
				if n, err := cq.Poll(wcs); n != 0 || err != nil {
					b.Fatalf("Poll on an empty CQ = %d, %v", n, err)
				}
			}
		})
	}
}

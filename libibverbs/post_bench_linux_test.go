//go:build linux && cgo

package libibverbs

import (
	"fmt"
	"testing"

	"github.com/qpdrain/qpdrain/ibv"
)

// BenchmarkPostFakeQP is the binding's own cost of QP.PostSend and
// QP.PostRecv (lifecycle lock, WRs written into the QP's C post buffer, one
// cgo call that links them and calls the provider's post_send or post_recv
// through libibverbs' inline ibv_post_*) against a provider that accepts
// every WR at once. ns/op is per call of batch WRs with one SGE each.
func BenchmarkPostFakeQP(b *testing.B) {
	q := fakeQP(b)
	for _, batch := range []int{1, 16} {
		sends := make([]ibv.SendWR, batch)
		recvs := make([]ibv.RecvWR, batch)
		for i := range sends {
			sgl := []ibv.SGE{{Addr: 0x1000, Length: 64, LKey: 1}}
			sends[i] = ibv.SendWR{ID: uint64(i), Opcode: ibv.WRSend, Flags: ibv.SendSignaled, SGL: sgl}
			recvs[i] = ibv.RecvWR{ID: uint64(i), SGL: sgl}
		}
		b.Run(fmt.Sprintf("send/batch=%d", batch), func(b *testing.B) {
			for b.Loop() {
				if err := q.PostSend(sends); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("recv/batch=%d", batch), func(b *testing.B) {
			for b.Loop() {
				if err := q.PostRecv(recvs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

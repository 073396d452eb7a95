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

// BenchmarkWriteBatch is the loopback message rate: 16 signaled 64-byte
// RDMA WRITEs posted in one call, then polled back in batches; ns/op is per
// WR, so it compares devices end to end (post, transport, completion).
func BenchmarkWriteBatch(b *testing.B) {
	const batch = 16
	ctx := Open(b)
	pd := NewPD(b, ctx)
	cq := NewCQ(b, ctx, 2*batch)
	qa := NewRC(b, pd, RCConfig{SendCQ: cq, Cap: ibv.QPCap{MaxSendWR: batch, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	qb := NewRC(b, pd, RCConfig{})
	mr := Buffer(b, pd, 4096, AllAccess)
	Connect(b, ctx, qa, qb)
	wrs := make([]ibv.SendWR, batch)
	for i := range wrs {
		wrs[i] = ibv.SendWR{ID: uint64(i), Opcode: ibv.WRRDMAWrite, Flags: ibv.SendSignaled,
			SGL:        []ibv.SGE{{Addr: mr.Addr(), Length: 64, LKey: mr.LKey()}},
			RemoteAddr: mr.Addr() + 2048, RKey: mr.RKey()}
	}
	wcs := make([]ibv.WC, batch)
	b.ResetTimer()
	for i := 0; i < b.N; i += batch {
		if err := qa.PostSend(wrs); err != nil {
			b.Fatal(err)
		}
		for got := 0; got < batch; {
			n, err := cq.Poll(wcs)
			if err != nil {
				b.Fatal(err)
			}
			for _, wc := range wcs[:n] {
				if wc.Status != ibv.WCSuccess {
					b.Fatalf("completion %v", wc)
				}
			}
			got += n
		}
	}
}

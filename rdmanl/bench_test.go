package rdmanl

import (
	"context"
	"testing"

	"github.com/mdlayher/netlink"
)

// qpDump synthesizes a RES_QP_GET dump of n connected RC QPs with every
// attribute the kernel sends for a user QP, in messages of at most about
// DefaultMessageBufferSize bytes, as the kernel fills them.
func qpDump(tb testing.TB, n int) [][]byte {
	tb.Helper()
	const perMsg = (32<<10 - 64) / 84 // an RC entry with a port is 84 bytes
	var out [][]byte
	for start := 0; start < n; start += perMsg {
		var entries []func(*netlink.AttributeEncoder) error
		for i := start; i < min(n, start+perMsg); i++ {
			entries = append(entries, qpEntry(func(e *netlink.AttributeEncoder) {
				e.Uint32(attrPortIndex, 1)
				e.Uint32(attrResLQPN, uint32(17+i))
				e.Uint32(attrResPDN, 3)
				e.Uint32(attrResPID, 1234)
				e.Uint32(attrResRQPN, uint32(18+i))
				e.Uint32(attrResRQPSN, 0)
				e.Uint32(attrResSQPSN, 0)
				e.Uint8(attrResPathMigState, 0)
				e.Uint8(attrResType, uint8(QPTypeRC))
				e.Uint8(attrResState, uint8(QPStateRTS))
			}))
		}
		out = append(out, qpMessage(tb, 1, "rxe0", entries...))
	}
	return out
}

// BenchmarkDecodeQPDump decodes a 100,000-QP dump through a Conn (nltest
// socket: multipart handling, then the decoder) and reports QPs/s.
func BenchmarkDecodeQPDump(b *testing.B) {
	const n = 100000
	dump := qpDump(b, n)
	c := fakeKernel{CmdResQPGet: dump}.dial(b)
	defer c.Close()
	dev := Device{Index: 1, Name: "rxe0"}
	var qps []QP
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		var err error
		if qps, err = c.AppendQPs(context.Background(), qps[:0], dev); err != nil {
			b.Fatal(err)
		}
		if len(qps) != n {
			b.Fatalf("decoded %d QPs, want %d", len(qps), n)
		}
	}
	reportPerQP(b, n)
}

// BenchmarkDecodeQPMessages is the decoder alone over the same dump.
func BenchmarkDecodeQPMessages(b *testing.B) {
	const n = 100000
	dump := qpDump(b, n)
	var qps []QP
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		qps = qps[:0]
		for _, m := range dump {
			var err error
			if qps, err = appendQPs(qps, m); err != nil {
				b.Fatal(err)
			}
		}
	}
	reportPerQP(b, n)
}

// reportPerQP reports the time per QP next to QPs/s; allocs/op divided by
// n is the allocations per QP.
func reportPerQP(b *testing.B, n int) {
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "QPs/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n)/float64(b.N), "ns/QP")
}

// TestDecodeQPsDoesNotAllocate holds the decoder to no allocation per QP
// (the device's name, once per dump, is all): at 100,000 QPs an allocation
// per attribute was most of its time.
func TestDecodeQPsDoesNotAllocate(t *testing.T) {
	const n = 10000
	dump := qpDump(t, n)
	qps := make([]QP, 0, n)
	allocs := testing.AllocsPerRun(5, func() {
		qps = qps[:0]
		for _, m := range dump {
			var err error
			if qps, err = appendQPs(qps, m); err != nil {
				t.Fatal(err)
			}
		}
	})
	if len(qps) != n || allocs > 1 {
		t.Errorf("decoded %d QPs with %.0f allocations, want %d with at most 1", len(qps), allocs, n)
	}
}

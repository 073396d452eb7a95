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
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "QPs/s")
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
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "QPs/s")
}

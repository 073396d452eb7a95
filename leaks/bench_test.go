package leaks

import "testing"

// BenchmarkAnalyze10k analyses four samples of 10,000 QPs of 100 owners, a
// tenth in ERR (those of 10 owners): the cost qpdrain leaks adds to its
// netlink reads.
func BenchmarkAnalyze10k(b *testing.B) {
	const n = 10000
	s := samples(4, func(int) []QP {
		qps := make([]QP, n)
		for i := range qps {
			state := "RTS"
			if i%10 == 0 {
				state = "ERR"
			}
			qps[i] = rc(uint32(100+i), state, Process{PID: 1000 + i%100, Comm: "app"})
		}
		return qps
	})
	b.ReportAllocs()
	for b.Loop() {
		r := Analyze(s, Options{})
		if len(r.Findings) != 10 {
			b.Fatalf("%d findings, want 10", len(r.Findings))
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/(4*n), "ns/QP-sample")
}

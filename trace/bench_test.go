package trace

import (
	"fmt"
	"path/filepath"
	"testing"
)

// BenchmarkPostPoll runs the postpoll program (one receive and one send
// posted, both completions polled: four records a round trip) on the fake
// provider untraced and traced, side by side in one run, and reports the
// time of a round trip each way and the shim's cost per record.
func BenchmarkPostPoll(b *testing.B) {
	shim, dir := hostRig(b, "postpoll")
	const trips = 200000
	each := func(shim string) float64 {
		out, res := runOut(b, shim, filepath.Join(dir, "postpoll"), fmt.Sprint(trips))
		var n int
		var us float64
		if _, err := fmt.Sscanf(out, "postpoll: %d round trips, %f us each", &n, &us); err != nil || res.ExitCode != 0 {
			b.Fatalf("postpoll: %q, %s (%v)", out, res.Status, err)
		}
		return us
	}
	var plain, traced float64
	for i := 0; i < b.N; i++ {
		plain += each("")
		traced += each(shim)
	}
	plain, traced = plain/float64(b.N), traced/float64(b.N)
	b.ReportMetric(plain, "us/trip-untraced")
	b.ReportMetric(traced, "us/trip-traced")
	b.ReportMetric((traced-plain)/4*1000, "ns/record")
}

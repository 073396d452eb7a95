package trace

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
)

// BenchmarkPostPoll runs the postpoll program (one receive and one send
// posted, both completions polled: four records a round trip) on the fake
// provider untraced and traced, alternately, b.N rounds in one run, and
// reports the round trip each way and the shim's cost per record, from
// the fastest round of each side (the one the shared host's other work
// disturbed least) in wall time and in the thread's CPU time.
func BenchmarkPostPoll(b *testing.B) {
	shim, dir := hostRig(b, "postpoll")
	const trips = 200000
	each := func(shim string) (wall, cpu float64) {
		out, res := runOut(b, shim, filepath.Join(dir, "postpoll"), fmt.Sprint(trips))
		var n int
		if _, err := fmt.Sscanf(out, "postpoll: %d round trips, %f us each, %f us of CPU each", &n, &wall, &cpu); err != nil || res.ExitCode != 0 {
			b.Fatalf("postpoll: %q, %s (%v)", out, res.Status, err)
		}
		return wall, cpu
	}
	var plain, traced, plainCPU, tracedCPU []float64
	for i := 0; i < b.N; i++ {
		w, c := each("")
		plain, plainCPU = append(plain, w), append(plainCPU, c)
		w, c = each(shim)
		traced, tracedCPU = append(traced, w), append(tracedCPU, c)
	}
	b.ReportMetric(slices.Min(plain), "us/trip-untraced")
	b.ReportMetric(slices.Min(traced), "us/trip-traced")
	b.ReportMetric((slices.Min(traced)-slices.Min(plain))/4*1000, "ns/record")
	b.ReportMetric((slices.Min(tracedCPU)-slices.Min(plainCPU))/4*1000, "cpu-ns/record")
}

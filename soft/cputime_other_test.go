//go:build !unix

package soft_test

import "time"

// cpuTime is not measured here; benchmarks then omit CPU-time figures.
func cpuTime() time.Duration { return 0 }

//go:build unix

package soft_test

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time (user and system) the process has used: with
// GOMAXPROCS=1 it measures the benchmark's own core, whatever else the
// shared machine runs.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

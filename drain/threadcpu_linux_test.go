package drain_test

import (
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU is the CPU time (user and system) of the calling OS thread
// (getrusage(2), RUSAGE_THREAD): locked to it, a benchmark goroutine that
// drives the device and the reaper alone measures its own work, not the
// time the shared machine's other processes took the core from it.
func threadCPU() time.Duration { return rusage(unix.RUSAGE_THREAD) }

// processCPU is the CPU time of every thread of the process (RUSAGE_SELF):
// what a drain costs when it runs on more than one goroutine (Run's and
// the caller's).
func processCPU() time.Duration { return rusage(unix.RUSAGE_SELF) }

// threadFaults is the calling OS thread's count of page faults served
// without I/O (ru_minflt): the first touches of memory the runtime took
// from the kernel, or got back after returning it.
func threadFaults() int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		return 0
	}
	return ru.Minflt
}

func rusage(who int) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(who, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

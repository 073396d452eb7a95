package drain_test

import (
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU is the CPU time (user and system) of the calling OS thread
// (getrusage(2), RUSAGE_THREAD): locked to it, a benchmark goroutine that
// drives the device and the reaper alone measures its own work, not the
// time the shared machine's other processes took the core from it.
func threadCPU() time.Duration { return cpuTime(rusage(unix.RUSAGE_THREAD)) }

// processCPU is the CPU time of every thread of the process (RUSAGE_SELF):
// what a drain costs when it runs on more than one goroutine (Run's and
// the caller's).
func processCPU() time.Duration { return cpuTime(rusage(unix.RUSAGE_SELF)) }

// threadFaults is the calling OS thread's count of page faults served
// without I/O (ru_minflt): the first touches of memory the runtime took
// from the kernel, or got back after returning it.
func threadFaults() int64 { return rusage(unix.RUSAGE_THREAD).Minflt }

// rusage is getrusage(2) of who, zero when it fails (the figures are then
// omitted).
func rusage(who int) unix.Rusage {
	var ru unix.Rusage
	if err := unix.Getrusage(who, &ru); err != nil {
		return unix.Rusage{}
	}
	return ru
}

// cpuTime is the user and system CPU time of ru.
func cpuTime(ru unix.Rusage) time.Duration { return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()) }

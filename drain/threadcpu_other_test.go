//go:build !linux

package drain_test

import "time"

// threadCPU is not measured here; benchmarks then omit their cpu-ns/op.
func threadCPU() time.Duration { return 0 }

// processCPU is not measured here; BenchmarkDrainDevice then omits its
// CPU figures.
func processCPU() time.Duration { return 0 }

// threadFaults is not counted here; benchmarks then omit their faults/op.
func threadFaults() int64 { return 0 }

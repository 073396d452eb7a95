//go:build !linux

package devtest

// KernelVersion returns 0, 0: rxe, the only device whose expectations
// depend on the kernel version, exists only on Linux.
func KernelVersion() (major, minor int) { return 0, 0 }

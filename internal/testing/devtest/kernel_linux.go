package devtest

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// KernelVersion returns the running kernel's major and minor version, for
// the tests whose expectation of rxe depends on it; 0, 0 if unknown.
func KernelVersion() (major, minor int) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return 0, 0
	}
	_, _ = fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor)
	return major, minor
}

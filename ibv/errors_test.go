package ibv

import (
	"errors"
	"syscall"
	"testing"
)

// ErrnoError gives the sentinel an errno unambiguously means, else the
// errno; either matches the errno.
func TestErrnoError(t *testing.T) {
	for _, c := range []struct {
		errno syscall.Errno
		want  error
	}{
		{syscall.EINVAL, ErrInvalidArgument},
		{syscall.EBUSY, ErrBusy},
		{syscall.ENODEV, ErrNoDevice},
		{syscall.EOPNOTSUPP, ErrNotSupported},
		{syscall.ENOMEM, syscall.ENOMEM},
		{syscall.EIO, syscall.EIO},
	} {
		got := ErrnoError(c.errno)
		if got != c.want || !errors.Is(got, c.errno) {
			t.Errorf("ErrnoError(%v) = %v, want %v matching the errno", c.errno, got, c.want)
		}
	}
}

//go:build linux && cgo

package libibverbs

import (
	"errors"
	"syscall"
	"testing"

	"github.com/qpdrain/qpdrain/ibv"
)

func TestErrnoErr(t *testing.T) {
	for _, tc := range []struct {
		errno     syscall.Errno
		sentinels []error
		want      error
	}{
		{syscall.EINVAL, nil, ibv.ErrInvalidArgument},
		{syscall.EBUSY, nil, ibv.ErrBusy},
		{syscall.EOPNOTSUPP, nil, ibv.ErrNotSupported},
		{syscall.ENODEV, nil, ibv.ErrNoDevice},
		{syscall.ENOMEM, []error{ibv.ErrQueueFull}, ibv.ErrQueueFull},
		{syscall.ENOMEM, []error{ibv.ErrResourceLimit}, ibv.ErrResourceLimit},
		{syscall.ENOMEM, nil, syscall.ENOMEM},
		{syscall.EIO, []error{ibv.ErrQueueFull}, syscall.EIO},
	} {
		err := errnoErr(tc.errno, tc.sentinels...)
		if err != tc.want || !errors.Is(err, tc.errno) {
			t.Errorf("errnoErr(%v, %v) = %v, want %v matching the errno", tc.errno, tc.sentinels, err, tc.want)
		}
	}
	for rc, want := range map[int]syscall.Errno{22: syscall.EINVAL, -22: syscall.EINVAL, -1: syscall.EPERM} {
		if got := rcErrno(rc); got != want {
			t.Errorf("rcErrno(%d) = %v, want %v", rc, got, want)
		}
	}
	if err := cErr(syscall.Errno(0)); !errors.Is(err, syscall.EIO) {
		t.Errorf("cErr(0) = %v, want EIO", err)
	}
}

// TestOpenMissing: a device that does not exist is ErrNoDevice, whether
// the machine has RDMA (the name is unknown) or not (no device at all);
// without libibverbs it is Load's error.
func TestOpenMissing(t *testing.T) {
	want := ibv.ErrNoDevice
	if err := Load(); err != nil {
		want = err
	}
	ctx, err := Open("qpdrain-no-such-device")
	if err == nil {
		ctx.Close()
		t.Fatal("Open of a missing device succeeded")
	}
	if !errors.Is(err, want) {
		t.Errorf("Open of a missing device = %v, want %v", err, want)
	}
	if devs, err := Devices(); err != nil && !errors.Is(err, want) {
		t.Errorf("Devices() = %v, %v; want a list or %v", devs, err, want)
	}
}

package rdmanl

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"

	"github.com/mdlayher/netlink"

	"github.com/qpdrain/qpdrain/ibv"
)

// A kernel's error reply to a dump (a kernel before 5.11 answers
// RES_CTX_GET with EINVAL) is the whole reply: the Conn stays usable, and
// the next request on it is answered.
func TestConnKernelErrorKeepsConn(t *testing.T) {
	dev := Device{Index: 1, Name: "rxe0"}
	for _, errno := range []syscall.Errno{syscall.EINVAL, syscall.EOPNOTSUPP, syscall.EPERM} {
		c := fakeKernel{CmdGet: {nil}}.dialHook(t, func(cmd Command) syscall.Errno {
			if cmd == CmdResCtxGet {
				return errno
			}
			return 0
		})
		_, err := c.Contexts(context.Background(), dev)
		if !errors.Is(err, errno) || errors.Is(err, ErrUnusable) {
			t.Errorf("RES_CTX_GET answered %v: err %v, want it, not ErrUnusable", errno, err)
		}
		if _, err := c.Devices(context.Background()); err != nil {
			t.Errorf("GET after RES_CTX_GET answered %v: %v, want the Conn usable", errno, err)
		}
		c.Close()
	}
}

// On a host without RDMA netlink (no ib_core: EPROTONOSUPPORT) Dial's
// error is the project's "no RDMA here", ibv.ErrNoDevice, and keeps the
// errno.
func TestDialWithoutRDMA(t *testing.T) {
	c, err := Dial()
	if err == nil {
		c.Close()
		t.Skip("this host has RDMA netlink")
	}
	if !errors.Is(err, ibv.ErrNoDevice) || !errors.Is(err, syscall.EPROTONOSUPPORT) && !errors.Is(err, syscall.EAFNOSUPPORT) {
		t.Errorf("Dial: %v, want an error matching ibv.ErrNoDevice and EPROTONOSUPPORT or EAFNOSUPPORT", err)
	}
}

// dialError: only a kernel or OS without RDMA netlink is "no RDMA here".
func TestDialError(t *testing.T) {
	for _, tc := range []struct {
		err    error
		linux  bool
		noRDMA bool
	}{
		{os.NewSyscallError("socket", syscall.EPROTONOSUPPORT), true, true},
		{os.NewSyscallError("socket", syscall.EAFNOSUPPORT), true, true},
		{errors.New("netlink: not implemented on darwin/arm64"), false, true},
		{os.NewSyscallError("socket", syscall.EMFILE), true, false},
		{os.NewSyscallError("bind", syscall.EPERM), true, false},
	} {
		err := dialError(tc.err, tc.linux)
		if errors.Is(err, ibv.ErrNoDevice) != tc.noRDMA || !errors.Is(err, tc.err) {
			t.Errorf("dialError(%v, linux %v) = %v: matches ibv.ErrNoDevice %v, want %v, and the cause", tc.err, tc.linux, err, !tc.noRDMA, tc.noRDMA)
		}
	}
}

// A dump whose first message is malformed fails with ErrMalformed, though
// the messages after it decode: its rows are not silently missing.
func TestConnDumpFirstMessageMalformed(t *testing.T) {
	good := qpMessage(t, 1, "rxe0", qpEntry(func(e *netlink.AttributeEncoder) { e.Uint32(attrResLQPN, 17) }))
	bad := qpMessage(t, 1, "rxe0", qpEntry(func(e *netlink.AttributeEncoder) { e.Uint8(attrResLQPN, 9) }))
	c := fakeKernel{CmdResQPGet: {bad, good}, CmdGet: {nil}}.dial(t)
	defer c.Close()
	if qps, err := c.QPs(context.Background(), Device{Index: 1, Name: "rxe0"}); !errors.Is(err, ErrMalformed) {
		t.Errorf("dump with a malformed first message: %d QPs, err %v; want ErrMalformed", len(qps), err)
	}
	// The rest of the dump was read: the Conn is usable.
	if _, err := c.Devices(context.Background()); err != nil {
		t.Errorf("GET after it: %v", err)
	}
}

// After a dump cut short by its context, the rest of it may be queued on
// the socket: every later call on the Conn fails with ErrUnusable.
func TestConnUnusableAfterCanceledDump(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := fakeKernel{CmdResQPGet: {qpMessage(t, 1, "rxe0"), qpMessage(t, 1, "rxe0")}, CmdGet: {nil}}.dialHook(t, func(cmd Command) syscall.Errno {
		if cmd == CmdResQPGet {
			cancel() // while the dump is on its way
		}
		return 0
	})
	defer c.Close()
	if _, err := c.QPs(ctx, Device{Index: 1, Name: "rxe0"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("dump canceled midway: %v, want context.Canceled", err)
	}
	if _, err := c.Devices(context.Background()); !errors.Is(err, ErrUnusable) {
		t.Errorf("GET after a canceled dump: %v, want ErrUnusable", err)
	}
}

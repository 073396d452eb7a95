package rdmanl

import (
	"context"
	"errors"
	"syscall"
	"testing"
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

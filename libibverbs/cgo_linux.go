//go:build linux && cgo

package libibverbs

/*
#cgo LDFLAGS: -ldl
#include "verbs_linux.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/ibv/objtrace"
)

// lifecycle is the closed state and user count every libibverbs object
// shares. Operations hold mu shared for their whole cgo call, so Close,
// which holds it exclusively, never frees C memory under a running call.
// users counts the live children or QPs that keep the object open.
type lifecycle struct {
	mu     sync.RWMutex
	closed bool
	users  atomic.Int32
}

// enter starts an operation; it fails with ErrClosed after Close.
func (l *lifecycle) enter() error {
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return ibv.ErrClosed
	}
	return nil
}

func (l *lifecycle) exit() { l.mu.RUnlock() }

// close is the Close protocol every object shares. It is idempotent (nil
// once closed) and fails with ErrBusy while users remain; otherwise destroy
// (the C destroy and the object's own cleanup) runs holding l exclusively,
// so no operation is inside a cgo call on the object, and once it succeeds
// the object is closed, each of parents has one user fewer and its leak
// record is released. A failed destroy leaves the object open, so Close can
// be retried.
func (l *lifecycle) close(what string, trace *objtrace.Record, destroy func() error, parents ...*lifecycle) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	if n := l.users.Load(); n > 0 {
		return fmt.Errorf("closing %s with %d users: %w", what, n, ibv.ErrBusy)
	}
	if err := destroy(); err != nil {
		return err
	}
	l.closed = true
	for _, p := range parents {
		p.users.Add(-1)
	}
	trace.Release()
	return nil
}

// errnoErr turns an errno from libibverbs into an error that matches it with
// errors.Is and, when the errno means one, the sentinel given for it.
func errnoErr(errno syscall.Errno, sentinels ...error) error {
	for _, s := range sentinels {
		if e, ok := s.(*ibv.Error); ok && e.Errno() == errno {
			return s
		}
	}
	return ibv.ErrnoError(errno)
}

// rcErr is errnoErr for the functions that return an errno as their result.
func rcErr(rc C.int, sentinels ...error) error {
	return errnoErr(rcErrno(int(rc)), sentinels...)
}

// rcErrno is the errno of rc, a verb's result. libibverbs' verbs return
// errno's value, but some providers' post verbs return it negated
// (rdma-core's libsiw: -EINVAL), which names the same errno.
func rcErrno(rc int) syscall.Errno {
	if rc < 0 {
		rc = -rc
	}
	return syscall.Errno(rc)
}

// rcCheck is nil when rc, the errno result of a verb without one to keep,
// is 0; otherwise it is rcErr(rc) wrapped with what the verb was doing.
// The error is made out of line so that the check inlines (ReqNotify is
// on a reaper's path).
func rcCheck(rc C.int, doing string) error {
	if rc == 0 {
		return nil
	}
	return rcFailed(rc, doing)
}

// rcFailed is the error of rcCheck.
func rcFailed(rc C.int, doing string) error { return fmt.Errorf("%s: %w", doing, rcErr(rc)) }

// cErr is errnoErr for the functions that return NULL or -1 and set errno.
// A zero errno (a provider that forgot to set it) becomes EIO.
func cErr(err error, sentinels ...error) error {
	errno, ok := err.(syscall.Errno)
	if !ok || errno == 0 {
		errno = syscall.EIO
	}
	return errnoErr(errno, sentinels...)
}

// handles maps the integers stored as cq_context, qp_context and
// srq_context back to their Go objects, so no Go pointer is kept in C
// memory. Handles are never reused, so an event for a destroyed object
// cannot be delivered to a new one.
type handles struct {
	mu   sync.Mutex
	next uintptr
	objs map[uintptr]any
}

func (h *handles) add(obj any) uintptr {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.objs == nil {
		h.objs = map[uintptr]any{}
	}
	h.next++
	h.objs[h.next] = obj
	return h.next
}

func (h *handles) get(handle uintptr) any {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.objs[handle]
}

func (h *handles) remove(handle uintptr) {
	h.mu.Lock()
	delete(h.objs, handle)
	h.mu.Unlock()
}

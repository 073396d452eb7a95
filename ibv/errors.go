package ibv

import (
	"fmt"
	"strings"
	"syscall"
)

// Sentinel errors. Each also matches the errno libibverbs returns for the same
// condition, so errors.Is(err, unix.EINVAL) holds on every device.
var (
	// ErrNotSupported: the operation or device is not available here.
	ErrNotSupported error = &Error{"not supported", syscall.EOPNOTSUPP}
	// ErrClosed: the object was closed.
	ErrClosed error = &Error{"object closed", syscall.EBADF}
	// ErrBusy: the object still has children or users.
	ErrBusy error = &Error{"object in use", syscall.EBUSY}
	// ErrInvalidState: the soft device's SRQ is in error (a post to it, a
	// QP created on it), a state rxe cannot reach. A post to a QP whose
	// state forbids it and an invalid state transition are
	// ErrInvalidArgument on every device: libibverbs returns EINVAL for
	// them, as for a bad attribute.
	ErrInvalidState error = &Error{"invalid state", syscall.EINVAL}
	// ErrInvalidArgument: an attribute, mask or WR field is wrong.
	ErrInvalidArgument error = &Error{"invalid argument", syscall.EINVAL}
	// ErrQueueFull: a work queue has no room for another WR.
	ErrQueueFull error = &Error{"work queue full", syscall.ENOMEM}
	// ErrResourceLimit: a device limit (max QPs, CQEs, ...) would be exceeded.
	ErrResourceLimit error = &Error{"device resource limit reached", syscall.ENOMEM}
	// ErrWoken: CompChannel.Wake ended the wait.
	ErrWoken error = &Error{"wait ended by Wake", syscall.EINTR}
	// ErrNoDevice: no RDMA device by that name, or none at all.
	ErrNoDevice error = &Error{"no such RDMA device", syscall.ENODEV}
)

// Error is a sentinel error that also matches its errno.
type Error struct {
	msg   string
	errno syscall.Errno
}

// Error returns the condition's description.
func (e *Error) Error() string { return e.msg }

// Is reports whether target is this error or its errno.
func (e *Error) Is(target error) bool {
	errno, ok := target.(syscall.Errno)
	return ok && errno == e.errno
}

// Errno is the errno libibverbs returns for this condition.
func (e *Error) Errno() syscall.Errno { return e.errno }

// ErrnoError is the error a binding returns for an errno of its library:
// the sentinel that errno means when one is unambiguous (EINVAL is
// ErrInvalidArgument, EBUSY ErrBusy, ENODEV ErrNoDevice, EOPNOTSUPP
// ErrNotSupported), else the errno itself. Either matches the errno with
// errors.Is. A binding that knows a call's own meaning of an errno (ENOMEM
// as a full queue or a device limit) chooses the sentinel itself.
func ErrnoError(errno syscall.Errno) error {
	switch errno {
	case syscall.EINVAL:
		return ErrInvalidArgument
	case syscall.EBUSY:
		return ErrBusy
	case syscall.ENODEV:
		return ErrNoDevice
	case syscall.EOPNOTSUPP:
		return ErrNotSupported
	}
	return errno
}

// LoadError reports that a library a binding opens at run time (libibverbs,
// librdmacm) could not be loaded: it is missing (Symbol empty), or it lacks
// an entry point the binding calls. It matches ErrNotSupported: the
// binding is not available here, and the soft device is.
type LoadError struct {
	Name    string // the library, "libibverbs"
	Package string // what provides it, "libibverbs1 and, for device drivers, ibverbs-providers"
	Library string // the file opened, "libibverbs.so.1"
	Symbol  string // the missing entry point with its version, "ibv_create_qp@IBVERBS_1.1"
	Reason  string // the dynamic loader's message (dlerror)
}

// Error says what is missing and which Debian package provides it.
func (e *LoadError) Error() string {
	if e.Symbol != "" {
		return fmt.Sprintf("%s is too old: %s lacks %s (%s); install a newer %s", e.Name, e.Library, e.Symbol, e.Reason, e.Package)
	}
	what := e.Name + " is not installed"
	if !strings.Contains(e.Reason, "No such file or directory") {
		what = e.Name + " cannot be loaded" // there, but not usable: another architecture, a broken file
	}
	return fmt.Sprintf("%s: %s (install Debian's %s)", what, e.Reason, e.Package)
}

// Unwrap returns ErrNotSupported.
func (e *LoadError) Unwrap() error { return ErrNotSupported }

// PostError reports a post that stopped at WR Index (the bad_wr of
// ibv_post_send); the WRs before Index were posted.
type PostError struct {
	Index int
	Err   error
}

// Error names the WR that was not posted and why.
func (e *PostError) Error() string { return fmt.Sprintf("posting WR %d: %v", e.Index, e.Err) }

// Unwrap returns the cause.
func (e *PostError) Unwrap() error { return e.Err }

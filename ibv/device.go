package ibv

import (
	"fmt"
	"sync/atomic"
)

// DeviceInfo describes an RDMA device found by Devices.
type DeviceInfo struct {
	Name      string
	GUID      uint64
	NodeType  NodeType
	Transport TransportType
}

// Binding is an implementation that opens devices by name: the libibverbs
// binding (package libibverbs) registers itself with Register when a
// program imports it, the way a database/sql driver does, so a program that
// does not import it links no cgo. The soft device needs no registration:
// its callers build it (soft.New).
type Binding interface {
	// Load reports whether the binding can be used on this machine, with
	// an error matching ErrNotSupported that says why not.
	Load() error
	// Devices lists the devices the binding sees.
	Devices() ([]DeviceInfo, error)
	// Open opens the device called name.
	Open(name string) (Context, error)
}

// binding is the registered Binding, nil until one registers.
var binding atomic.Pointer[Binding]

// Register makes b the Binding that Load, Devices and Open use. A binding
// calls it from its package's init; registering a nil binding, or a second
// one, is a programming error and panics (as database/sql.Register does), so
// that it shows when the program starts rather than on the first Open.
func Register(b Binding) {
	if b == nil {
		panic("ibv: Register of a nil Binding")
	}
	if !binding.CompareAndSwap(nil, &b) {
		panic("ibv: Register called twice")
	}
}

// errNoBinding is why Load, Devices and Open fail in a program that links
// no binding.
var errNoBinding = fmt.Errorf("this program has no libibverbs binding (it imports no github.com/qpdrain/qpdrain/libibverbs): %w", ErrNotSupported)

// Load reports whether the registered binding can be used: nil, or an
// error matching ErrNotSupported (a *LoadError when libibverbs itself is
// missing) that callers print to say why they use the soft device instead.
func Load() error {
	b := binding.Load()
	if b == nil {
		return errNoBinding
	}
	return (*b).Load()
}

// Devices lists the RDMA devices the registered binding sees. Without one,
// or when it cannot load, the error matches ErrNotSupported; on a kernel
// without RDMA support it matches ErrNoDevice; with support but no device
// the list is empty.
func Devices() ([]DeviceInfo, error) {
	b := binding.Load()
	if b == nil {
		return nil, fmt.Errorf("listing RDMA devices: %w", errNoBinding)
	}
	return (*b).Devices()
}

// Open opens the RDMA device called name through the registered binding.
// Without one, or when it cannot load, the error matches ErrNotSupported; a
// name the binding does not list is ErrNoDevice.
func Open(name string) (Context, error) {
	b := binding.Load()
	if b == nil {
		return nil, fmt.Errorf("opening RDMA device %q: %w", name, errNoBinding)
	}
	return (*b).Open(name)
}

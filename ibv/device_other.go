//go:build !(linux && cgo)

package ibv

import "fmt"

// errNoBinding is why this build has no libibverbs implementation.
var errNoBinding = fmt.Errorf("this build has no libibverbs (it needs linux and cgo): %w", ErrNotSupported)

// Load reports whether the libibverbs implementation can be used. This build
// has none (it needs linux and cgo), so it answers ErrNotSupported.
func Load() error { return errNoBinding }

// Devices lists the RDMA devices libibverbs sees. This build has no
// libibverbs, so it answers ErrNotSupported.
func Devices() ([]DeviceInfo, error) { return nil, errNoBinding }

// Open opens the RDMA device called name through libibverbs. This build has
// no libibverbs, so it answers ErrNotSupported.
func Open(name string) (Context, error) { return nil, errNoBinding }

//go:build !(linux && cgo)

package libibverbs

import (
	"fmt"

	"github.com/qpdrain/qpdrain/ibv"
)

// errNoLibibverbs is why this build has no libibverbs implementation.
var errNoLibibverbs = fmt.Errorf("this build has no libibverbs (it needs linux and cgo): %w", ibv.ErrNotSupported)

// Load reports whether libibverbs can be used. This build has none (it
// needs linux and cgo), so it answers ibv.ErrNotSupported.
func Load() error { return errNoLibibverbs }

// Devices lists the RDMA devices libibverbs sees. This build has no
// libibverbs, so it answers ibv.ErrNotSupported.
func Devices() ([]ibv.DeviceInfo, error) { return nil, errNoLibibverbs }

// Open opens the RDMA device called name through libibverbs. This build has
// no libibverbs, so it answers ibv.ErrNotSupported.
func Open(name string) (ibv.Context, error) { return nil, errNoLibibverbs }

//go:build !(linux && cgo)

package librdmacm

import (
	"fmt"

	"github.com/qpdrain/qpdrain/cm"
	"github.com/qpdrain/qpdrain/ibv"
)

// errNoLibrdmacm is why this build has no librdmacm implementation.
var errNoLibrdmacm = fmt.Errorf("this build has no librdmacm (it needs linux and cgo): %w", ibv.ErrNotSupported)

// Load reports whether librdmacm can be used. This build has none (it
// needs linux and cgo), so it answers ibv.ErrNotSupported.
func Load() error { return errNoLibrdmacm }

// Open returns the RDMA CM of librdmacm. This build has none, so it
// answers ibv.ErrNotSupported.
func Open() (cm.Manager, error) { return nil, errNoLibrdmacm }

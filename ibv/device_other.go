//go:build !(linux && cgo)

package ibv

// Devices lists the RDMA devices libibverbs sees. This build has no
// libibverbs (it needs linux and cgo), so it answers ErrNotSupported.
func Devices() ([]DeviceInfo, error) { return nil, ErrNotSupported }

// Open opens the RDMA device called name through libibverbs. This build has
// no libibverbs, so it answers ErrNotSupported.
func Open(name string) (Context, error) { return nil, ErrNotSupported }

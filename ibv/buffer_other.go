//go:build !unix

package ibv

import "fmt"

// AllocBuffer returns size bytes for RegMR. This platform has no libibverbs,
// so the only device is the soft one, which accepts Go memory: the buffer is
// an ordinary slice. Free it with FreeBuffer after the MR that uses it is
// closed.
func AllocBuffer(size int) ([]byte, error) {
	if size <= 0 {
		return nil, fmt.Errorf("allocating buffer of %d bytes: %w", size, ErrInvalidArgument)
	}
	return make([]byte, size), nil
}

// FreeBuffer releases memory from AllocBuffer; the garbage collector does
// the work here.
func FreeBuffer(buf []byte) error { return nil }

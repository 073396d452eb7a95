//go:build unix

package ibv

import (
	"fmt"
	"syscall"
)

// AllocBuffer returns size bytes of page-aligned memory outside the Go heap,
// suitable for RegMR on any device. Free it with FreeBuffer after the MR that
// uses it is closed.
func AllocBuffer(size int) ([]byte, error) {
	if size <= 0 {
		return nil, fmt.Errorf("allocating buffer of %d bytes: %w", size, ErrInvalidArgument)
	}
	buf, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return nil, fmt.Errorf("allocating buffer of %d bytes: %w", size, err)
	}
	return buf, nil
}

// FreeBuffer releases memory from AllocBuffer.
func FreeBuffer(buf []byte) error {
	if err := syscall.Munmap(buf); err != nil {
		return fmt.Errorf("freeing buffer: %w", err)
	}
	return nil
}

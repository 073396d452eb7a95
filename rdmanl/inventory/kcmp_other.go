//go:build !linux

package inventory

import "fmt"

// kcmpSameFile: kcmp(2) is Linux's.
func kcmpSameFile(pid1 uint32, fd1 int, pid2 uint32, fd2 int) (bool, error) {
	return false, fmt.Errorf("kcmp: %w", ErrNoKcmp)
}

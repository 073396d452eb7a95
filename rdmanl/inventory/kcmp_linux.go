package inventory

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// kcmpFile is KCMP_FILE (include/uapi/linux/kcmp.h).
const kcmpFile = 0

// kcmpSameFile asks kcmp(2) whether fd1 of pid1 and fd2 of pid2 are one
// open file description. It needs ptrace read access to both processes
// (root has it). A closed fd or a gone process is ErrFDGone; a kernel
// without kcmp (CONFIG_KCMP off) or a caller without access is
// ErrNoKcmp.
func kcmpSameFile(pid1 uint32, fd1 int, pid2 uint32, fd2 int) (bool, error) {
	r, _, e := unix.Syscall6(unix.SYS_KCMP, uintptr(pid1), uintptr(pid2), kcmpFile, uintptr(fd1), uintptr(fd2), 0)
	switch {
	case e == 0:
		return r == 0, nil
	case errors.Is(e, unix.EBADF), errors.Is(e, unix.ESRCH):
		return false, fmt.Errorf("kcmp %d/%d %d/%d: %w: %w", pid1, fd1, pid2, fd2, ErrFDGone, e)
	default:
		return false, fmt.Errorf("kcmp %d/%d %d/%d: %w: %w", pid1, fd1, pid2, fd2, ErrNoKcmp, e)
	}
}

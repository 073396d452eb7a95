//go:build !linux

package trace

import "os"

// allocate sizes f (Run traces on Linux only).
func allocate(f *os.File, size int64) error { return f.Truncate(size) }

//go:build unix

package vm

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// lockCache takes cache/lock (flock, the lock every user of the cache
// shares: one VM run at a time, so that kernel downloads and run/ never
// interleave and VMs do not compete for the host's CPUs), waiting as long as
// ctx allows and saying so. The wait is a blocking flock, so that it queues
// with the other waiters instead of polling behind them; if ctx ends first,
// the waiting goroutine releases the lock as soon as it gets it.
func lockCache(ctx context.Context, cache string, w io.Writer) (func(), error) {
	path := filepath.Join(cache, "lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the cache lock: %w", err)
	}
	unlock := func() { f.Close() }
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if err == nil {
		return unlock, nil
	}
	if err != unix.EWOULDBLOCK {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	fmt.Fprintf(w, "qpdrain vm: another run holds %s; waiting\n", path)
	start := time.Now()
	got := make(chan error) // unbuffered: a lock got after the caller left is released
	abandoned := make(chan struct{})
	go func() {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX)
		select {
		case got <- err:
		case <-abandoned:
			f.Close()
		}
	}()
	select {
	case err := <-got:
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		fmt.Fprintf(w, "qpdrain vm: got %s after %.0fs\n", path, time.Since(start).Seconds())
		return unlock, nil
	case <-ctx.Done():
		close(abandoned)
		return nil, fmt.Errorf("waiting for %s: %w", path, ctx.Err())
	}
}

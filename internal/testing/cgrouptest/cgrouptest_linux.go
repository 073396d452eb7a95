// Package cgrouptest puts test processes into real cgroup v2 directories
// shaped as the kubelet and the runtimes name them, and takes them out
// again: for package workload's tests on the host and qpdrain's in the VM.
package cgrouptest

import (
	"bufio"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Root is where cgroup v2 is mounted (/sys/fs/cgroup on a v2 host,
// /sys/fs/cgroup/unified on a hybrid one), from /proc/self/mountinfo
// (proc(5): the fifth field is the mount point; the file system type
// follows " - "). Where none is mounted (the VM's guest) it mounts one on
// a temporary directory, unmounted when t ends; where it cannot, t skips,
// saying why.
func Root(t testing.TB) string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Skipf("no /proc/self/mountinfo (%v): real cgroups NOT tested", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields := strings.Fields(pre)
		if ok && len(fields) >= 5 && strings.HasPrefix(post, "cgroup2 ") {
			return fields[4]
		}
	}
	dir := t.TempDir()
	if err := unix.Mount("cgroup2", dir, "cgroup2", 0, ""); err != nil {
		t.Skipf("no cgroup2 mounted, and mounting one failed (%v): real cgroups NOT tested", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmounting cgroup2 from %s: %v", dir, err)
		}
	})
	return dir
}

// Place creates the cgroup root/shared.../own... and moves process pid
// into it. The shared levels may exist already (other pods use them); the
// own ones must not. When t ends it moves pid back to the root cgroup, if
// it still lives, and removes the own levels and the shared ones it
// created. Where cgroup v2 is not writable (not root, read-only) t skips,
// saying so. It returns the cgroup's path as /proc/PID/cgroup shows it.
func Place(t testing.TB, root string, shared, own []string, pid int) string {
	t.Helper()
	var made []string
	dir := root
	rm := func() {
		for i := len(made) - 1; i >= 0; i-- {
			remove(t, made[i], i >= len(made)-len(own))
		}
	}
	levels := append(append([]string{}, shared...), own...)
	for i, name := range levels {
		dir = filepath.Join(dir, name)
		err := os.Mkdir(dir, 0o755)
		switch {
		case err == nil:
			made = append(made, dir)
		case errors.Is(err, fs.ErrExist) && i < len(shared):
		case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EROFS):
			rm()
			t.Skipf("cgroup v2 at %s is not writable here (%v): real cgroups NOT tested", root, err)
		default:
			rm()
			t.Fatalf("creating cgroup %s: %v", dir, err)
		}
	}
	own = made[len(made)-len(own):]
	t.Cleanup(func() {
		// Back to the root: a live process keeps its cgroup busy.
		if err := os.WriteFile(filepath.Join(root, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Errorf("moving pid %d back to the root cgroup: %v", pid, err)
		}
		rm()
	})
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		t.Fatalf("moving pid %d into %s: %v", pid, dir, err)
	}
	return "/" + filepath.Join(levels...)
}

// remove removes the cgroup dir. A shared level that another test's
// cgroup still uses stays (EBUSY); one of ours may stay busy for the
// moment the kernel takes to free an exited process's membership, which
// is retried for a second.
func remove(t testing.TB, dir string, ours bool) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for {
		err := os.Remove(dir)
		switch {
		case err == nil || errors.Is(err, fs.ErrNotExist):
			return
		case errors.Is(err, syscall.EBUSY) && time.Now().Before(deadline):
			time.Sleep(10 * time.Millisecond)
		case errors.Is(err, syscall.EBUSY) && !ours:
			return
		default:
			t.Errorf("removing cgroup %s: %v", dir, err)
			return
		}
	}
}

package workload

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// cgroup2Mount is where this host mounts cgroup v2 (/sys/fs/cgroup on a v2
// host, /sys/fs/cgroup/unified on a hybrid one), from /proc/self/mountinfo
// (proc(5): the fifth field is the mount point, the fstype follows " - ").
func cgroup2Mount(t *testing.T) string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Skipf("no /proc/self/mountinfo (%v): cgroups NOT tested", err)
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
	t.Skip("no cgroup2 mount on this host: cgroups NOT tested")
	return ""
}

func randomHex(t *testing.T, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// TestReadRealCgroup creates cgroups shaped as the kubelet and containerd
// name them, under both cgroup drivers, moves a real process into each and
// reads its workload back from /proc.
func TestReadRealCgroup(t *testing.T) {
	root := cgroup2Mount(t)
	h := randomHex(t, 16)
	uid := fmt.Sprintf("%s-%s-%s-%s-%s", h[:8], h[8:12], h[12:16], h[16:20], h[20:])
	cid := randomHex(t, 32)
	esc := strings.ReplaceAll(uid, "-", "_")
	for _, c := range []struct {
		driver string
		// shared are the levels other pods share; pod the pod's own.
		shared []string
		pod    []string
		want   Workload
	}{
		{"systemd", []string{"kubepods.slice", "kubepods-besteffort.slice"},
			[]string{"kubepods-besteffort-pod" + esc + ".slice", "cri-containerd-" + cid + ".scope"},
			Workload{Slice: "kubepods-besteffort-pod" + esc + ".slice", Unit: "cri-containerd-" + cid + ".scope",
				ContainerID: cid, Runtime: Containerd, PodUID: uid, QoS: BestEffort}},
		{"cgroupfs", []string{"kubepods", "burstable"}, []string{"pod" + uid, cid},
			Workload{ContainerID: cid, PodUID: uid, QoS: Burstable}},
	} {
		t.Run(c.driver, func(t *testing.T) {
			rel := "/" + filepath.Join(append(append([]string{}, c.shared...), c.pod...)...)
			dirs := makeCgroups(t, root, c.shared, c.pod)
			cmd := exec.Command("sleep", "60")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				removeCgroups(t, dirs)
			}()
			pid := strconv.Itoa(cmd.Process.Pid)
			if err := os.WriteFile(filepath.Join(root, rel, "cgroup.procs"), []byte(pid), 0); err != nil {
				t.Fatalf("moving pid %s into %s: %v", pid, rel, err)
			}
			got, err := Read("", uint32(cmd.Process.Pid))
			if err != nil {
				t.Fatal(err)
			}
			c.want.Path = rel
			if got != c.want {
				t.Errorf("Read(%s)\n got %+v\nwant %+v", pid, got, c.want)
			}
		})
	}
	if _, err := Read("", 0); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Read of pid 0: %v, want fs.ErrNotExist", err)
	}
}

// makeCgroups creates root/shared.../pod..., skipping the test when this
// host does not let it (not root, a read-only cgroup2); it returns the
// directories to remove, innermost first: every pod level, and the shared
// levels it created.
func makeCgroups(t *testing.T, root string, shared, pod []string) []string {
	t.Helper()
	var made []string
	dir := root
	for i, name := range append(append([]string{}, shared...), pod...) {
		dir = filepath.Join(dir, name)
		err := os.Mkdir(dir, 0o755)
		switch {
		case err == nil:
			made = append(made, dir)
		case errors.Is(err, fs.ErrExist) && i < len(shared):
		case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EROFS):
			removeCgroups(t, reverse(made))
			t.Skipf("cgroup v2 at %s is not writable here (%v): real cgroups NOT tested", root, err)
		default:
			removeCgroups(t, reverse(made))
			t.Fatal(err)
		}
	}
	return reverse(made)
}

// removeCgroups removes dirs in order; a shared level another test's pod
// still uses stays (EBUSY), and so does a dying process's cgroup for the
// moment the kernel takes to free it, which is retried for a second.
func removeCgroups(t *testing.T, dirs []string) {
	t.Helper()
	for i, d := range dirs {
		deadline := time.Now().Add(time.Second)
		for {
			err := os.Remove(d)
			if err == nil || errors.Is(err, fs.ErrNotExist) {
				break
			}
			if errors.Is(err, syscall.EBUSY) && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			if i == 0 || !errors.Is(err, syscall.EBUSY) {
				t.Errorf("removing cgroup %s: %v", d, err)
			}
			break
		}
	}
}

func reverse(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[len(s)-1-i] = v
	}
	return out
}

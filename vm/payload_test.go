package vm

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
)

// sparse creates a sparse file of size bytes in dir: the initramfs holds
// it whole.
func sparse(t *testing.T, dir string, size int64) string {
	t.Helper()
	p := filepath.Join(dir, "big")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

// A --files payload of 508 MB does not fit a guest of 1 GiB (it booted
// without its kernel modules: "Cannot find device dummy0"): Run refuses it
// before anything starts, with the payload's size, the guest's memory and
// the headroom. Before, it went on to boot (here: to the accelerator, which
// fails the run with ErrCannotRun instead).
func TestRunPayloadTooBig(t *testing.T) {
	t.Setenv("RXE_MEM", "")
	dir := t.TempDir()
	big := sparse(t, dir, 508e6)
	var out bytes.Buffer
	cache := filepath.Join(t.TempDir(), "cache")
	o := Options{Cache: cache, Stdout: &out, Accel: AccelKVM, KVMDevice: filepath.Join(dir, "no-kvm")}
	err := Run(context.Background(), o, RunSpec{Command: []string{"true"}, Files: []string{big}, Dir: dir})
	re := regexp.MustCompile(`^bad vm arguments: the payload is (\d+) MiB \(the command and --files 485 MiB, the guest's own (\d+) MiB: busybox, rdma-core, libraries, modules[a-z, ]*\) ` +
		`and the guest has 1024 MiB \(RXE_MEM\): it needs 3 × (\d+) MiB \+ 128 MiB headroom = (\d+) MiB, since the kernel unpacks the payload into a tmpfs of half its memory \(docs/VM.md\); set RXE_MEM=(\d+) or pass fewer files$`)
	m := re.FindStringSubmatch(fmtErr(err))
	if !errors.Is(err, ErrBadArgs) || m == nil {
		t.Fatalf("Run(508 MB of --files) = %v, want ErrBadArgs matching %s", err, re)
	}
	total, own, need, fits := atoi(t, m[1]), atoi(t, m[2]), atoi(t, m[4]), atoi(t, m[5])
	if d := total - (485 + own); d < -1 || d > 0 || m[3] != m[1] || need < 3*total+128-2 || need > 3*total+128 {
		t.Errorf("sizes do not add up: %v", m[1:])
	}
	// The RXE_MEM suggested holds it; one MiB less does not.
	if checkPayload([]string{big}, false, []string{"RXE_MEM=" + strconv.Itoa(fits)}) != nil ||
		checkPayload([]string{big}, false, []string{"RXE_MEM=" + strconv.Itoa(fits-2)}) == nil {
		t.Errorf("RXE_MEM=%d is not the least that holds it", fits)
	}
	if out.Len() != 0 {
		t.Errorf("a refused payload printed %q: nothing should have started", out.String())
	}
	if _, err := os.Stat(cache); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused payload created the cache (%v)", err)
	}
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// RXE_SMP is a count of vCPUs from 1 to 255, from Options.Env before the
// environment, as run-vm.sh checks it.
func TestCheckGuestCPUs(t *testing.T) {
	t.Setenv("RXE_SMP", "")
	for _, smp := range []string{"", "1", "2", "255"} {
		if err := checkGuestCPUs([]string{"RXE_SMP=" + smp}); err != nil {
			t.Errorf("RXE_SMP=%q: %v", smp, err)
		}
	}
	for _, smp := range []string{"0", "-1", "256", "two", "1.5"} {
		if err := checkGuestCPUs([]string{"RXE_SMP=" + smp}); !errors.Is(err, ErrBadArgs) {
			t.Errorf("RXE_SMP=%s: %v, want ErrBadArgs", smp, err)
		}
	}
	t.Setenv("RXE_SMP", "0")
	if err := checkGuestCPUs(nil); !errors.Is(err, ErrBadArgs) {
		t.Errorf("RXE_SMP=0 in the environment: %v, want ErrBadArgs", err)
	}
	if err := checkGuestCPUs([]string{"RXE_SMP=1"}); err != nil {
		t.Errorf("RXE_SMP=1 in Options.Env over 0 in the environment: %v", err)
	}
}

// RXE_MEM decides, from Options.Env before the environment; it is checked
// as run-vm.sh checks it. A directory counts its files once, links
// followed and loops cut.
func TestCheckPayload(t *testing.T) {
	t.Setenv("RXE_MEM", "4096")
	dir := t.TempDir()
	big := sparse(t, dir, 508e6)
	if err := checkPayload([]string{big}, false, nil); err != nil {
		t.Errorf("508 MB in 4096 MiB: %v", err)
	}
	if err := checkPayload([]string{big}, false, []string{"RXE_MEM=4096", "RXE_MEM=1024"}); !errors.Is(err, ErrBadArgs) {
		t.Errorf("508 MB in 1024 MiB (Options.Env): %v, want ErrBadArgs", err)
	}
	for _, mem := range []string{"100", "1k", "-1"} {
		if err := checkPayload(nil, false, []string{"RXE_MEM=" + mem}); !errors.Is(err, ErrBadArgs) {
			t.Errorf("RXE_MEM=%s: %v, want ErrBadArgs", mem, err)
		}
	}
	tree := filepath.Join(dir, "tree")
	if err := os.MkdirAll(filepath.Join(tree, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "sub", "f"), make([]byte, 1000), 0o644); err != nil {
		t.Fatal(err)
	}
	for link, to := range map[string]string{"loop": tree, "big": big, "gone": filepath.Join(dir, "nothing")} {
		if err := os.Symlink(to, filepath.Join(tree, "sub", link)); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := treeSize([]string{tree, filepath.Join(tree, "sub")}), int64(1000+508e6); got != want {
		t.Errorf("treeSize = %d, want %d", got, want)
	}
}

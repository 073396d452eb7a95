package vm

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// vmOptions returns the options of a test that boots VMs, or skips it unless
// QPDRAIN_VM_TEST=1 (make test-rxe sets it, with QPDRAIN_VM_CACHE pointing
// at the stage's cache). One kernel, the first of RXE_KERNELS (default 6.12):
// these tests check qpdrain vm's verdicts, not the kernels.
func vmOptions(t *testing.T, timeout time.Duration) (Options, *syncBuffer) {
	t.Helper()
	if os.Getenv("QPDRAIN_VM_TEST") != "1" {
		t.Skip("boots qemu: set QPDRAIN_VM_TEST=1 (make test-rxe does)")
	}
	ks, err := ParseKernels(os.Getenv("RXE_KERNELS"))
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("RXE_KERNELS") == "" {
		ks = ks[len(ks)-1:]
	}
	accel, err := ParseAccel(envOr("QPDRAIN_VM_ACCEL", "auto"))
	if err != nil {
		t.Fatal(err)
	}
	out := &syncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("output:\n%s", out.String())
		}
	})
	return Options{Kernels: ks[:1], Accel: accel, Timeout: timeout, Stdout: out}, out
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// wantOutput fails t for each want missing from out.
func wantOutput(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q", w)
		}
	}
}

func runCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestVMRunPasses: rxe0 is up, its GID index is in the environment, the
// command's output comes out, and exit 0 is a PASS.
func TestVMRunPasses(t *testing.T) {
	o, out := vmOptions(t, 0)
	err := Run(runCtx(t), o, RunSpec{Command: []string{"sh", "-c",
		`ibv_devinfo -d rxe0 | grep -q PORT_ACTIVE && echo "gid index=$QPDRAIN_TEST_GID_INDEX device=$QPDRAIN_TEST_DEVICE"`}})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	wantOutput(t, out.String(), "qpdrain vm: qemu ", "device=rxe0", "vm PASS [", "command exit 0", "first test ", "vm: 1 passed, 0 failed")
	if strings.Contains(out.String(), "gid index= ") {
		t.Error("QPDRAIN_TEST_GID_INDEX is empty in the guest")
	}
}

// TestVMRunFails: a non-zero exit is a FAIL that names the status.
func TestVMRunFails(t *testing.T) {
	o, out := vmOptions(t, 0)
	err := Run(runCtx(t), o, RunSpec{Command: []string{"sh", "-c", "echo about to fail; exit 7"}})
	if !errors.Is(err, ErrFailed) {
		t.Fatalf("Run = %v, want ErrFailed", err)
	}
	wantOutput(t, out.String(), "about to fail", "the command exited with status 7", "vm FAIL [", "vm: 0 passed, 1 failed")
}

// TestVMRunPanic: a guest kernel panic (sysrq c) is a FAIL, with the kernel's
// complaint shown.
func TestVMRunPanic(t *testing.T) {
	o, out := vmOptions(t, 0)
	err := Run(runCtx(t), o, RunSpec{Command: []string{"sh", "-c", "echo c >/proc/sysrq-trigger; sleep 30"}})
	if !errors.Is(err, ErrFailed) {
		t.Fatalf("Run = %v, want ErrFailed", err)
	}
	wantOutput(t, out.String(), "the guest kernel panicked (last stage: tests, in run)", "sysrq", "vm: 0 passed, 1 failed")
}

// TestVMRunHang: a command that never ends is killed at the deadline, and
// the verdict names the stage it hung in.
func TestVMRunHang(t *testing.T) {
	o, out := vmOptions(t, 30*time.Second)
	start := time.Now()
	err := Run(runCtx(t), o, RunSpec{Command: []string{"sleep", "3600"}})
	if !errors.Is(err, ErrFailed) {
		t.Fatalf("Run = %v, want ErrFailed", err)
	}
	wantOutput(t, out.String(), "TIMEOUT: the guest did not power off within 30s (last stage: tests, in run)")
	if d := time.Since(start); d > 5*time.Minute {
		t.Errorf("the hang took %v to be called", d)
	}
}

// TestVMMissingLibrary: a program whose library ldd cannot find fails before
// any boot, naming the library.
func TestVMMissingLibrary(t *testing.T) {
	o, out := vmOptions(t, 0)
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("lib.c", "int qpdrain_gone(void) { return 0; }\n")
	write("main.c", "int qpdrain_gone(void);\nint main(void) { return qpdrain_gone(); }\n")
	for _, args := range [][]string{
		{"-shared", "-fPIC", "-o", "libqpdrain-gone.so", "lib.c"},
		{"-o", "prog", "main.c", "-L.", "-lqpdrain-gone"},
	} {
		cmd := exec.Command("gcc", args...)
		cmd.Dir = dir
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("gcc %v: %v\n%s", args, err, b)
		}
	}
	if err := os.Remove(filepath.Join(dir, "libqpdrain-gone.so")); err != nil {
		t.Fatal(err)
	}
	err := Run(runCtx(t), o, RunSpec{Command: []string{"./prog"}, Dir: dir})
	if !errors.Is(err, ErrFailed) {
		t.Fatalf("Run = %v, want ErrFailed", err)
	}
	wantOutput(t, out.String(), "libqpdrain-gone.so", "missing library")
	if strings.Contains(out.String(), "== boot") {
		t.Error("a VM was booted for a payload that cannot be built")
	}
}

// TestVMGoTestOtherModule: go-test works for a module that is not qpdrain's:
// the package runs in a copy of its directory (testdata/ found) with rxe0 up,
// and a failing test fails the run with the closing counts (a package without
// tests is left out of ./... silently).
func TestVMGoTestOtherModule(t *testing.T) {
	o, out := vmOptions(t, 0)
	dir := t.TempDir()
	files := map[string]string{
		"go.mod":             "module example.com/peer\n\ngo 1.22\n",
		"peer/testdata/want": "rxe0\n",
		"peer/peer.go":       "// Package peer is a module that is not qpdrain.\npackage peer\n",
		"nothing/nothing.go": "// Package nothing has no tests.\npackage nothing\n",
		"peer/peer_test.go": `package peer

import (
	"os"
	"strings"
	"testing"
)

func TestRXE(t *testing.T) {
	want, err := os.ReadFile("testdata/want")
	if err != nil {
		t.Fatal(err)
	}
	dev := strings.TrimSpace(string(want))
	if _, err := os.Stat("/sys/class/infiniband/" + dev); err != nil {
		t.Fatal(err)
	}
	if os.Getenv("QPDRAIN_TEST_DEVICE") != dev || os.Getenv("QPDRAIN_TEST_GID_INDEX") == "" {
		t.Fatalf("environment: device %q, gid index %q", os.Getenv("QPDRAIN_TEST_DEVICE"), os.Getenv("QPDRAIN_TEST_GID_INDEX"))
	}
}

func TestRed(t *testing.T) { t.Fatal("red on purpose") }
`,
	}
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	err := GoTest(runCtx(t), o, dir, []string{"./..."}, []string{"-test.count=1"})
	if !errors.Is(err, ErrFailed) {
		t.Fatalf("GoTest = %v, want ErrFailed (TestRed)", err)
	}
	wantOutput(t, out.String(), "--- PASS: TestRXE", "--- FAIL: TestRed", "red on purpose",
		"peer: go test failed (exit 1)", "packages 0/1", "vm: 1 passed, 1 failed")
}

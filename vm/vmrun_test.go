//go:build linux

package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/internal/testing/syncbuf"
)

// vmOptions returns the options of a test that boots VMs, or skips it unless
// QPDRAIN_VM_TEST=1 (make test-rxe sets it, with QPDRAIN_VM_CACHE pointing
// at the stage's cache). One kernel, the first of RXE_KERNELS (default 6.12):
// these tests check qpdrain vm's verdicts, not the kernels.
func vmOptions(t *testing.T, timeout time.Duration) (Options, *syncbuf.Buffer) {
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
	out := &syncbuf.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("output:\n%s", out.String())
		}
	})
	return Options{Kernels: ks[:1], Accel: accel, Timeout: timeout, Stdout: out}, out
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
// complaint shown and the functions of its call trace (a caller matches the
// code at fault in them: scripts/rxe-test.sh, again_on_siw_bug).
func TestVMRunPanic(t *testing.T) {
	o, out := vmOptions(t, 0)
	err := Run(runCtx(t), o, RunSpec{Command: []string{"sh", "-c", "echo c >/proc/sysrq-trigger; sleep 30"}})
	if !errors.Is(err, ErrFailed) {
		t.Fatalf("Run = %v, want ErrFailed", err)
	}
	wantOutput(t, out.String(), "the guest kernel panicked (last stage: tests, in run on rxe0)", "sysrq",
		"call trace: ", "write_sysrq_trigger+0x", "vm: 0 passed, 1 failed")
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
	wantOutput(t, out.String(), "TIMEOUT: the guest did not power off within 30s (last stage: tests, in run on rxe0)")
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
		"peer: go test failed (exit 1): TestRed", "packages 0/1", "vm: 1 passed, 1 failed")
}

// fakeQEMU puts first in PATH testdata/qemu-system-x86_64, a qemu that
// fails under KVM the way mode (FAKE_QEMU_KVM) says and runs the real one
// otherwise. The copy lives in a fresh directory: its path is the cache
// record's key, and it is gone after the test.
func fakeQEMU(t *testing.T, mode string) {
	t.Helper()
	if _, err := exec.LookPath(qemuBin); err != nil {
		t.Skipf("no %s: %v", qemuBin, err)
	}
	b, err := os.ReadFile(filepath.Join("testdata", qemuBin))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, qemuBin), b, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("FAKE_QEMU_KVM", mode)
}

// TestVMKVMFallback: under --accel auto, a qemu that fails under KVM before
// the guest starts, whatever it prints, makes the run say why in one line
// and pass under TCG, and the cache remembers it for that qemu only: an
// abort with status 134 (qemu's "failed to set MSR" assertion, met on
// nested-virtualization hosts), a vCPU paused after "KVM internal error",
// and a silent hang (RXE_KVM_START_TIMEOUT cut to 5 s).
func TestVMKVMFallback(t *testing.T) {
	o, _ := vmOptions(t, 0)
	if o.Accel != AccelAuto {
		t.Skipf("QPDRAIN_VM_ACCEL=%s: the fallback is --accel auto's", o.Accel)
	}
	if a, why, _ := AccelAuto.Resolve(envOr("QPDRAIN_VM_KVM_DEVICE", "/dev/kvm")); a != AccelKVM {
		t.Skipf("auto picks TCG here without trying KVM (%s): no KVM failure to fall back from", why)
	}
	cache, err := DefaultCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	before := kvmBroken(cache, kvmKey())
	for _, tc := range []struct{ mode, said string }{
		{"abort", "qemu exited with status 134 before the guest started; qemu said: qemu-system-x86_64: error: failed to set MSR 0x10a to 0x69 "},
		{"internal-error", "qemu paused the guest's vCPU; qemu was killed; qemu said: KVM internal error. Suberror: 1 emulation failure"},
		{"hang", "no line from the guest's /init within 5s; qemu was killed; qemu said: nothing"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			o, out := vmOptions(t, 0)
			fakeQEMU(t, tc.mode)
			o.Env = []string{"RXE_KVM_START_TIMEOUT=5"}
			start := time.Now()
			if err := Run(runCtx(t), o, RunSpec{Command: []string{"/bin/true"}}); err != nil {
				t.Fatalf("Run: %v", err)
			}
			wantOutput(t, out.String(), "qpdrain vm: qemu KVM (", "KVM failed before the guest started: "+tc.said,
				"; running it under TCG", "(qemu TCG, ", "vm: TCG started the guest", "vm PASS [", "vm: 1 passed, 0 failed")
			for _, l := range strings.Split(out.String(), "\n") {
				if strings.Contains(l, "KVM failed before") {
					t.Logf("%s (run %.1fs)", l, time.Since(start).Seconds())
				}
			}
			if got := kvmBroken(cache, kvmKey()); !strings.Contains(got, tc.said[strings.Index(tc.said, "qemu said: "):]) {
				t.Errorf("the cache's record for the fake qemu: %q", got)
			}
		})
	}
	// The record of the qemu in PATH is its own: the fakes' failures are not it.
	if got := kvmBroken(cache, kvmKey()); got != before {
		t.Errorf("the record of the qemu in PATH changed from %q to %q", before, got)
	}
}

// TestVMBootCrashRetried: under TCG, a guest kernel that crashes before
// its /init, before anything under test ran, is booted once more, saying
// so with the kernel's first complaint, and the run passes.
func TestVMBootCrashRetried(t *testing.T) {
	o, out := vmOptions(t, 0)
	o.Accel = AccelTCG
	fakeQEMU(t, "")
	t.Setenv("FAKE_QEMU_TCG", "crash-once")
	t.Setenv("FAKE_QEMU_STATE", t.TempDir())
	if err := Run(runCtx(t), o, RunSpec{Command: []string{"/bin/true"}}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	wantOutput(t, out.String(), "the guest kernel crashed before its /init (Oops: int3: 0000 [#1] PREEMPT SMP NOPTI): booting it once more",
		"vm PASS [", "vm: 1 passed, 0 failed")
}

// TestVMRunTmpFiles: a script under /tmp (a fresh mktemp -d) passed with
// --files is in the guest at the same path and runs there.
func TestVMRunTmpFiles(t *testing.T) {
	o, out := vmOptions(t, 0)
	dir, err := os.MkdirTemp("/tmp", "qpdrain-vm-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	script := filepath.Join(dir, "guest.sh")
	if err := os.WriteFile(script, []byte("echo \"guest script $0 ran in $(pwd)\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Run(runCtx(t), o, RunSpec{Command: []string{"sh", script}, Files: []string{dir}, Dir: dir}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	wantOutput(t, out.String(), "guest script "+script+" ran in "+dir, "vm: 1 passed, 0 failed")
}

// TestVMStopKillsQEMU: Ctrl-C (SIGINT to the foreground process group) or
// SIGTERM ends `qpdrain vm run` as every command ends on a signal (exit
// 130, "qpdrain: interrupted"), and nothing it
// started, qemu first, outlives it (so the cache lock, which only qpdrain
// holds, is free too). SIGKILL gives qpdrain no say: the VM's heartbeat
// sees it gone and stops the VM within seconds.
func TestVMStopKillsQEMU(t *testing.T) {
	o, _ := vmOptions(t, 0)
	bin := qpdrainBinary(t)
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			mark := fmt.Sprintf("QPDRAIN_VM_STOP_TEST=%d-%d-%d", os.Getpid(), sig, time.Now().UnixNano())
			out := &syncbuf.Buffer{}
			cmd := exec.Command(bin, "vm", "run", "--kernels", o.Kernels[0].Name, "--accel", string(o.Accel), "--", "sleep", "3600")
			cmd.Env = append(os.Environ(), mark)
			cmd.Stdout, cmd.Stderr = out, out
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a job of its own, as a shell starts it
			// An orphaned qemu holds the output pipe open: Wait must not wait for it.
			cmd.WaitDelay = 5 * time.Second
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			t.Cleanup(func() {
				for _, p := range marked(mark) {
					syscall.Kill(p.pid, syscall.SIGKILL)
				}
				if t.Failed() {
					t.Logf("output:\n%s", out.String())
				}
			})
			ctx := runCtx(t) // the wait for the cache lock is in it
			for !hasQEMU(marked(mark)) {
				select {
				case err := <-done:
					t.Fatalf("qpdrain vm run ended (%v) before qemu started", err)
				case <-ctx.Done():
					syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
					<-done
					t.Fatal("qemu did not start")
				case <-time.After(200 * time.Millisecond):
				}
			}
			time.Sleep(time.Second)
			if sig == syscall.SIGINT {
				syscall.Kill(-cmd.Process.Pid, sig)
			} else {
				cmd.Process.Signal(sig)
			}
			select {
			case err := <-done:
				var ee *exec.ExitError
				if sig != syscall.SIGKILL && (!errors.As(err, &ee) || ee.ExitCode() != 130) {
					t.Errorf("exit: %v, want status 130", err)
				}
			case <-time.After(time.Minute):
				syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				for _, p := range marked(mark) {
					syscall.Kill(p.pid, syscall.SIGKILL)
				}
				<-done
				t.Fatalf("qpdrain vm run did not end within a minute of %v", sig)
			}
			if sig != syscall.SIGKILL {
				wantOutput(t, out.String(), "qpdrain: interrupted")
			}
			// qpdrain waited for its driver; the rest of the group gets a moment to exit.
			var left []proc
			for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
				if left = marked(mark); len(left) == 0 {
					break
				}
			}
			if len(left) > 0 {
				t.Errorf("left running after %v: %v", sig, left)
			}
		})
	}
}

// proc is a process of the host.
type proc struct {
	pid  int
	comm string
}

// marked returns the processes whose environment holds mark (KEY=VALUE).
func marked(mark string) []proc {
	var ps []proc
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !bytes.Contains(append(env, 0), []byte(mark+"\x00")) {
			continue
		}
		ps = append(ps, proc{pid, readLine(filepath.Join("/proc", e.Name(), "comm"))})
	}
	return ps
}

func hasQEMU(ps []proc) bool {
	for _, p := range ps {
		if strings.HasPrefix(p.comm, "qemu-system") {
			return true
		}
	}
	return false
}

// qpdrainBinary returns $QPDRAIN_VM_BIN (scripts/rxe-test.sh's build), or
// builds cmd/qpdrain.
func qpdrainBinary(t *testing.T) string {
	if b := os.Getenv("QPDRAIN_VM_BIN"); b != "" {
		return b
	}
	bin := filepath.Join(t.TempDir(), "qpdrain")
	if b, err := exec.Command("go", "build", "-o", bin, "github.com/qpdrain/qpdrain/cmd/qpdrain").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return bin
}

// siwCommand checks, in the guest, what a siw run promises a program.
const siwCommand = `test "$QPDRAIN_TEST_DEVICE" = siw0 && test -z "${QPDRAIN_TEST_GID_INDEX+set}" &&
grep -q ACTIVE /sys/class/infiniband/siw0/ports/1/state &&
ibv_devinfo -d siw0 | grep -q 'transport:[[:space:]]*iWARP' && echo "siw0 is iWARP at $QPDRAIN_TEST_ADDR"`

// TestVMSIW: with the siw provider, siw0 is up, ACTIVE and iWARP on every
// kernel of the matrix ($RXE_KERNELS, else the default kernels), siw.ko
// built for each, and the program gets siw0's device and address and no
// GID index.
func TestVMSIW(t *testing.T) {
	o, out := vmOptions(t, 0)
	ks, err := ParseKernels(os.Getenv("RXE_KERNELS"))
	if err != nil {
		t.Fatal(err)
	}
	o.Kernels, o.Providers = ks, []Provider{ProviderSIW}
	if err := Run(runCtx(t), o, RunSpec{Command: []string{"sh", "-c", siwCommand}}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	wantOutput(t, out.String(), "providers siw;", "siw0 is iWARP at 10.11.13.13", fmt.Sprintf("vm: %d passed, 0 failed", len(ks)))
	passed := 0
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(l, "vm PASS [") && strings.Contains(l, "] siw0: smoke 2/2, command exit 0;") {
			passed++
		}
	}
	// each kernel's line, then again in the summary
	if passed != 2*len(ks) {
		t.Errorf("%d verdict lines say siw0 passed its smoke tests and the command, want %d", passed, 2*len(ks))
	}
}

// TestVMSIWCannotBuild: a kernel whose siw.ko cannot be built fails with one
// line in the words of what failed, and rxe0 still runs on it. Without
// network (an unreachable mirror) and no packages cached: apt's words; with
// the packages cached (no network needed) and a build that breaks
// (RXE_SIW_MAKE_ARGS): the compiler's. Each runs on a copy of the cache
// (hard links) without siw.ko.
func TestVMSIWCannotBuild(t *testing.T) {
	o, _ := vmOptions(t, 0)
	k := o.Kernels[0]
	cache, err := DefaultCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	// the kernel, siw.ko and its packages in the cache
	ver := readLine(filepath.Join(cache, "kernels", k.Suite+".ref"))
	if ver == "" || !complete(filepath.Join(cache, "kernels", ver, "siw")) {
		o, _ := vmOptions(t, 0)
		o.Providers = []Provider{ProviderSIW}
		if err := Run(runCtx(t), o, RunSpec{Command: []string{"/bin/true"}}); err != nil {
			t.Fatalf("building siw.ko in %s: %v", cache, err)
		}
		ver = readLine(filepath.Join(cache, "kernels", k.Suite+".ref"))
	}
	for _, tc := range []struct {
		name  string
		debs  bool
		env   []string
		words string
	}{
		{"no network", false, nil, "apt-get update failed (no network?): E: Failed to fetch http://127.0.0.1:9/debian/"},
		{"compiler", true, []string{"RXE_SIW_MAKE_ARGS=KCFLAGS=-include/nonexistent/qpdrain-break.h"},
			"make failed: <command-line>: fatal error: /nonexistent/qpdrain-break.h: No such file or directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, out := vmOptions(t, 0)
			o.Cache = t.TempDir()
			o.Providers = []Provider{ProviderRXE, ProviderSIW}
			o.Env = append([]string{"RXE_APT_MIRROR=http://127.0.0.1:9/debian"}, tc.env...)
			copies := [][2]string{{filepath.Join(cache, "kernels", ver), filepath.Join(o.Cache, "kernels")}}
			if tc.debs {
				copies = append(copies, [2]string{filepath.Join(cache, "debs"), o.Cache})
			}
			for _, c := range copies {
				if err := os.MkdirAll(c[1], 0o755); err != nil {
					t.Fatal(err)
				}
				if b, err := exec.Command("cp", "-al", c[0], c[1]).CombinedOutput(); err != nil {
					t.Fatalf("cp -al %s %s: %v\n%s", c[0], c[1], err, b)
				}
			}
			kd := filepath.Join(o.Cache, "kernels", ver)
			if err := os.RemoveAll(filepath.Join(kd, "siw")); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(o.Cache, "kernels", k.Suite+".ref"), []byte(ver+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			err := Run(runCtx(t), o, RunSpec{Command: []string{"/bin/true"}})
			if !errors.Is(err, ErrFailed) {
				t.Fatalf("Run = %v, want ErrFailed", err)
			}
			wantOutput(t, out.String(), "siw.ko for "+ver+" could not be built: "+tc.words,
				"siw0 left out, the other providers run", "rxe0: smoke 3/3, command exit 0; siw0: not built;", "vm: 0 passed, 1 failed")
		})
	}
}

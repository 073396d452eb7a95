package vm

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/internal/testing/syncbuf"
	"github.com/qpdrain/qpdrain/internal/testing/testmain"
)

// TestMain fails the run if a test leaks a goroutine.
func TestMain(m *testing.M) { testmain.Run(m) }

func TestParseKernels(t *testing.T) {
	names := func(ks []Kernel) []string {
		var n []string
		for _, k := range ks {
			n = append(n, k.Name)
		}
		return n
	}
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"", []string{"6.1", "6.12", "newest"}},
		{"6.12", []string{"6.12"}},
		{"bookworm bookworm-backports", []string{"6.1", "6.12"}},
		{"6.12,6.1,6.12", []string{"6.12", "6.1"}},
		{"newest,default", []string{"newest", "6.1", "6.12"}},
		{"all", []string{"6.1", "6.12", "newest", "5.10"}},
		{"bullseye", []string{"5.10"}},
		{"5.10,default", []string{"5.10", "6.1", "6.12", "newest"}},
		{"trixie-backports", []string{"newest"}},
	} {
		ks, err := ParseKernels(tc.in)
		if err != nil {
			t.Errorf("ParseKernels(%q): %v", tc.in, err)
			continue
		}
		if got := names(ks); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseKernels(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
	_, err := ParseKernels("6.1,5.4")
	if !errors.Is(err, ErrUnknownKernel) || !strings.Contains(err.Error(), `"5.4"`) {
		t.Errorf("ParseKernels(6.1,5.4) = %v, want ErrUnknownKernel naming 5.4", err)
	}
}

func TestAccel(t *testing.T) {
	if _, err := ParseAccel("hvf"); err == nil {
		t.Error("ParseAccel(hvf) succeeded")
	}
	missing := filepath.Join(t.TempDir(), "kvm")
	a, why, err := AccelAuto.Resolve(missing)
	if err != nil || a != AccelTCG || !strings.Contains(why, "no KVM") {
		t.Errorf("auto without KVM = %q, %q, %v; want tcg and why", a, why, err)
	}
	if _, _, err := AccelKVM.Resolve(missing); !errors.Is(err, ErrKVMUnusable) {
		t.Errorf("kvm without KVM: %v, want ErrKVMUnusable", err)
	}
	// A device node that is not KVM (ioctl fails) is no KVM either.
	if a, _, err := AccelAuto.Resolve("/dev/null"); err != nil || a != AccelTCG {
		t.Errorf("auto with /dev/null = %q, %v; want tcg", a, err)
	}
	if a, _, _ := AccelTCG.Resolve("/dev/kvm"); a != AccelTCG {
		t.Errorf("tcg resolved to %q", a)
	}
}

func TestListCache(t *testing.T) {
	dir := t.TempDir()
	kd := filepath.Join(dir, "kernels")
	mk := func(ver, pkg string, complete bool) {
		d := filepath.Join(kd, ver)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(d, "package"), []byte(pkg+"\n"), 0o644)
		if complete {
			os.WriteFile(filepath.Join(d, ".complete"), nil, 0o644)
		}
	}
	mk("6.1.0-57-amd64", "linux-image-6.1.0-57-amd64 6.1.192-3", true)
	mk("6.1.0-56-amd64", "linux-image-6.1.0-56-amd64 6.1.190-1", true)
	mk("6.12.95+deb12-amd64", "x", false) // an extraction that did not finish
	siw := filepath.Join(kd, "6.1.0-57-amd64", "siw")
	os.MkdirAll(siw, 0o755)
	os.WriteFile(filepath.Join(siw, "package"), []byte("linux-source-6.1 6.1.192-3\n"), 0o644)
	os.WriteFile(filepath.Join(siw, ".complete"), nil, 0o644)
	siwUnfinished := filepath.Join(kd, "6.1.0-56-amd64", "siw")
	os.MkdirAll(siwUnfinished, 0o755)
	os.WriteFile(filepath.Join(siwUnfinished, "package"), []byte("linux-source-6.1 6.1.190-1\n"), 0o644)
	os.WriteFile(filepath.Join(kd, "bookworm.ref"), []byte("6.1.0-57-amd64\n"), 0o644)
	os.WriteFile(filepath.Join(kd, "bookworm-backports.ref"), []byte("6.12.95+deb12-amd64\n"), 0o644)

	got, err := ListCache(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(Kernels)+1 {
		t.Fatalf("ListCache: %d entries, want %d names and 1 unnamed kernel: %+v", len(got), len(Kernels), got)
	}
	if got[0].Name != "6.1" || got[0].Version != "6.1.0-57-amd64" || got[0].Dir == "" ||
		got[0].Package != "linux-image-6.1.0-57-amd64 6.1.192-3" || got[0].SIW != "linux-source-6.1 6.1.192-3" {
		t.Errorf("6.1: %+v", got[0])
	}
	if got[1].Name != "6.12" || got[1].Version != "6.12.95+deb12-amd64" || got[1].Dir != "" {
		t.Errorf("6.12 (pinned, not complete): %+v", got[1])
	}
	if got[2].Name != "newest" || got[2].Version != "" {
		t.Errorf("newest (never resolved): %+v", got[2])
	}
	if u := got[len(Kernels)]; u.Name != "" || u.Version != "6.1.0-56-amd64" || u.SIW != "" {
		t.Errorf("unnamed: %+v", u)
	}
	if ks, err := ListCache(filepath.Join(dir, "none")); err != nil || len(ks) != len(Kernels) {
		t.Errorf("ListCache(missing dir) = %d entries, %v", len(ks), err)
	}
}

// TestShellQuote checks that the guest's `eval "exec $CMD"` gives back the
// words, unexpanded.
func TestShellQuote(t *testing.T) {
	argv := []string{"printf", "%s|", "a b", "it's", "$HOME", "`x`", ""}
	out, err := exec.Command("sh", "-c", "eval \"exec $0\"", shellQuote(argv)).Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := "a b|it's|$HOME|`x`||"; string(out) != want {
		t.Errorf("round trip = %q, want %q", out, want)
	}
}

// TestRunBadArgs: a missing binary or file is an error before any boot.
func TestRunBadArgs(t *testing.T) {
	var out bytes.Buffer
	o := Options{Cache: t.TempDir(), Stdout: &out}
	for _, spec := range []RunSpec{
		{},
		{Command: []string{"/nonexistent/prog"}},
		{Command: []string{"qpdrain-no-such-command"}},
		{Command: []string{"true"}, Files: []string{"/nonexistent/file"}},
		{Command: []string{"/etc/passwd"}},
	} {
		err := Run(context.Background(), o, spec)
		if !errors.Is(err, ErrBadArgs) {
			t.Errorf("Run(%+v) = %v, want ErrBadArgs", spec, err)
		}
	}
	if err := GoTest(context.Background(), o, ".", nil, nil); !errors.Is(err, ErrBadArgs) {
		t.Errorf("GoTest(no packages) = %v, want ErrBadArgs", err)
	}
	if err := GoTest(context.Background(), o, t.TempDir(), []string{"./..."}, nil); !errors.Is(err, ErrBadArgs) ||
		!strings.Contains(err.Error(), "not inside a Go module") {
		t.Errorf("GoTest(outside a module) = %v, want ErrBadArgs", err)
	}
	for _, d := range []time.Duration{-time.Second, time.Millisecond} {
		o := o
		o.Timeout = d
		if err := Run(context.Background(), o, RunSpec{Command: []string{"true"}}); !errors.Is(err, ErrBadArgs) {
			t.Errorf("Run(timeout %v) = %v, want ErrBadArgs", d, err)
		}
	}
	smp := o
	smp.Env = []string{"RXE_SMP=0"}
	if err := Run(context.Background(), smp, RunSpec{Command: []string{"true"}}); !errors.Is(err, ErrBadArgs) ||
		!strings.Contains(err.Error(), "RXE_SMP=0") {
		t.Errorf("Run(RXE_SMP=0) = %v, want ErrBadArgs naming RXE_SMP", err)
	}
	if out.Len() != 0 {
		t.Errorf("bad arguments printed %q: nothing should have started", out.String())
	}
}

func TestLockCache(t *testing.T) {
	dir := t.TempDir()
	var out syncbuf.Buffer
	unlock, err := lockCache(context.Background(), dir, &out)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := lockCache(ctx, dir, &out); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("second lock = %v, want the deadline", err)
	}
	if !strings.Contains(out.String(), "waiting") {
		t.Errorf("the wait was not said: %q", out.String())
	}
	unlock() // the abandoned waiter takes the lock and releases it
	deadline := time.Now().Add(5 * time.Second)
	for {
		u, err := lockCache(ctx, dir, &out)
		if err == nil {
			u()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the lock was never released after the waiter gave up")
		}
		ctx, cancel = context.WithTimeout(context.Background(), time.Second)
		defer cancel()
	}
}

func TestWriteScripts(t *testing.T) {
	dir := t.TempDir()
	a, err := writeScripts(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := writeScripts(dir)
	if err != nil || a != b {
		t.Fatalf("second writeScripts = %q, %v; want %q", b, err, a)
	}
	for _, n := range []string{"vm.sh", "init", "run-vm.sh", "stage.sh", "fetch-kernel.sh"} {
		st, err := os.Stat(filepath.Join(a, n))
		if err != nil || st.Mode()&0o100 == 0 {
			t.Errorf("%s: %v, mode %v", n, err, st)
		}
	}
}

// TestKVMBroken: a recorded KVM failure holds for its key (host kernel,
// qemu binary, qemu version) only; recording replaces the key's old record
// and drops records of qemu binaries that are gone.
func TestKVMBroken(t *testing.T) {
	dir := t.TempDir()
	qemu := filepath.Join(dir, "qemu") // a qemu binary that exists
	if err := os.WriteFile(qemu, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	key := "6.1.0-1 " + qemu + "\tQEMU emulator version 7.2.22"
	otherKernel := "6.12.0-9 " + qemu + "\tQEMU emulator version 7.2.22"
	otherQEMU := "6.1.0-1 " + qemu + "\tQEMU emulator version 8.2.2"
	gone := "6.1.0-1 " + filepath.Join(dir, "gone") + "\tQEMU emulator version 7.2.22"
	if got := kvmBroken(dir, key); got != "" {
		t.Errorf("no record: %q", got)
	}
	for _, r := range []struct{ key, msg string }{
		{gone, "old"}, {otherQEMU, "MSR"}, {key, "first"}, {key, "KVM internal error.\nSuberror: 1"},
	} {
		if err := recordKVMBroken(dir, r.key, r.msg); err != nil {
			t.Fatal(err)
		}
	}
	if got := kvmBroken(dir, key); !strings.HasPrefix(got, "KVM internal error. Suberror: 1; recorded in ") {
		t.Errorf("the key's record: %q", got)
	}
	if got := kvmBroken(dir, otherKernel); got != "" {
		t.Errorf("another host kernel's record: %q", got)
	}
	if got := kvmBroken(dir, otherQEMU); !strings.HasPrefix(got, "MSR; recorded in ") {
		t.Errorf("the other qemu's record: %q", got)
	}
	b, err := os.ReadFile(kvmRecordFile(dir))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n != 2 || strings.Contains(string(b), "gone") {
		t.Errorf("records (want the two live keys, once each):\n%s", b)
	}
	// The key names the qemu of PATH and its version.
	fake := filepath.Join(dir, qemuBin)
	os.WriteFile(fake, []byte("#!/bin/sh\necho 'QEMU emulator version 0.0.1-fake'\necho copyright\n"), 0o755)
	t.Setenv("PATH", dir)
	if want := readLine("/proc/sys/kernel/osrelease") + " " + fake + "\tQEMU emulator version 0.0.1-fake"; kvmKey() != want {
		t.Errorf("kvmKey() = %q, want %q", kvmKey(), want)
	}
	// The previous format (release and message) matches no key: KVM is tried again.
	os.WriteFile(kvmRecordFile(dir), []byte("6.1.0-1 KVM internal error. Suberror: 1\n"), 0o644)
	if got := kvmBroken(dir, key); got != "" {
		t.Errorf("an old-format record: %q", got)
	}
}

func TestParseProviders(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []Provider
	}{
		{"", []Provider{ProviderRXE}},
		{"siw", []Provider{ProviderSIW}},
		{"siw,rxe", []Provider{ProviderRXE, ProviderSIW}},
		{"rxe siw rxe", []Provider{ProviderRXE, ProviderSIW}},
		{"all", []Provider{ProviderRXE, ProviderSIW}},
	} {
		ps, err := ParseProviders(tc.in)
		if err != nil || !reflect.DeepEqual(ps, tc.want) {
			t.Errorf("ParseProviders(%q) = %v, %v; want %v", tc.in, ps, err, tc.want)
		}
	}
	for _, in := range []string{"rxe,ib", "RXE", "siw0"} {
		if _, err := ParseProviders(in); !errors.Is(err, ErrUnknownProvider) {
			t.Errorf("ParseProviders(%q) = %v, want ErrUnknownProvider", in, err)
		}
	}
	if d := ProviderSIW.Device(); d != "siw0" {
		t.Errorf("siw's device = %q", d)
	}
	// Options with a provider no list gives is refused before anything starts.
	var out bytes.Buffer
	o := Options{Cache: t.TempDir(), Stdout: &out, Providers: []Provider{"ib"}}
	if err := Run(context.Background(), o, RunSpec{Command: []string{"true"}}); !errors.Is(err, ErrBadArgs) || !errors.Is(err, ErrUnknownProvider) {
		t.Errorf("Run(provider ib) = %v, want ErrBadArgs and ErrUnknownProvider", err)
	}
	if out.Len() != 0 {
		t.Errorf("a bad provider printed %q", out.String())
	}
}

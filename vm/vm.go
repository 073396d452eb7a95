package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Errors of a run; callers test them with errors.Is.
var (
	// ErrFailed means the run's verdict is FAIL on at least one kernel: a
	// non-zero exit, a test that failed, a guest panic, Oops or BUG, a hang,
	// or a smoke test that failed. The output says which and why.
	ErrFailed = errors.New("the vm run failed")
	// ErrCannotRun means the host cannot run VMs here: packages missing and
	// not root, or no network to fill a cold cache.
	ErrCannotRun = errors.New("the vm run cannot run on this host")
	// ErrBadArgs means the request itself is wrong (an unknown file, a
	// command not found on the host, no packages).
	ErrBadArgs = errors.New("bad vm arguments")
)

// Options configure a run. The zero value is usable except for Stdout.
type Options struct {
	// Kernels is the matrix; empty means DefaultKernels.
	Kernels []Kernel
	// Providers are the providers the guest sets up; the payload runs once
	// per provider, with that provider's device in its environment. Empty
	// means DefaultProviders; a name not in Providers is an error wrapping
	// ErrBadArgs.
	Providers []Provider
	// Cache is the cache directory; empty means DefaultCacheDir.
	Cache string
	// Accel is the accelerator; empty means AccelAuto.
	Accel Accel
	// KVMDevice is the KVM device to probe; empty means
	// $QPDRAIN_VM_KVM_DEVICE, else /dev/kvm (a path that does not exist
	// runs a host without KVM).
	KVMDevice string
	// Timeout is each VM's deadline, after which qemu is killed and the run
	// fails naming the last stage; zero means RXE_TIMEOUT or 480 s. Below a
	// second (negative included) it is an error wrapping ErrBadArgs.
	Timeout time.Duration
	// Stdout receives the run's output as it happens (stdout and stderr of
	// the scripts, interleaved).
	Stdout io.Writer
	// Env is added to the scripts' environment (RXE_ADD_CMD=..., for
	// example) after the process's own.
	Env []string
}

// DefaultCacheDir is where kernels and runs are kept when Options.Cache is
// empty: $QPDRAIN_VM_CACHE, else os.UserCacheDir()/qpdrain/vm
// (~/.cache/qpdrain/vm).
func DefaultCacheDir() (string, error) {
	if d := os.Getenv("QPDRAIN_VM_CACHE"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("finding the cache directory: %w", err)
	}
	return filepath.Join(d, "qpdrain", "vm"), nil
}

// GoTest builds the test binaries of pkgs (directories as go test takes
// them: ./..., ./x) of the Go module holding dir with `go test -c` and runs
// each in the guest with -test.v and testFlags, on every kernel, once per
// provider of o.Providers (the environment names its device, as Run's). The closing
// line counts the tests of all kernels. It returns nil when every kernel
// passed, an error wrapping ErrFailed or ErrCannotRun otherwise, or one
// wrapping ErrBadArgs (before any download or build) for no packages or a
// dir outside any Go module.
func GoTest(ctx context.Context, o Options, dir string, pkgs, testFlags []string) error {
	if len(pkgs) == 0 {
		return fmt.Errorf("%w: no packages to test (try ./...)", ErrBadArgs)
	}
	if err := inModule(dir); err != nil {
		return err
	}
	env := []string{"RXE_MODE=go-test", "RXE_PKGS=" + strings.Join(pkgs, " ")}
	if len(testFlags) > 0 {
		env = append(env, "RXE_TEST_ARGS="+strings.TrimSpace(os.Getenv("RXE_TEST_ARGS")+" "+strings.Join(testFlags, " ")))
	}
	return run(ctx, o, dir, env, "go-test "+strings.Join(pkgs, " "))
}

// inModule checks that dir is inside a Go module (a go.mod in it or above),
// as go test -c needs, so that a wrong directory fails before the kernels are
// downloaded.
func inModule(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadArgs, err)
	}
	for d := abs; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return nil
		}
		if filepath.Dir(d) == d {
			return fmt.Errorf("%w: %s is not inside a Go module (no go.mod in it or above)", ErrBadArgs, abs)
		}
	}
}

// RunSpec is what Run runs in the guest.
type RunSpec struct {
	// Command is the program and its arguments. A program without a slash
	// is looked up in the host's PATH; either way the host's file is copied
	// into the guest at its own path, with every library ldd names.
	Command []string
	// Files are more files or directories to copy in, each at its own
	// absolute path (relative paths are taken from Dir), with the libraries
	// of every ELF file among them.
	Files []string
	// Python brings the host's /usr/bin/python3 and its standard library
	// into the guest; "python3" as the command means that interpreter.
	Python bool
	// Dir is the working directory, on the host for relative paths and in
	// the guest for the command (created there if no file put it there).
	Dir string
}

// pythonBin is the interpreter --python brings: the distribution's, whose
// packages (python3-pyverbs) are built for it.
const pythonBin = "/usr/bin/python3"

// Run runs spec on every kernel, once per provider of o.Providers, with that
// provider's device up and named in its environment (QPDRAIN_TEST_DEVICE,
// QPDRAIN_TEST_ADDR, and rxe0's QPDRAIN_TEST_GID_INDEX). The command's exit
// status, output and the kernel's log are carried out; the closing line
// counts kernels. It returns nil when the command exited 0 on
// every kernel, an error wrapping ErrFailed or ErrCannotRun otherwise, or one
// wrapping ErrBadArgs (before any boot) for a command or file missing on the
// host, or a payload larger than the guest's memory holds (RXE_MEM, from
// Options.Env or the environment; docs/VM.md).
func Run(ctx context.Context, o Options, spec RunSpec) error {
	if len(spec.Command) == 0 {
		return fmt.Errorf("%w: no command to run", ErrBadArgs)
	}
	dir, err := filepath.Abs(spec.Dir)
	if err != nil {
		return fmt.Errorf("%w: working directory: %v", ErrBadArgs, err)
	}
	prog, err := resolveCommand(spec.Command[0], spec.Python, dir)
	if err != nil {
		return err
	}
	var files []string
	if prog != pythonBin || !spec.Python {
		files = append(files, prog)
	}
	for _, f := range spec.Files {
		if !filepath.IsAbs(f) {
			f = filepath.Join(dir, f)
		}
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("%w: --files: %v", ErrBadArgs, err)
		}
		files = append(files, filepath.Clean(f))
	}
	if err := checkPayload(files, spec.Python, o.Env); err != nil {
		return err
	}
	argv := append([]string{prog}, spec.Command[1:]...)
	env := []string{
		"RXE_MODE=run",
		"RXE_CMD=" + shellQuote(argv),
		"RXE_FILES=" + strings.Join(files, "\n"),
		"RXE_CWD=" + dir,
		"RXE_PYTHON=" + boolEnv(spec.Python),
	}
	return run(ctx, o, dir, env, "run "+strings.Join(spec.Command, " "))
}

// resolveCommand finds the host's file for the guest's command.
func resolveCommand(name string, python bool, dir string) (string, error) {
	if python && (name == "python3" || name == "python") {
		return pythonBin, nil
	}
	if !strings.Contains(name, "/") {
		p, err := exec.LookPath(name)
		if err != nil {
			return "", fmt.Errorf("%w: command %q not found on the host: missing binary", ErrBadArgs, name)
		}
		name = p
	}
	if !filepath.IsAbs(name) {
		name = filepath.Join(dir, name)
	}
	st, err := os.Stat(name)
	if err != nil {
		return "", fmt.Errorf("%w: command %s: missing binary: %v", ErrBadArgs, name, err)
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%w: command %s is not an executable file", ErrBadArgs, name)
	}
	return filepath.Clean(name), nil
}

// shellQuote quotes argv for the guest's sh, which evals it back into words.
func shellQuote(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// envOr returns the environment variable k, or def when it is unset or empty.
func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func boolEnv(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// run is the part GoTest and Run share: the first line, the scripts, the
// lock, the driver and its verdict.
func run(ctx context.Context, o Options, dir string, modeEnv []string, what string) error {
	if o.Stdout == nil {
		return fmt.Errorf("%w: no output writer", ErrBadArgs)
	}
	if o.Timeout != 0 && o.Timeout < time.Second {
		return fmt.Errorf("%w: timeout %v: want at least 1s", ErrBadArgs, o.Timeout)
	}
	if err := checkGuestCPUs(o.Env); err != nil {
		return err
	}
	kernels := o.Kernels
	if len(kernels) == 0 {
		kernels = DefaultKernels()
	}
	providers := o.Providers
	if len(providers) == 0 {
		providers = DefaultProviders()
	}
	for _, p := range providers {
		if !known(p) {
			return fmt.Errorf("%w: provider %q: %w", ErrBadArgs, p, ErrUnknownProvider)
		}
	}
	cache := o.Cache
	if cache == "" {
		var err error
		if cache, err = DefaultCacheDir(); err != nil {
			return err
		}
	}
	cache, err := filepath.Abs(cache)
	if err != nil {
		return fmt.Errorf("%w: cache directory: %v", ErrBadArgs, err)
	}
	accel := o.Accel
	if accel == "" {
		accel = AccelAuto
	}
	kvm := o.KVMDevice
	if kvm == "" {
		kvm = envOr("QPDRAIN_VM_KVM_DEVICE", "/dev/kvm")
	}
	auto := accel == AccelAuto
	accel, why, err := accel.Resolve(kvm)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrCannotRun, err)
	}
	if auto && accel == AccelKVM {
		if broken := kvmBroken(cache, kvmKey()); broken != "" {
			accel, why = AccelTCG, "KVM failed to start a guest with this qemu on this host kernel before: "+broken
		}
	}
	var names, suites, provs []string
	for _, k := range kernels {
		names = append(names, k.Name)
		suites = append(suites, k.Name+"="+k.Suite)
	}
	for _, p := range providers {
		provs = append(provs, string(p))
	}
	fmt.Fprintf(o.Stdout, "qpdrain vm: qemu %s (%s); kernels %s; providers %s; cache %s; %s\n",
		strings.ToUpper(string(accel)), why, strings.Join(names, ", "), strings.Join(provs, ", "), cache, what)

	if err := os.MkdirAll(cache, 0o755); err != nil {
		return fmt.Errorf("creating the cache directory: %w", err)
	}
	unlock, err := lockCache(ctx, cache, o.Stdout)
	if err != nil {
		return err
	}
	defer unlock()
	sdir, err := writeScripts(cache)
	if err != nil {
		return err
	}

	env := append(os.Environ(), o.Env...)
	env = append(env, modeEnv...)
	env = append(env,
		"RXE_CACHE="+cache,
		"RXE_SUITES="+strings.Join(suites, " "),
		"RXE_PROVIDERS="+strings.Join(provs, " "),
		"RXE_ACCEL="+string(accel),
		"RXE_ACCEL_AUTO="+boolEnv(auto),
		// what run-vm.sh watches: a qpdrain killed without a word (SIGKILL)
		// takes its VM down with it
		"RXE_OWNER_PID="+strconv.Itoa(os.Getpid()),
	)
	if o.Timeout > 0 {
		env = append(env, "RXE_TIMEOUT="+strconv.Itoa(int(o.Timeout.Round(time.Second)/time.Second)))
	}
	// Only the qpdrain CLI can create rxe0 itself; another program that
	// calls Run (a test binary) gets rdma link add.
	if exe := qpdrainBin(); exe != "" {
		env = append(env, "RXE_QPDRAIN_BIN="+exe)
	}
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(sdir, "vm.sh"))
	cmd.Dir = dir
	cmd.Env = env
	cmd.Stdout = o.Stdout
	cmd.Stderr = o.Stdout
	inProcessGroup(cmd)
	cmd.WaitDelay = 10 * time.Second
	// vm.sh leaves qemu's message in run/kvm-fallback when KVM failed before
	// the guest started and TCG then started it: KVM, not the image, is at
	// fault. An earlier run's file must not be taken for this run's.
	fallback := filepath.Join(cache, "run", "kvm-fallback")
	if err := os.Remove(fallback); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("clearing the last run's KVM fallback: %w", err)
	}
	err = cmd.Run()
	if msg := readLine(fallback); msg != "" {
		if rerr := recordKVMBroken(cache, kvmKey(), msg); rerr != nil {
			fmt.Fprintf(o.Stdout, "qpdrain vm: %v\n", rerr)
		}
	}
	if ctx.Err() != nil {
		return fmt.Errorf("running the vm: %w", ctx.Err())
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ee) && ee.ExitCode() == 3:
		return fmt.Errorf("%w (see the output above)", ErrCannotRun)
	case errors.As(err, &ee) && ee.ExitCode() == 1:
		return ErrFailed
	default:
		return fmt.Errorf("running %s: %w", filepath.Join(sdir, "vm.sh"), err)
	}
}

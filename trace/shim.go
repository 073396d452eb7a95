package trace

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// shimSource is the preloaded shim's C source; BuildShim compiles it with the
// host's C compiler, so no build output is kept in the tree and a Go build
// needs no C toolchain.
//
//go:embed shim/shim.c
var shimSource []byte

// Errors of BuildShim and Run, for errors.Is.
var (
	// ErrNoCompiler: there is no C compiler ($CC, else cc) to build the shim.
	ErrNoCompiler = errors.New("no C compiler to build the trace shim")
	// ErrBuild: the compiler failed (libibverbs-dev's headers missing, usually).
	ErrBuild = errors.New("building the trace shim failed")
	// ErrNotSupported: preloading a shim needs Linux's dynamic loader.
	ErrNotSupported = errors.New("tracing needs Linux (LD_PRELOAD)")
)

// ShimSource returns the shim's C source.
func ShimSource() []byte { return bytes.Clone(shimSource) }

// DefaultCacheDir is where BuildShim keeps built shims when given no
// directory: os.UserCacheDir()/qpdrain/trace.
func DefaultCacheDir() (string, error) {
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("finding the cache directory: %w", err)
	}
	return filepath.Join(d, "qpdrain", "trace"), nil
}

// BuildShim compiles the shim with $CC (else cc) into dir (DefaultCacheDir
// when empty), under a name keyed by the source's hash, and returns the
// shared object's path; a shim built before from the same source is reused.
// Errors wrap ErrNoCompiler, ErrBuild (with the compiler's output) or the
// file system's error.
func BuildShim(ctx context.Context, dir string) (string, error) {
	if dir == "" {
		d, err := DefaultCacheDir()
		if err != nil {
			return "", err
		}
		dir = d
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	ccPath, err := exec.LookPath(cc)
	if err != nil {
		return "", fmt.Errorf("%w: %v (install gcc and libibverbs-dev, or pass a shim built elsewhere with --shim)", ErrNoCompiler, err)
	}
	sum := sha256.Sum256(append([]byte(runtime.GOARCH+"\x00"), shimSource...))
	out := filepath.Join(dir, "qpdrain-trace-"+hex.EncodeToString(sum[:8])+".so")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("trace shim cache: %w", err)
	}
	src := filepath.Join(dir, "shim-"+hex.EncodeToString(sum[:8])+".c")
	if err := os.WriteFile(src, shimSource, 0o644); err != nil {
		return "", fmt.Errorf("trace shim cache: %w", err)
	}
	// The shim's verbs carry libibverbs' version, so that a lookup of
	// ibv_open_device@IBVERBS_1.1 (a program linked with libibverbs, or
	// dlvsym) finds them.
	vers := strings.TrimSuffix(src, ".c") + ".map"
	if err := os.WriteFile(vers, []byte("IBVERBS_1.1 {\n\tglobal: ibv_*;\n};\n"), 0o644); err != nil {
		return "", fmt.Errorf("trace shim cache: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".shim-*.so")
	if err != nil {
		return "", fmt.Errorf("trace shim cache: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	// No -libverbs: the shim finds libibverbs behind it (RTLD_NEXT), so the
	// processes of a traced program that do not use verbs never load it.
	cmd := exec.CommandContext(ctx, ccPath, "-shared", "-fPIC", "-O2", "-Wall", "-Wl,-soname,"+filepath.Base(out), "-Wl,--version-script="+vers, "-o", tmp.Name(), src, "-ldl", "-lpthread")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%w: %s: %v\n%s(are libibverbs-dev's headers installed?)", ErrBuild, cc, err, b)
	}
	// The companion the shim gives a program that dlopen()s libibverbs: no
	// code, the shim then libibverbs as its dependencies (shim.c). It names
	// the shim by its soname, its file's name: the loader matches that with
	// the preloaded shim wherever it lies, and ldd finds it next to it.
	helperTmp := strings.TrimSuffix(tmp.Name(), ".so") + "-dl.so"
	defer os.Remove(helperTmp)
	cmd = exec.CommandContext(ctx, ccPath, "-shared", "-fPIC", "-o", helperTmp, "-x", "c", os.DevNull, "-x", "none", "-Wl,-rpath,$ORIGIN", "-Wl,--no-as-needed", tmp.Name(), "-l:libibverbs.so.1")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%w: %s (the dlopen companion): %v\n%s(is libibverbs1 installed?)", ErrBuild, cc, err, b)
	}
	// Renamed into place, the shim last, so that concurrent builds never
	// load a partial file and a shim found has its companion.
	if err := os.Rename(helperTmp, DLHelper(out)); err != nil {
		return "", fmt.Errorf("trace shim cache: %w", err)
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return "", fmt.Errorf("trace shim cache: %w", err)
	}
	return out, nil
}

// DLHelper is the path of the dlopen companion BuildShim builds next to
// the shim at shim: the object a program that dlopen()s libibverbs gets
// instead, so that the verbs it takes with dlsym are the traced ones. Run
// passes it to the shim when it exists.
func DLHelper(shim string) string { return strings.TrimSuffix(shim, ".so") + "-dl.so" }

// RunSpec is a program to run traced.
type RunSpec struct {
	// Shim is the shared object BuildShim made (or one built elsewhere).
	Shim string
	// Argv is the program and its arguments; a name without a slash is
	// looked up in PATH.
	Argv []string
	// Stdin, Stdout and Stderr are the program's; nil means the null device.
	// Pass the process's own files for a program whose output must not change.
	Stdin, Stdout, Stderr *os.File
	// Records, when set, is the file the records are written to and kept
	// in; otherwise a temporary file is used and removed.
	Records string
	// Each, when set, is given each record as it is read after the program
	// ended (to an Analyzer, say), and Result.Records stays empty.
	Each func(Record)
}

// Result is how a traced program ended and what it did.
type Result struct {
	// Status is how it ended ("exit status 0", "signal: killed").
	Status string
	// ExitCode is its exit status, or -1 when a signal ended it.
	ExitCode int
	// Records are the shim's records of every process of the program
	// (none when RunSpec.Each took them).
	Records []Record
	// Lost counts the records lost: the record file was full, or a
	// process was killed while it wrote one (at least one each).
	Lost int
}

// killAfter is how long a program cancelled by Run's context has between
// SIGTERM and SIGKILL.
const killAfter = 5 * time.Second

// Run runs the program with the shim preloaded (LD_PRELOAD, inherited by its
// children) and returns its records and how it ended; when ctx ends first the program
// gets SIGTERM, and SIGKILL killAfter later. While it runs, SIGTERM
// and SIGHUP sent to this process are passed on to it, and SIGINT is left to
// it (a terminal sends it to both). The program's exit status is its result,
// not Run's error: errors wrap ErrNotSupported, a start failure (the program
// not found), or ErrBadRecord when its records cannot be read.
func Run(ctx context.Context, spec RunSpec) (_ *Result, rerr error) {
	if runtime.GOOS != "linux" {
		return nil, fmt.Errorf("%w, not %s", ErrNotSupported, runtime.GOOS)
	}
	if len(spec.Argv) == 0 {
		return nil, errors.New("trace: no program to run")
	}
	shim, err := filepath.Abs(spec.Shim)
	if err != nil {
		return nil, fmt.Errorf("trace: shim: %w", err)
	}
	if _, err := os.Stat(shim); err != nil {
		return nil, fmt.Errorf("trace: shim: %w", err)
	}
	var keep io.Writer = io.Discard
	if spec.Records != "" {
		kf, err := os.OpenFile(spec.Records, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return nil, fmt.Errorf("trace: records file: %w", err)
		}
		defer kf.Close()
		bw := bufio.NewWriter(kf)
		keep = bw
		defer func() {
			if err := bw.Flush(); err != nil && rerr == nil {
				rerr = fmt.Errorf("trace: records file: %w", err)
			}
		}()
	}
	recf, err := newRecordFile()
	if err != nil {
		return nil, fmt.Errorf("trace: records file: %w", err)
	}
	recPath := recf.Name()
	defer os.Remove(recPath)
	defer recf.Close()

	preload := shim
	if old := os.Getenv("LD_PRELOAD"); old != "" {
		preload += ":" + old
	}
	cmd := exec.Command(spec.Argv[0], spec.Argv[1:]...)
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+preload, "QPDRAIN_TRACE_FILE="+recPath)
	if _, err := os.Stat(DLHelper(shim)); err == nil {
		cmd.Env = append(cmd.Env, "QPDRAIN_TRACE_DLHELPER="+DLHelper(shim))
	}
	if spec.Stdin != nil {
		cmd.Stdin = spec.Stdin
	}
	if spec.Stdout != nil {
		cmd.Stdout = spec.Stdout
	}
	if spec.Stderr != nil {
		cmd.Stderr = spec.Stderr
	}
	// Caught, not ignored: a caught signal is reset to its default in the
	// child at exec, an ignored one would stay ignored there.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGHUP, os.Interrupt)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("trace: starting %s: %w", spec.Argv[0], err)
	}
	done := make(chan struct{})
	fwd := make(chan struct{})
	go func() {
		defer close(fwd)
		for {
			select {
			case s := <-sigs:
				if s != os.Interrupt {
					_ = cmd.Process.Signal(s)
				}
			case <-ctx.Done():
				_ = cmd.Process.Signal(syscall.SIGTERM)
				select {
				case <-done:
				case <-time.After(killAfter):
					_ = cmd.Process.Kill()
				}
				return
			case <-done:
				return
			}
		}
	}()
	werr := cmd.Wait()
	close(done)
	<-fwd
	var ee *exec.ExitError
	if werr != nil && !errors.As(werr, &ee) {
		return nil, fmt.Errorf("trace: waiting for %s: %w", spec.Argv[0], werr)
	}
	res := &Result{Status: cmd.ProcessState.String(), ExitCode: cmd.ProcessState.ExitCode()}
	rr, err := openRecords(recf)
	if err != nil {
		return res, fmt.Errorf("trace: records: %w", err)
	}
	each := spec.Each
	if each == nil {
		each = func(r Record) { res.Records = append(res.Records, r) }
	}
	err = Scan(io.TeeReader(rr, keep), each)
	res.Lost = rr.lost
	if err != nil {
		return res, fmt.Errorf("trace: %s's records: %w", strings.Join(spec.Argv, " "), err)
	}
	return res, nil
}

//go:build linux && cgo

package main

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/qpdrain/qpdrain/ibv"
)

// envHideExec makes the test binary a helper: hide libibverbs, then exec
// the CLI and arguments after "--" (TestHelperHideLibibverbs).
const envHideExec = "QPDRAIN_TEST_HIDE_LIBIBVERBS_EXEC"

// TestFallbackWithoutLibibverbs builds the CLI as make demo does, checks
// that it links no libibverbs or libnl, and runs it where libibverbs cannot
// be loaded: on a machine without it as it is, elsewhere in a private mount
// namespace where the library's directory is replaced by one holding only
// what the CLI needs. devices must exit 3 saying why; check and simulate
// must run on the soft device and say so in their first line.
func TestFallbackWithoutLibibverbs(t *testing.T) {
	cli := buildCLI(t)
	f, err := elf.Open(cli)
	if err != nil {
		t.Fatal(err)
	}
	libs, err := f.ImportedLibraries()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range libs {
		if strings.HasPrefix(l, "libibverbs") || strings.HasPrefix(l, "libnl") {
			t.Errorf("the CLI links %s (DT_NEEDED %v); libibverbs must be opened at run time", l, libs)
		}
	}

	run := func(args ...string) (stdout, stderr string, code int) {
		t.Helper()
		var out, errOut bytes.Buffer
		var err error
		if ibv.Load() != nil {
			cmd := exec.Command(cli, args...) // already absent here
			cmd.Stdout, cmd.Stderr = &out, &errOut
			err = cmd.Run()
		} else {
			// As root a mount namespace is enough; where that is refused
			// (a container without CAP_SYS_ADMIN), a user namespace may not be.
			for _, userNS := range []bool{os.Geteuid() != 0, true} {
				out.Reset()
				errOut.Reset()
				cmd := hideLibibverbs(cli, userNS, args...)
				cmd.Stdout, cmd.Stderr = &out, &errOut
				if err = cmd.Run(); !errors.Is(err, syscall.EPERM) {
					break
				}
			}
		}
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			code = ee.ExitCode()
		case err != nil:
			hideFailed(t, fmt.Errorf("running %s in a private mount namespace: %w", cli, err))
		}
		if strings.Contains(errOut.String(), "cannot hide libibverbs") {
			hideFailed(t, errors.New(errOut.String()))
		}
		return out.String(), errOut.String(), code
	}
	const why = "libibverbs is not installed: libibverbs.so.1: cannot open shared object file"

	if out, errOut, code := run("devices"); code != exitUnsupported || !strings.Contains(errOut, "no RDMA devices: "+why) || !strings.Contains(errOut, "libibverbs1") {
		t.Errorf("qpdrain devices: exit %d, stderr %q, stdout %q; want exit %d saying %q and the package to install", code, errOut, out, exitUnsupported, why)
	}
	if out, errOut, code := run("check"); code != exitClean || !strings.Contains(firstLine(out), "device soft0 (the built-in soft device: "+why) {
		t.Errorf("qpdrain check: exit %d, stderr %q, output:\n%s\nwant exit 0 on soft0, saying %q in the first line", code, errOut, out, why)
	}
	if out, errOut, code := run("simulate", "--qps", "4"); code != exitClean || !strings.Contains(firstLine(out), "the built-in soft device ("+why) || !strings.Contains(out, "4 safe") {
		t.Errorf("qpdrain simulate: exit %d, stderr %q, output:\n%s\nwant 4 safe QPs and %q in the first line", code, errOut, out, why)
	}
	if _, errOut, code := run("--help"); code != exitClean {
		t.Errorf("qpdrain --help: exit %d, stderr %q", code, errOut)
	}
}

// buildCLI builds cmd/qpdrain with the go command on PATH (go test puts
// its own first).
func buildCLI(t *testing.T) string {
	t.Helper()
	gocmd, err := exec.LookPath("go")
	if err != nil {
		// Inside the rxe VM: the image has test binaries, no toolchain.
		t.Skip("no Go toolchain here to build the CLI with; make test runs this on the host")
	}
	cli := filepath.Join(t.TempDir(), "qpdrain")
	cmd := exec.Command(gocmd, "build", "-o", cli, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/qpdrain: %v\n%s", err, out)
	}
	return cli
}

// hideFailed ends the test when libibverbs could not be hidden: a failure
// where hiding must work (as root, or in CI), a skip that says why where it
// may not (an unprivileged user without user namespaces).
func hideFailed(t *testing.T, err error) {
	t.Helper()
	if os.Geteuid() == 0 || os.Getenv("CI") == "true" {
		t.Fatalf("cannot hide libibverbs from the CLI: %v", err)
	}
	t.Skipf("cannot hide libibverbs from the CLI here (not root): %v", err)
}

// hideLibibverbs returns a command that runs cli with args in a private
// mount namespace (and with userNS a user namespace, in which it is root)
// where libibverbs cannot be found.
func hideLibibverbs(cli string, userNS bool, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^TestHelperHideLibibverbs$", "--", cli}, args...)...)
	cmd.Env = append(os.Environ(), envHideExec+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	if userNS {
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}},
		}
	}
	return cmd
}

// TestHelperHideLibibverbs is not a test: run by hideLibibverbs in its own
// mount namespace, it covers the directory the loader found libibverbs in
// with a tmpfs holding copies of the libraries the CLI needs from it, checks
// that the library is gone, and execs the CLI.
func TestHelperHideLibibverbs(t *testing.T) {
	if os.Getenv(envHideExec) == "" || flag.NArg() == 0 {
		t.Skip("helper of TestFallbackWithoutLibibverbs")
	}
	if err := hideAndExec(flag.Args()); err != nil {
		fmt.Fprintf(os.Stderr, "cannot hide libibverbs: %v\n", err)
		os.Exit(125)
	}
}

func hideAndExec(argv []string) error {
	if err := ibv.Load(); err != nil {
		return fmt.Errorf("the helper expected libibverbs to be present: %w", err)
	}
	dir, err := loadedFrom("libibverbs.so")
	if err != nil {
		return err
	}
	// Nothing done here may leak to the host's mounts.
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making / private: %w", err)
	}
	need, err := neededFrom(argv[0], dir)
	if err != nil {
		return err
	}
	stage, err := os.MkdirTemp("", "qpdrain-nolib-")
	if err != nil {
		return err
	}
	if err := syscall.Mount("tmpfs", stage, "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mounting a tmpfs on %s: %w", stage, err)
	}
	for _, name := range need {
		if err := copyFile(filepath.Join(dir, name), filepath.Join(stage, name)); err != nil {
			return err
		}
	}
	if err := syscall.Mount(stage, dir, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("covering %s: %w", dir, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "libibverbs.so.1")); !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%s/libibverbs.so.1 is still there after covering %s (%v)", dir, dir, err)
	}
	return syscall.Exec(argv[0], argv, os.Environ())
}

// loadedFrom is the directory of the mapped file whose name starts with
// prefix: where the loader found it.
func loadedFrom(prefix string) (string, error) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if p := fields[len(fields)-1]; strings.HasPrefix(filepath.Base(p), prefix) {
			return filepath.Dir(p), nil
		}
	}
	return "", fmt.Errorf("no %s* mapped after loading libibverbs (%v)", prefix, sc.Err())
}

// neededFrom lists the files of dir that bin needs to start: its
// interpreter and the libraries it and they name, transitively.
func neededFrom(bin, dir string) ([]string, error) {
	var need []string
	var visit func(path string) error
	visit = func(path string) error {
		f, err := elf.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		var names []string
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				b, err := io.ReadAll(p.Open())
				if err != nil {
					return err
				}
				interp, err := filepath.EvalSymlinks(strings.TrimRight(string(b), "\x00"))
				if err != nil {
					return err
				}
				if filepath.Dir(interp) == dir {
					names = append(names, filepath.Base(interp))
				}
			}
		}
		libs, err := f.ImportedLibraries()
		if err != nil {
			return err
		}
		names = append(names, libs...)
		for _, n := range names {
			if slices.Contains(need, n) {
				continue
			}
			if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
				continue // found elsewhere, which stays as it is
			}
			need = append(need, n)
			if err := visit(filepath.Join(dir, n)); err != nil {
				return err
			}
		}
		return nil
	}
	return need, visit(bin)
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from) // follows symlinks
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o755)
}

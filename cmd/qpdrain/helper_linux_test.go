package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/internal/testing/qpset"
)

// envHelper makes the test binary a helper process: "hold" creates the QP
// spread of qpset and holds it; "thread" creates QPs from a thread that
// exits; "fork" creates QPs, starts a child that inherits the uverbs fd
// ("keeper") and exits ("zombie" likewise, left unreaped by startHelper);
// "many" creates QPDRAIN_QPS_N QPs in RESET; "cli"
// runs qpdrain with the arguments after the binary's own. Each QP-making
// helper prints one READY line and holds its QPs until its stdin closes.
const envHelper = "QPDRAIN_QPS_HELPER"

// runHelper runs the helper named by envHelper and exits; it returns when
// the variable is unset.
func runHelper() {
	mode := os.Getenv(envHelper)
	if mode == "" {
		return
	}
	if mode == "cli" {
		main()
	}
	if err := helper(mode); err != nil {
		fmt.Fprintf(os.Stderr, "helper %s: %v\n", mode, err)
		os.Exit(1)
	}
	os.Exit(0)
}

func helper(mode string) error {
	if mode == "keeper" {
		// The inherited uverbs fd (3) keeps the context until stdin closes.
		_, _ = io.Copy(io.Discard, os.Stdin)
		return nil
	}
	// The PD is created on this thread, which stays.
	runtime.LockOSThread()
	ctx, set, err := openQPSet()
	if err != nil {
		return err
	}
	ready := fmt.Sprintf("READY pid=%d", os.Getpid())
	switch mode {
	case "hold":
		err = set.Spread()
	case "many":
		n, _ := strconv.Atoi(os.Getenv("QPDRAIN_QPS_N"))
		err = set.Many(n)
	case "thread":
		var tid int
		done := make(chan error)
		go func() {
			// Never unlocked: the thread exits with the goroutine.
			runtime.LockOSThread()
			tid = unix.Gettid()
			done <- set.Many(3)
		}()
		if err = <-done; err == nil {
			err = waitGone(filepath.Join("/proc/self/task", strconv.Itoa(tid)))
			ready += fmt.Sprintf(" tid=%d", tid)
		}
	case "fork", "zombie":
		if err = set.Many(2); err != nil {
			break
		}
		var keeper int
		if keeper, err = startKeeper(); err == nil {
			fmt.Printf("%s keeper=%d qpns=%s\n", ready, keeper, qpns(set))
			// Exit without closing: the keeper's fd keeps the context.
			os.Exit(0)
		}
	default:
		err = fmt.Errorf("unknown helper mode %q", mode)
	}
	if err != nil {
		return err
	}
	fmt.Printf("%s qpns=%s\n", ready, qpns(set))
	_, _ = io.Copy(io.Discard, os.Stdin)
	if err := set.Close(); err != nil {
		return err
	}
	return ctx.Close()
}

// openQPSet opens the test device (devtest.DeviceName) and a qpset on a new
// PD of it, for the helper processes.
func openQPSet() (ibv.Context, *qpset.Set, error) {
	ctx, err := ibv.Open(devtest.DeviceName())
	if err != nil {
		return nil, nil, err
	}
	set, err := qpset.NewPD(ctx)
	if err != nil {
		return nil, nil, errors.Join(err, ctx.Close())
	}
	return ctx, set, nil
}

func qpns(set *qpset.Set) string {
	parts := make([]string, len(set.QPs))
	for i, qp := range set.QPs {
		parts[i] = strconv.FormatUint(uint64(qp.Num()), 10)
	}
	return strings.Join(parts, ",")
}

// waitGone waits, bounded, until the task at path (/proc/<id> or
// /proc/self/task/<tid>) has exited: gone, or a zombie (an orphan waits for
// the VM's init to reap it).
func waitGone(path string) error {
	deadline := time.Now().Add(devtest.Timeout)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(filepath.Join(path, "status"))
		if os.IsNotExist(err) || err == nil && strings.Contains(string(b), "\nState:\tZ") {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("%s still running after %v", path, devtest.Timeout)
}

// startKeeper starts this binary as a keeper that inherits this process's
// uverbs fd and stdin, and returns its pid. Go cannot fork without exec,
// and rdma-core opens the fd close-on-exec, so the fd is passed
// explicitly: to the kernel it is the same open file either way.
func startKeeper() (int, error) {
	fd, path, err := uverbsFD()
	if err != nil {
		return 0, err
	}
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	f := os.NewFile(uintptr(fd), path)
	// os.StartProcess keeps duplicate variables and getenv takes the first:
	// drop this helper's own mode.
	env := []string{envHelper + "=keeper"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envHelper+"=") {
			env = append(env, kv)
		}
	}
	attr := &os.ProcAttr{
		Env:   env,
		Files: []*os.File{os.Stdin, os.Stderr, os.Stderr, f},
	}
	p, err := os.StartProcess(self, []string{self}, attr)
	if err != nil {
		return 0, fmt.Errorf("starting the keeper: %w", err)
	}
	return p.Pid, nil
}

// uverbsFD finds this process's fd on /dev/infiniband/uverbsN.
func uverbsFD() (int, string, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0, "", err
	}
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil && strings.HasPrefix(target, "/dev/infiniband/uverbs") {
			n, err := strconv.Atoi(e.Name())
			if err == nil {
				return n, target, nil
			}
		}
	}
	return 0, "", fmt.Errorf("no fd on /dev/infiniband/uverbs* in /proc/self/fd")
}

// readyLine reads a helper's READY line into its key=value fields.
func readyLine(r *bufio.Reader) (map[string]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, fmt.Errorf("reading the helper's READY line (got %q): %w", line, err)
	}
	f := strings.Fields(line)
	if len(f) == 0 || f[0] != "READY" {
		return nil, fmt.Errorf("helper said %q, want READY ...", line)
	}
	out := map[string]string{}
	for _, kv := range f[1:] {
		k, v, _ := strings.Cut(kv, "=")
		out[k] = v
	}
	return out, nil
}

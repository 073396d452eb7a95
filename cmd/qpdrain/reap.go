package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/qpdrain/qpdrain/leaks"
	"github.com/qpdrain/qpdrain/rdmanl/inventory"
)

func init() { subcommands = append(subcommands, newReapCmd) }

// reapOptions are the flags of "qpdrain reap".
type reapOptions struct {
	pid    int
	rxe    string
	signal reapSignal
	yes    bool
	wait   time.Duration
	host   hostOptions
}

// reapPoll is how often reap looks whether the QPs are gone.
const reapPoll = 100 * time.Millisecond

// errRefused is a target reap will not act on; the message says why.
var errRefused = errors.New("refused")

func newReapCmd(opts *globalOptions) *cobra.Command {
	o := &reapOptions{}
	cmd := &cobra.Command{
		Use:   "reap (--pid N [--signal TERM|INT|HUP|KILL] | --rxe NAME) [--yes]",
		Short: "Free leaked QPs by ending the process that keeps them, or deleting an rxe link, and prove it",
		Long: `No command destroys another process's QP: QPs are freed when the last holder of their device
context closes it (process exit) or when the device goes away. reap does that on an explicit
target and proves the result through RDMA netlink.
  --pid N    signal the process N (SIGTERM; --signal KILL only when asked), then wait, bounded
             by --wait, for the QPs whose context it alone holds (they go when it exits) to
             leave RDMA netlink, and report how many were freed and how many remain; the QPs
             it may keep alive (with other holders, or as one of unproven candidates) are
             listed apart, not waited for
  --rxe NAME delete the rxe link NAME once no process holds it (bounded by --wait), and report
             the QPs that went with it
Without --yes it prints the plan and changes nothing. It refuses pid 1, its own pid, kernel
threads, and rxe links with kernel QPs (beyond ib_core's GSI QP), saying why.
Exit status 0 when every QP went, 1 when some remain, 2 on errors and refusals, 3 no RDMA here.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmdContext(cmd)
			switch {
			case (o.pid != 0) == (o.rxe != ""):
				return withExitCode(exitError, errors.New("give one target: --pid N or --rxe NAME"))
			case o.pid != 0:
				return reapPID(ctx, cmd.OutOrStdout(), cmd.ErrOrStderr(), opts, o)
			}
			return reapRxe(ctx, cmd.OutOrStdout(), cmd.ErrOrStderr(), opts, o)
		},
	}
	o.host.flags(cmd, 30*time.Second)
	f := cmd.Flags()
	intFlag(f, &o.pid, "pid", 0, "the process that owns or holds the QPs", func(n int) error {
		if n < 1 {
			return errors.New("want a process id")
		}
		return nil
	})
	f.StringVar(&o.rxe, "rxe", "", "the rxe link to delete")
	wordFlag(f, &o.signal, "signal", reapSignal{"TERM", syscall.SIGTERM}, "the signal for --pid: TERM, INT, HUP or KILL", parseReapSignal)
	f.BoolVar(&o.yes, "yes", false, "act; without it reap prints the plan only")
	durationFlag(f, &o.wait, "wait", 10*time.Second, "how long to wait for the QPs to go", positive)
	return cmd
}

// reapSignal is a --signal value: the signal, and its name as the flag
// takes it (TERM).
type reapSignal struct {
	name string
	sig  syscall.Signal
}

// String is the signal's name without SIG, the flag's default.
func (s reapSignal) String() string { return s.name }

// reapSignals are the signals --signal accepts.
var reapSignals = map[string]syscall.Signal{"TERM": syscall.SIGTERM, "INT": syscall.SIGINT, "HUP": syscall.SIGHUP, "KILL": syscall.SIGKILL}

// parseReapSignal reads a --signal value: one of reapSignals' names, in
// any case, with or without SIG.
func parseReapSignal(s string) (reapSignal, error) {
	name := strings.TrimPrefix(strings.ToUpper(s), "SIG")
	sig, ok := reapSignals[name]
	if !ok {
		return reapSignal{}, errors.New("want TERM, INT, HUP or KILL")
	}
	return reapSignal{name, sig}, nil
}

// pfKthread is PF_KTHREAD (include/linux/sched.h), bit of /proc/<pid>/stat's
// flags field.
const pfKthread = 0x00200000

// kernelThread reports whether pid is a kernel thread.
func kernelThread(procRoot string, pid int) (bool, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return false, err
	}
	// Fields after the parenthesised comm, which may hold spaces: state is
	// field 3, flags field 9 (proc_pid_stat(5)).
	i := strings.LastIndexByte(string(b), ')')
	fields := strings.Fields(string(b[i+1:]))
	if i < 0 || len(fields) < 7 {
		return false, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	flags, err := strconv.ParseUint(fields[6], 10, 64)
	if err != nil {
		return false, fmt.Errorf("/proc/%d/stat: flags %q: %w", pid, fields[6], err)
	}
	return flags&pfKthread != 0, nil
}

// checkReapPID refuses the pids reap must never signal and names the
// process.
func checkReapPID(procRoot string, pid int) (leaks.Process, error) {
	switch {
	case pid == 1:
		return leaks.Process{}, fmt.Errorf("pid 1 is init, and ending it ends the host: %w", errRefused)
	case pid == os.Getpid():
		return leaks.Process{}, fmt.Errorf("pid %d is qpdrain itself: %w", pid, errRefused)
	}
	t, err := inventory.Proc{Root: procRoot}.Task(uint32(pid))
	if err != nil {
		return leaks.Process{}, err
	}
	if int(t.TGID) != pid {
		return leaks.Process{}, fmt.Errorf("pid %d is a thread of process %d (%s): signal the process (--pid %d): %w", pid, t.TGID, t.Comm, t.TGID, errRefused)
	}
	kt, err := kernelThread(procRoot, pid)
	if err != nil {
		return leaks.Process{}, err
	}
	if kt {
		return leaks.Process{}, fmt.Errorf("pid %d (%s) is a kernel thread: its QPs are kernel QPs, which only their module frees (see qpdrain leaks): %w", pid, t.Comm, errRefused)
	}
	return leaks.Process{PID: pid, Comm: t.Comm}, nil
}

// targetKey identifies a QP reap waits for.
type targetKey struct {
	dev  string
	lqpn uint32
	typ  string
}

// targetsOf splits the user QPs pid keeps alive: those it alone provably
// holds (they go when it exits), and those it may keep alive (it shares
// their context with other holders, or is one of the candidates of a
// context whose holders are not proven).
func targetsOf(s leaks.Sample, pid int) (alone, maybe []reapQP) {
	alone, maybe = []reapQP{}, []reapQP{}
	for _, d := range s.Devices {
		for _, q := range d.QPs {
			if q.Kernel() || !slices.ContainsFunc(q.Holders, func(p leaks.Process) bool { return p.PID == pid }) {
				continue
			}
			r := reapQP{Device: d.Name, QPRef: leaks.QPRef{Port: q.Port, LQPN: q.LQPN, Type: q.Type, State: q.State}, Held: q.Owner.PID != pid, owner: q.Owner.PID}
			switch {
			case q.HoldersCertain && len(q.Holders) == 1:
				alone = append(alone, r)
			case q.HoldersCertain:
				r.Why = "also held by " + otherHolders(q.Holders, pid)
				maybe = append(maybe, r)
			default:
				r.Why = "held by one or more of " + otherHolders(q.Holders, 0)
				maybe = append(maybe, r)
			}
		}
	}
	return alone, maybe
}

// otherHolders is "pid 20 (child), pid 30 (other)" without pid.
func otherHolders(hs []leaks.Process, pid int) string {
	var parts []string
	for _, h := range hs {
		if h.PID != pid {
			parts = append(parts, fmt.Sprintf("pid %d (%s)", h.PID, h.Comm))
		}
	}
	return strings.Join(parts, ", ")
}

// remaining are the targets still in s: the same QP, owned by no live
// process, the target or its owner when planned (the kernel reuses QP
// numbers: a new QP of another process is not the target).
func remaining(s leaks.Sample, targets []reapQP, pid int) []reapQP {
	now := map[targetKey]int{}
	for _, d := range s.Devices {
		for _, q := range d.QPs {
			now[targetKey{d.Name, q.LQPN, q.Type}] = q.Owner.PID
		}
	}
	out := []reapQP{}
	for _, t := range targets {
		if o, ok := now[targetKey{t.Device, t.LQPN, t.Type}]; ok && (o == 0 || o == pid || o == t.owner) {
			out = append(out, t)
		}
	}
	return out
}

// reapQP is one QP reap acts on.
type reapQP struct {
	Device string `json:"ifname"`
	leaks.QPRef
	// Held: the target keeps it alive without owning it.
	Held bool `json:"held,omitempty"`
	// Why a QP the target may keep alive is not waited for.
	Why string `json:"why,omitempty"`
	// owner is the QP's live owner when planned, 0 for none.
	owner int
}

// reapResult is what reap did, or would do.
type reapResult struct {
	Target    string   `json:"target"`
	PID       int      `json:"pid,omitempty"`
	Comm      string   `json:"comm,omitempty"`
	Signal    string   `json:"signal,omitempty"`
	Device    string   `json:"ifname,omitempty"`
	Done      bool     `json:"done"`
	QPs       []reapQP `json:"qps"`
	MayKeep   []reapQP `json:"may_keep_alive"`
	Freed     int      `json:"freed"`
	Remaining []reapQP `json:"remaining"`
	WaitedNS  int64    `json:"waited_ns"`
	Note      string   `json:"note,omitempty"`
}

func reapPID(ctx context.Context, stdout, stderr io.Writer, opts *globalOptions, o *reapOptions) error {
	proc, err := checkReapPID(o.host.proc, o.pid)
	if err != nil {
		return withExitCode(exitError, fmt.Errorf("reap: %w", err))
	}
	h, err := openHost(o.host, stderr)
	if err != nil {
		return hostError(err)
	}
	defer h.Close()
	src := boundedSampler{h, o.host.timeout}
	s, err := src.Sample(ctx)
	if err != nil {
		return hostError(fmt.Errorf("reading the host's QPs: %w", err))
	}
	res := reapResult{Target: "pid", PID: proc.PID, Comm: proc.Comm, Signal: "SIG" + o.signal.name,
		Remaining: []reapQP{}}
	res.QPs, res.MayKeep = targetsOf(s, o.pid)
	if len(res.QPs) == 0 && len(res.MayKeep) == 0 {
		res.Note = "it holds no QP's context: nothing to reap, no signal sent"
		return printReap(stdout, opts, &res, o)
	}
	if !o.yes {
		return printReap(stdout, opts, &res, o)
	}
	if err := h.Signal(o.pid, o.signal.sig); err != nil {
		return withExitCode(exitError, err)
	}
	opts.log.WithField("pid", o.pid).WithField("signal", res.Signal).Info("signalled")
	res.Done = true
	res.Remaining, res.WaitedNS, err = waitQPsGone(ctx, src, o.wait, res.QPs, func(s leaks.Sample) []reapQP { return remaining(s, res.QPs, o.pid) })
	if err != nil {
		return hostError(err)
	}
	res.Freed = len(res.QPs) - len(res.Remaining)
	return printReap(stdout, opts, &res, o)
}

// waitQPsGone samples the host until left reports nothing or wait has passed.
// A host left without RDMA devices has none of the QPs left; a wait over
// before any sample was read leaves all of targets.
func waitQPsGone(ctx context.Context, src leaks.Sampler, wait time.Duration, targets []reapQP, left func(leaks.Sample) []reapQP) ([]reapQP, int64, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	rest := targets
	for {
		s, err := src.Sample(ctx)
		switch {
		case errors.Is(err, leaks.ErrNoRDMA):
			return []reapQP{}, time.Since(start).Nanoseconds(), nil
		case err != nil && ctx.Err() != nil:
			// The wait is over; rest is what the last sample showed.
			return rest, time.Since(start).Nanoseconds(), nil
		case err != nil:
			return nil, 0, fmt.Errorf("reading the host's QPs: %w", err)
		}
		rest = left(s)
		if len(rest) == 0 {
			return []reapQP{}, time.Since(start).Nanoseconds(), nil
		}
		select {
		case <-ctx.Done():
			return rest, time.Since(start).Nanoseconds(), nil
		case <-time.After(reapPoll):
		}
	}
}

func reapRxe(ctx context.Context, stdout, stderr io.Writer, opts *globalOptions, o *reapOptions) error {
	h, err := openHost(o.host, stderr)
	if err != nil {
		return hostError(err)
	}
	defer h.Close()
	if err := h.CheckRxe(ctx, o.rxe); err != nil {
		return withExitCode(exitError, fmt.Errorf("reap: %w", err))
	}
	src := boundedSampler{h, o.host.timeout}
	s, err := src.Sample(ctx)
	if err != nil {
		return hostError(fmt.Errorf("reading the host's QPs: %w", err))
	}
	res := reapResult{Target: "rxe", Device: o.rxe, QPs: []reapQP{}, MayKeep: []reapQP{}, Remaining: []reapQP{}}
	for _, d := range s.Devices {
		if d.Name != o.rxe {
			continue
		}
		for _, q := range d.QPs {
			if q.Kernel() && q.Type != "GSI" && q.Type != "SMI" {
				return withExitCode(exitError, fmt.Errorf("reap: %s has kernel QPs of %s (lqpn %d, %s): deleting it would pull the device from under that module: %w",
					o.rxe, q.KernName, q.LQPN, q.Type, errRefused))
			}
			res.QPs = append(res.QPs, reapQP{Device: d.Name, QPRef: leaks.QPRef{Port: q.Port, LQPN: q.LQPN, Type: q.Type, State: q.State}})
		}
	}
	if !o.yes {
		return printReap(stdout, opts, &res, o)
	}
	start := time.Now()
	dctx, cancel := context.WithTimeout(ctx, o.wait)
	err = h.DeleteRxe(dctx, o.rxe)
	cancel()
	if err != nil {
		return withExitCode(exitError, fmt.Errorf("reap: %w", err))
	}
	res.Done = true
	res.Remaining, _, err = waitQPsGone(ctx, src, o.wait, res.QPs, func(s leaks.Sample) []reapQP {
		var rest []reapQP
		for _, d := range s.Devices {
			if d.Name == o.rxe {
				for _, q := range d.QPs {
					rest = append(rest, reapQP{Device: d.Name, QPRef: leaks.QPRef{Port: q.Port, LQPN: q.LQPN, Type: q.Type, State: q.State}})
				}
			}
		}
		return rest
	})
	if err != nil {
		return hostError(err)
	}
	res.WaitedNS = time.Since(start).Nanoseconds()
	res.Freed = len(res.QPs) - len(res.Remaining)
	return printReap(stdout, opts, &res, o)
}

// printReap prints the plan or the result and gives the exit status: 1
// when QPs remain after acting.
func printReap(w io.Writer, opts *globalOptions, r *reapResult, o *reapOptions) error {
	var err error
	if opts.json {
		err = printJSON(w, r)
	} else {
		err = formatReap(w, r, o)
	}
	if err != nil {
		return withExitCode(exitError, err)
	}
	if r.Done && len(r.Remaining) > 0 {
		return withExitCode(exitFindings, fmt.Errorf("%d of %d QPs remain", len(r.Remaining), len(r.QPs)))
	}
	return nil
}

func formatReap(w io.Writer, r *reapResult, o *reapOptions) error {
	who := fmt.Sprintf("pid %d (%s)", r.PID, r.Comm)
	if r.Target == "rxe" {
		who = "rxe link " + r.Device
	}
	if r.Note != "" {
		_, err := fmt.Fprintf(w, "%s: %s\n", who, r.Note)
		return err
	}
	held := 0
	for _, q := range r.QPs {
		if q.Held {
			held++
		}
	}
	qps := fmt.Sprintf("%d QPs it alone holds (%d owned, %d kept alive as a holder)", len(r.QPs), len(r.QPs)-held, held)
	if r.Target == "rxe" {
		qps = fmt.Sprintf("%d QPs", len(r.QPs))
	}
	if !r.Done {
		switch r.Target {
		case "rxe":
			fmt.Fprintf(w, "plan: delete %s once no process holds it (waiting up to %v), freeing its %s\n", who, o.wait, qps)
		default:
			fmt.Fprintf(w, "plan: send %s to %s, then wait up to %v for the %s to leave RDMA netlink\n", r.Signal, who, o.wait, qps)
		}
		fmt.Fprintf(w, "  %s\n", reapQPList(r.QPs))
		formatMayKeep(w, r.MayKeep)
		fmt.Fprintln(w, "nothing done: run again with --yes")
		return nil
	}
	switch r.Target {
	case "rxe":
		fmt.Fprintf(w, "deleted %s\n", who)
	default:
		fmt.Fprintf(w, "sent %s to %s\n", r.Signal, who)
	}
	fmt.Fprintf(w, "freed %d of %d QPs in %v; %d remain\n", r.Freed, len(r.QPs), time.Duration(r.WaitedNS).Round(time.Millisecond), len(r.Remaining))
	if len(r.Remaining) > 0 {
		fmt.Fprintf(w, "  remaining: %s\n", reapQPList(r.Remaining))
		if r.Target == "pid" {
			fmt.Fprintf(w, "  pid %d ignores %s (--signal KILL), or has not exited yet\n", r.PID, r.Signal)
		}
	}
	formatMayKeep(w, r.MayKeep)
	return nil
}

// formatMayKeep lists the QPs a target may keep alive, which reap does
// not wait for.
func formatMayKeep(w io.Writer, qps []reapQP) {
	if len(qps) == 0 {
		return
	}
	fmt.Fprintf(w, "not waited for: %d QPs it may keep alive, not alone or not provably:\n", len(qps))
	for i, q := range qps {
		if i == maxListed {
			fmt.Fprintf(w, "  ... (%d more; -j lists all)\n", len(qps)-i)
			break
		}
		fmt.Fprintf(w, "  %s lqpn %d %s %s: %s\n", q.Device, q.LQPN, q.Type, q.State, q.Why)
	}
}

// reapQPList is "rxe0 lqpn 17 RC ERR, ..." for at most maxListed QPs.
func reapQPList(qps []reapQP) string {
	var parts []string
	for i, q := range qps {
		if i == maxListed {
			parts = append(parts, fmt.Sprintf("... (%d more; -j lists all)", len(qps)-i))
			break
		}
		parts = append(parts, fmt.Sprintf("%s lqpn %d %s %s", q.Device, q.LQPN, q.Type, q.State))
	}
	if len(parts) == 0 {
		return "(no QPs)"
	}
	return strings.Join(parts, ", ")
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/qpdrain/qpdrain/leaks"
	"github.com/qpdrain/qpdrain/reap"
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

// reapResult is what reap did, or would do.
type reapResult struct {
	Target  string    `json:"target"`
	PID     int       `json:"pid,omitempty"`
	Comm    string    `json:"comm,omitempty"`
	Signal  string    `json:"signal,omitempty"`
	Device  string    `json:"ifname,omitempty"`
	Done    bool      `json:"done"`
	QPs     []reap.QP `json:"qps"`
	MayKeep []reap.QP `json:"may_keep_alive"`
	// MayKeepGone are the QPs of MayKeep that the last sample after the
	// signal no longer showed.
	MayKeepGone []reap.QP `json:"may_keep_alive_gone"`
	Freed       int       `json:"freed"`
	Remaining   []reap.QP `json:"remaining"`
	WaitedNS    int64     `json:"waited_ns"`
	Note        string    `json:"note,omitempty"`
}

func reapPID(ctx context.Context, stdout, stderr io.Writer, opts *globalOptions, o *reapOptions) error {
	proc, err := reap.CheckPID(o.host.proc, o.pid)
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
	plan := reap.PlanPID(s, proc)
	res := reapResult{Target: "pid", PID: proc.PID, Comm: proc.Comm, Signal: "SIG" + o.signal.name,
		QPs: plan.QPs, MayKeep: plan.MayKeep, MayKeepGone: []reap.QP{}, Remaining: []reap.QP{}}
	if plan.Empty() {
		res.Note = "it holds no QP's context: nothing to reap, no signal sent"
		return printReap(stdout, opts, &res, o)
	}
	if !o.yes {
		return printReap(stdout, opts, &res, o)
	}
	r, err := reap.Signal(ctx, src, h, &plan, o.signal.sig, o.wait)
	if err != nil {
		return hostError(err)
	}
	opts.log.WithField("pid", o.pid).WithField("signal", res.Signal).Info("signalled")
	res.Done, res.Freed, res.Remaining, res.MayKeepGone, res.WaitedNS = true, r.Freed, r.Remaining, r.MayKeepGone, r.Waited.Nanoseconds()
	return printReap(stdout, opts, &res, o)
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
	res := reapResult{Target: "rxe", Device: o.rxe, QPs: []reap.QP{}, MayKeep: []reap.QP{}, MayKeepGone: []reap.QP{}, Remaining: []reap.QP{}}
	for _, d := range s.Devices {
		if d.Name != o.rxe {
			continue
		}
		for _, q := range d.QPs {
			if q.Kernel() && q.Type != "GSI" && q.Type != "SMI" {
				return withExitCode(exitError, fmt.Errorf("reap: %s has kernel QPs of %s (lqpn %d, %s): deleting it would pull the device from under that module: %w",
					o.rxe, q.KernName, q.LQPN, q.Type, reap.ErrRefused))
			}
			res.QPs = append(res.QPs, reap.NewQP(d.Name, q))
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
	p, err := reap.Wait(ctx, src, o.wait, res.QPs, func(s leaks.Sample) []reap.QP {
		var rest []reap.QP
		for _, d := range s.Devices {
			if d.Name == o.rxe {
				for _, q := range d.QPs {
					rest = append(rest, reap.NewQP(d.Name, q))
				}
			}
		}
		return rest
	})
	if err != nil {
		return hostError(err)
	}
	res.Remaining = p.Remaining
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
	if len(r.MayKeepGone) > 0 {
		fmt.Fprintf(w, "gone too: %d of the QPs it may have kept alive (the last sample no longer shows them)\n", len(r.MayKeepGone))
		fmt.Fprintf(w, "  %s\n", reapQPList(r.MayKeepGone))
	}
	return nil
}

// formatMayKeep lists the QPs a target may keep alive, which reap does
// not wait for.
func formatMayKeep(w io.Writer, qps []reap.QP) {
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
func reapQPList(qps []reap.QP) string {
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

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/qpdrain/qpdrain/leaks"
	"github.com/qpdrain/qpdrain/metrics"
)

func init() { subcommands = append(subcommands, newLeaksCmd) }

// leaksOptions are the flags of "qpdrain leaks".
type leaksOptions struct {
	window, interval time.Duration
	nearLimit        float64
	textfile         string
	host             hostOptions
}

func newLeaksCmd(opts *globalOptions) *cobra.Command {
	o := &leaksOptions{}
	cmd := &cobra.Command{
		Use:   "leaks",
		Short: "Find leaked QPs: sample the host's QPs over a window and say which leak, why and what to do",
		Long: `Sample every QP on the host through RDMA netlink (with each QP's owner and the processes
that hold its device) over a window, and report findings, each with its reason, the evidence
the samples show and a remedy:
  stuck-in-error  user QPs of a live process in ERR or SQE in every sample
  orphaned        user QPs whose creator is gone (or a zombie), in any state; other processes
                  keep their context alive: one finding per set of holders
  growing         a process whose QP count rises in every sample while its ERR count rises
  near-limit      a device at or above --near-limit of its max_qp, or kernel IPoIB-CM QPs
                  near ib_ipoib's non-SRQ connection limit (max_nonsrq_conn_qp, 128)
  kernel          kernel-owned QPs (IPoIB) in ERR or SQE in every sample
A QP of a live owner that is busy or idle in RTS is never a finding (an orphaned QP is one in
any state). The kernel gives no QP age: every dwell
is the lower bound the window shows. It changes nothing on the host (docs/LEAKS.md).
--textfile FILE.prom writes the metrics for node_exporter's textfile collector, atomically.
Exit status 0 clean, 1 findings, 2 error, 3 no RDMA devices here.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runLeaks(cmdContext(cmd), cmd.OutOrStdout(), cmd.ErrOrStderr(), opts, o)
		},
	}
	o.host.flags(cmd, 2*time.Minute)
	f := cmd.Flags()
	durationFlag(f, &o.window, "for", leaks.DefaultFor, "how long to sample", atLeastDuration(0))
	durationFlag(f, &o.interval, "interval", leaks.DefaultInterval, "time between samples", positive)
	floatFlag(f, &o.nearLimit, "near-limit", leaks.DefaultNearLimit, "fraction of max_qp at which a device is near its limit", fraction(true))
	// node_exporter's textfile collector reads only *.prom files.
	stringFlag(f, &o.textfile, "textfile", "", "also write Prometheus metrics to this .prom file (node_exporter's textfile collector), atomically", outputFile(".prom"))
	return cmd
}

func runLeaks(ctx context.Context, stdout, stderr io.Writer, opts *globalOptions, o *leaksOptions) error {
	defer oneShotGC()()
	h, err := openHost(o.host, stderr)
	if err != nil {
		return hostError(err)
	}
	defer h.Close()
	progress := progressTo(stderr)
	samples, err := leaks.Watch(ctx, boundedSampler{h, o.host.timeout}, o.window, o.interval, func(i, n int, s leaks.Sample) {
		qps := 0
		for _, d := range s.Devices {
			qps += len(d.QPs)
		}
		progress("sample %d of %d: %d QPs on %d devices", i, n, qps, len(s.Devices))
	})
	if err != nil {
		return hostError(fmt.Errorf("sampling the host's QPs: %w", err))
	}
	lopts := leaks.Options{NearLimit: o.nearLimit, Limits: h.Limits(hostDevices(samples[len(samples)-1])),
		IPoIBNonSRQLimit: ipoibNonSRQLimit()}
	r := leaks.Analyze(samples, lopts)
	opts.log.WithField("samples", r.Samples).WithField("findings", len(r.Findings)).Debug("leaks analysed")
	if o.textfile != "" {
		if err := metrics.WriteTextfile(o.textfile, &r, samples); err != nil {
			return withExitCode(exitError, err)
		}
	}
	if opts.json {
		err = printJSON(stdout, leaksJSON{Report: r, WindowNS: r.Window().Nanoseconds(), IntervalNS: o.interval.Nanoseconds()})
	} else {
		err = formatLeaks(stdout, &r, o.interval, opts.details)
	}
	if err != nil {
		return withExitCode(exitError, err)
	}
	if len(r.Findings) > 0 {
		return withExitCode(exitFindings, fmt.Errorf("%d findings", len(r.Findings)))
	}
	return nil
}

// hostError gives err its exit status: 3 when the host has no RDMA; an
// error that has one keeps it.
func hostError(err error) error {
	var ec *exitCodeError
	if errors.As(err, &ec) {
		return err
	}
	if errors.Is(err, leaks.ErrNoRDMA) {
		return withExitCode(exitUnsupported, err)
	}
	return withExitCode(exitError, err)
}

// progressTo prints progress lines to w when it is a terminal, so that
// cron jobs and pipes stay quiet.
func progressTo(w io.Writer) func(format string, args ...any) {
	f, ok := w.(*os.File)
	if !ok {
		return func(string, ...any) {}
	}
	if st, err := f.Stat(); err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return func(string, ...any) {}
	}
	return func(format string, args ...any) { fmt.Fprintf(w, "qpdrain: "+format+"\n", args...) }
}

// ipoibNonSRQLimitPath is ib_ipoib's max_nonsrq_conn_qp module parameter.
const ipoibNonSRQLimitPath = "/sys/module/ib_ipoib/parameters/max_nonsrq_conn_qp"

// ipoibNonSRQLimit is ib_ipoib's max_nonsrq_conn_qp when the module is
// loaded, else 0 (the default, 128).
func ipoibNonSRQLimit() int {
	b, err := os.ReadFile(ipoibNonSRQLimitPath)
	if err != nil {
		return 0
	}
	var n int
	if _, err := fmt.Sscan(string(b), &n); err != nil {
		return 0
	}
	return n
}

// leaksJSON is the -j output.
type leaksJSON struct {
	leaks.Report
	WindowNS   int64 `json:"window_ns"`
	IntervalNS int64 `json:"interval_ns"`
}

// maxListed is how many QP numbers a text finding lists without -d.
const maxListed = 8

func formatLeaks(w io.Writer, r *leaks.Report, interval time.Duration, details bool) error {
	qps := 0
	for _, d := range r.Devices {
		qps += d.QPs
	}
	fmt.Fprintf(w, "%d samples over %v (interval %v): %d devices, %d QPs in the last\n", r.Samples, r.Window().Round(time.Millisecond), interval, len(r.Devices), qps)
	for _, d := range r.Devices {
		limit := "max_qp unknown: " + d.MaxQPUnknown
		if d.MaxQP > 0 {
			limit = fmt.Sprintf("max_qp %d", d.MaxQP)
		}
		fmt.Fprintf(w, "  %s: %d QPs, %s\n", d.Name, d.QPs, limit)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	for _, f := range r.Findings {
		var who string
		switch {
		case f.Owner != nil:
			who = fmt.Sprintf(" pid %d comm %s", f.Owner.PID, f.Owner.Comm)
		case f.KernName != "":
			who = " comm [" + f.KernName + "]"
		}
		who = string(appendWorkload([]byte(who), f.Workload()))
		fmt.Fprintf(w, "%s link %s%s", f.Reason, f.Device, who)
		if len(f.QPs) > 0 {
			fmt.Fprintf(w, " qps %d lqpn %s", len(f.QPs), lqpnList(f.QPs, details))
		}
		fmt.Fprintln(w)
		fmt.Fprintf(w, "  evidence: %s\n  remedy: %s\n", f.Evidence, f.Remedy)
	}
	if len(r.Findings) == 0 {
		_, err := fmt.Fprintln(w, "no leaks found")
		return err
	}
	counts := map[leaks.Reason]int{}
	for _, f := range r.Findings {
		counts[f.Reason]++
	}
	var parts []string
	for _, reason := range leaks.Reasons() {
		if counts[reason] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", reason, counts[reason]))
		}
	}
	_, err := fmt.Fprintf(w, "%d findings: %s\n", len(r.Findings), strings.Join(parts, ", "))
	return err
}

// lqpnList is "17,18,19" (with -d every QP, else the first few and a count).
func lqpnList(qps []leaks.QPRef, all bool) string {
	var b strings.Builder
	for i, q := range qps {
		if !all && i == maxListed {
			fmt.Fprintf(&b, ",... (%d more; -d lists all)", len(qps)-i)
			break
		}
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, q.LQPN)
	}
	return b.String()
}

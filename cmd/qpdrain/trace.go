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

	"github.com/qpdrain/qpdrain/flushcheck"
	"github.com/qpdrain/qpdrain/trace"
)

func init() { subcommands = append(subcommands, newTraceCmd) }

// traceOptions are the flags of "qpdrain trace".
type traceOptions struct {
	report    string
	records   string
	from      string
	shim      string
	shimCache string
	lastWQE   string
	flushWait time.Duration
	supps     []string
	errorExit int
}

// traceOutput is "qpdrain trace -j"'s document.
type traceOutput struct {
	Program  []string `json:"program,omitempty"`
	Status   string   `json:"status,omitempty"`
	ExitCode *int     `json:"exit_code,omitempty"`
	*trace.Report
}

func newTraceCmd(opts *globalOptions) *cobra.Command {
	o := &traceOptions{}
	cmd := &cobra.Command{
		Use:   "trace [flags] -- PROGRAM ARGS...",
		Short: "Run an unchanged RDMA program with a libibverbs shim and judge how it tears its QPs down",
		Long: "Run PROGRAM with a small shim preloaded over libibverbs (compiled with the host's cc on first use,\n" +
			"cached by its source's hash; --shim takes one built elsewhere) that records the life of every QP, CQ\n" +
			"and SRQ of every process of the program, then judge the records: " + kindList() + ".\n" +
			"The program's input, output and exit status are its own; the report goes to stdout after it ends,\n" +
			"or to --report FILE. --from FILE judges records kept earlier with --records.\n" +
			"Whether a device raises Last WQE Reached (--last-wqe auto) comes from the trace itself, else from\n" +
			"the flush check's last-wqe-reached probe, run on that device after the program ends.\n" +
			"--suppressions FILE names the findings a project has accepted (a kind, and the program, device or queue\n" +
			"it applies to, one a line): they are counted, not shown, and leave the verdict clean.\n" +
			"Exit status 0 clean, 1 findings (--error-exitcode), 2 error, 3 no C compiler for the shim or not Linux.\n" +
			"See docs/TRACE.md.",
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case len(args) == 0 && o.from == "":
				return withExitCode(exitError, errors.New("trace: nothing to trace: give a program to run (after --) or --from FILE"))
			case len(args) > 0 && o.from != "":
				return withExitCode(exitError, errors.New("trace: give a program to run (after --) or --from FILE, not both"))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return runTrace(cmdContext(cmd), cmd.OutOrStdout(), opts, o, args)
		},
	}
	f := cmd.Flags()
	f.SetInterspersed(false) // the program's own flags are not qpdrain's
	stringFlag(f, &o.report, "report", "", "write the report to FILE instead of stdout (whole, or not at all)", outputFile())
	stringFlag(f, &o.records, "records", "", "keep the shim's raw records in FILE", outputFile())
	f.StringVar(&o.from, "from", "", "judge the records in FILE (kept with --records) instead of running a program")
	f.StringVar(&o.shim, "shim", "", "the shim shared object to preload (default: build it with $CC or cc)")
	f.StringVar(&o.shimCache, "shim-cache", "", "where built shims are kept (default: the user's cache directory, qpdrain/trace)")
	stringFlag(f, &o.lastWQE, "last-wqe", "auto", "whether the devices raise Last WQE Reached: auto, raises, never", oneOf("auto", "raises", "never"))
	stringsFlag(f, &o.supps, "suppressions", nil, "a file of findings to suppress, one a line: KIND [program=GLOB] [device=GLOB] [queue=send|recv|srq] [caller=[OBJECT!]FUNCTION]; repeatable", func(string) error { return nil })
	intFlag(f, &o.errorExit, "error-exitcode", exitFindings, "the exit status when findings remain after the suppressions (0: findings never fail the run)", func(n int) error {
		if n < 0 || n > 125 || n == exitError || n == exitUnsupported {
			return fmt.Errorf("want 0 to 125, not %d or %d (an error, no shim)", exitError, exitUnsupported)
		}
		return nil
	})
	durationFlag(f, &o.flushWait, "flush-wait", trace.DefaultFlushWait, "how long a WR posted in ERROR may stay unflushed before it counts as never flushed", positive)
	return cmd
}

func kindList() string {
	var ks []string
	for _, k := range trace.Kinds() {
		ks = append(ks, string(k))
	}
	return strings.Join(ks, ", ")
}

func runTrace(ctx context.Context, stdout io.Writer, opts *globalOptions, o *traceOptions, args []string) error {
	var sups []trace.Suppression
	for _, name := range o.supps {
		s, err := readSuppressions(name)
		if err != nil {
			return withExitCode(exitError, fmt.Errorf("trace: %w", err))
		}
		sups = append(sups, s...)
	}
	out := traceOutput{}
	lost := 0
	z := trace.NewAnalyzer(trace.Options{FlushWait: o.flushWait})
	if o.from != "" {
		f, err := os.Open(o.from)
		if err != nil {
			return withExitCode(exitError, fmt.Errorf("trace: %w", err))
		}
		err = trace.Scan(f, z.Add)
		f.Close()
		if err != nil {
			return withExitCode(exitError, fmt.Errorf("trace: %s: %w", o.from, err))
		}
	} else {
		shim := o.shim
		if shim == "" {
			var err error
			if shim, err = trace.BuildShim(ctx, o.shimCache); err != nil {
				code := exitError
				if errors.Is(err, trace.ErrNoCompiler) {
					code = exitUnsupported
				}
				return withExitCode(code, fmt.Errorf("trace: %w", err))
			}
		}
		res, err := trace.Run(ctx, trace.RunSpec{Shim: shim, Argv: args, Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Records: o.records, Each: z.Add})
		if errors.Is(err, trace.ErrNotSupported) {
			return withExitCode(exitUnsupported, err)
		}
		if err != nil {
			return withExitCode(exitError, err)
		}
		out.Program, out.Status, out.ExitCode, lost = args, res.Status, &res.ExitCode, res.Lost
		opts.log.WithField("status", res.Status).Debug("traced program ended")
	}
	out.Report = z.Report(lastWQEKnowledge(ctx, opts, o.lastWQE, z.NeedsLastWQE()))
	if lost > 0 {
		out.Notes = append(out.Notes, fmt.Sprintf("%d record(s) lost (the record file was full, or a process was killed while it wrote one): the verdicts may miss what they showed", lost))
	}
	// the call sites named from the objects' symbols, on this machine (a
	// --from elsewhere keeps object offsets), before caller= matches them
	out.Symbolize(trace.ELFSymbols())
	out.Suppress(sups)
	write := func(w io.Writer) error { return writeTrace(w, opts, out) }
	var err error
	if o.report != "" {
		err = writeFileAtomic(o.report, write)
	} else {
		err = write(stdout)
	}
	if err != nil {
		return withExitCode(exitError, fmt.Errorf("trace: writing the report: %w", err))
	}
	if !out.Clean() && o.errorExit != exitClean {
		return withExitCode(o.errorExit, fmt.Errorf("trace: %d finding(s) not suppressed (--error-exitcode %d)", len(out.Findings), o.errorExit))
	}
	return nil
}

// readSuppressions reads one --suppressions file; its errors name the file
// (and the line).
func readSuppressions(name string) ([]trace.Suppression, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return trace.ParseSuppressions(f, name)
}

func writeTrace(w io.Writer, opts *globalOptions, out traceOutput) error {
	if opts.json {
		return printJSON(w, out)
	}
	if out.Program != nil {
		if _, err := fmt.Fprintf(w, "qpdrain trace: %s: %s\n", strings.Join(out.Program, " "), out.Status); err != nil {
			return err
		}
	}
	return out.WriteText(w, opts.details)
}

// lastWQEKnowledge answers, per device, whether it raises Last WQE Reached:
// as --last-wqe says, or (auto) by running the flush check's
// last-wqe-reached probe on each of devs (the devices an SRQ QP was
// destroyed too early on, whose behaviour the trace does not show).
func lastWQEKnowledge(ctx context.Context, opts *globalOptions, mode string, devs []string) func(string) (trace.LastWQE, bool) {
	if mode != "auto" {
		k := trace.LastWQE{Raises: mode == "raises", Source: "--last-wqe " + mode}
		return func(string) (trace.LastWQE, bool) { return k, true }
	}
	known := map[string]trace.LastWQE{}
	probe, _ := flushcheck.Lookup("last-wqe-reached")
	for _, dev := range devs {
		r, err := runProbeOn(ctx, probe, dev)
		if err != nil {
			opts.log.WithError(err).WithField("device", dev).Warning("cannot run the last-wqe-reached probe")
			continue
		}
		switch {
		case r.Outcome == flushcheck.Pass:
			known[dev] = trace.LastWQE{Raises: true, Source: "qpdrain check's last-wqe-reached probe, run now: " + r.Observed}
		case r.Outcome == flushcheck.Deviation && strings.Contains(r.Observed, "no Last WQE Reached"):
			known[dev] = trace.LastWQE{Raises: false, Source: "qpdrain check's last-wqe-reached probe, run now: " + r.Observed}
		case r.Outcome == flushcheck.Deviation:
			known[dev] = trace.LastWQE{Raises: true, Source: "qpdrain check's last-wqe-reached probe, run now (it deviates otherwise): " + r.Observed}
		default:
			opts.log.WithError(r.Err).WithField("device", dev).Warning("the last-wqe-reached probe could not run")
		}
	}
	return func(dev string) (trace.LastWQE, bool) { k, ok := known[dev]; return k, ok }
}

func runProbeOn(ctx context.Context, p flushcheck.Probe, dev string) (flushcheck.Result, error) {
	d, err := openVerbsDevice(dev)
	if err != nil {
		return flushcheck.Result{}, err
	}
	r := p.Run(ctx, d, flushcheck.Options{})
	if err := d.Close(); err != nil {
		return r, fmt.Errorf("closing %s: %w", dev, err)
	}
	return r, nil
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/scenario"
	"github.com/qpdrain/qpdrain/soft"
)

func init() { subcommands = append(subcommands, newSimulateCmd) }

// simulateOptions are the flags of "qpdrain simulate".
type simulateOptions struct {
	qps           int
	noSRQ         bool
	taken         int
	sends         int
	quirks        softQuirks
	policy        drain.Policy
	maxBatch      int
	maxQuarantine int
	recvDrain     bool
	timeout       time.Duration
}

func newSimulateCmd(opts *globalOptions) *cobra.Command {
	o := &simulateOptions{}
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Drain QPs on a soft device, with provider quirks, and report each drain",
		Long: "Create QPs on an in-process soft RDMA device, one CQ for all of them, with receives taken and\n" +
			"sends outstanding, then drain them all through the drain package's reaper: ERROR, Last WQE\n" +
			"Reached, one drain WR per batch, its completion. Prints one line per QP (outcome, time, batch,\n" +
			"flushed completions, the step that stalled) and the reaper's counts; -d prints every report.\n" +
			"Quirks: " + strings.Join(soft.QuirkNames(), ", ") + ".\n" +
			"Exit status 1 when a QP is not safe to destroy (quarantined or failed).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := simulate(cmdContext(cmd), o, opts)
			if err != nil {
				return withExitCode(exitError, fmt.Errorf("simulate: %w", err))
			}
			if opts.json {
				err = printJSON(cmd.OutOrStdout(), res.jsonView())
			} else {
				err = res.format(cmd.OutOrStdout(), opts.details)
			}
			if err != nil {
				return withExitCode(exitError, err)
			}
			if n := res.NotSafe(); n > 0 {
				return withExitCode(exitFindings, fmt.Errorf("%d of %d QPs not safe to destroy", n, len(res.Reports)))
			}
			return nil
		},
	}
	f := cmd.Flags()
	intFlag(f, &o.qps, "qps", 16, "QPs to drain (at most the soft device's max_qp, 65536)", between(1, scenario.MaxDrainCQE))
	f.BoolVar(&o.noSRQ, "no-srq", false, "give each QP its own receive queue instead of a shared SRQ")
	intFlag(f, &o.taken, "taken", 4, "receive WQEs each QP holds (taken from the SRQ, or posted on its own queue)", between(0, scenario.MaxDrainCQE))
	intFlag(f, &o.sends, "sends", 2, "sends outstanding on each QP", between(0, scenario.MaxDrainCQE))
	quirkFlag(f, &o.quirks, "quirk")
	wordFlag(f, &o.policy, "policy", drain.Quarantine, "policy for stalled drains: quarantine or destroy-when-empty", parseText[drain.Policy])
	intFlag(f, &o.maxBatch, "max-batch", 0, "QPs per drain WR, 0 for no cap, 1 for one at a time as ib_drain_qp", atLeast(0))
	intFlag(f, &o.maxQuarantine, "max-quarantine", drain.DefaultMaxQuarantine, "QPs the quarantine holds at most", atLeast(1))
	f.BoolVar(&o.recvDrain, "recv-drain", false, "prove an own receive queue by a receive drain WR instead of counting its receives back")
	durationFlag(f, &o.timeout, "timeout", 0, fmt.Sprintf("bound on the wait for Last WQE Reached and for each drain WR (default: %v, and %v more per QP, so that it follows the work)", scenario.BaseTimeout, scenario.TimeoutPerQP), positive)
	return cmd
}

// simResult is what a simulation saw, with the flags that shaped it.
type simResult struct {
	*scenario.DrainResult
	opts *simulateOptions
	note string // why there is no libibverbs, if there is none
}

// simulate runs the drain simulation the flags describe.
func simulate(ctx context.Context, o *simulateOptions, g *globalOptions) (*simResult, error) {
	d := &scenario.Drain{QPs: o.qps, NoSRQ: o.noSRQ, Taken: o.taken, Sends: o.sends, Quirks: o.quirks.quirks,
		Policy: o.policy, MaxBatch: o.maxBatch, MaxQuarantine: o.maxQuarantine, RecvDrain: o.recvDrain,
		Timeout: o.timeout, Log: g.libLog()}
	res, err := d.Run(ctx)
	switch {
	case errors.Is(err, scenario.ErrTooManyQPs):
		return nil, fmt.Errorf("--qps %d: %w", o.qps, err)
	case errors.Is(err, scenario.ErrCQTooLarge):
		return nil, fmt.Errorf("--qps %d with --taken %d and --sends %d: %w", o.qps, o.taken, o.sends, err)
	case err != nil:
		return nil, err
	}
	return &simResult{DrainResult: res, opts: o, note: noLibibverbs()}, nil
}

// timeoutSource says where the wait bound came from.
func (r *simResult) timeoutSource() string {
	if r.opts.timeout > 0 {
		return " (--timeout)"
	}
	return fmt.Sprintf(" (the default for %s: %v + %v each)", plural(r.opts.qps, "QP"), scenario.BaseTimeout, scenario.TimeoutPerQP)
}

func (r *simResult) format(w io.Writer, details bool) error {
	o := r.opts
	srq := "SRQ"
	if o.noSRQ {
		srq = "own receive queues"
	}
	if r.note != "" {
		fmt.Fprintf(w, "the built-in soft device (%s)\n", r.note)
	}
	fmt.Fprintf(w, "%s (%s, %d receives taken and %d sends outstanding each) on one CQ of %s (max_qp %d); policy %s; quirks: %s; each wait bounded by %v%s\n",
		plural(o.qps, "QP"), srq, o.taken, o.sends, softDefaultName, r.MaxQP, o.policy, quirkList(o.quirks.names), r.Timeout, r.timeoutSource())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "lqpn\toutcome\ttime\tbatch\trecv flushed\tsend flushed\tstalled")
	for _, rep := range r.Reports {
		stalled := "-"
		if rep.Stall != nil {
			stalled = rep.Stall.Error()
		}
		fmt.Fprintf(tw, "%d\t%s\t%v\t%d\t%d\t%d\t%s\n", rep.QPNum, rep.Outcome, rep.Duration().Round(time.Microsecond),
			rep.Batch, rep.Flushed[report.QueueRecv].Flushed, rep.Flushed[report.QueueSend].Flushed, stalled)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	s := r.Stats
	fmt.Fprintf(w, "%d safe, %d destroyed after an empty CQ, %d quarantined, %d failed; %s, %s, %d repeated Last WQE Reached\n",
		s.Safe, s.AfterEmptyCQ, s.Quarantined, s.Failed, plural(s.DrainWRs, "drain WR"), plural(s.RecvDrainWRs, "receive drain WR"), s.RepeatedLastWQE)
	if n := r.TimedOut(); n > 0 && len(o.quirks.names) == 0 {
		fmt.Fprintf(w, "the wait bound of %v ran out for %s, with no quirk: the bound, not the device, may be what failed; "+
			"rerun with --timeout %v or more to tell a slow run from a step that never comes\n",
			r.Timeout, plural(n, "QP"), (2 * r.Timeout).Round(time.Millisecond))
	} else if n > 0 {
		fmt.Fprintf(w, "the wait bound of %v ran out for %s: what the quirks withhold never came\n", r.Timeout, plural(n, "QP"))
	}
	if details {
		for _, rep := range r.Reports {
			fmt.Fprintf(w, "\n%s", rep)
		}
	}
	return nil
}

// simQPJSON is one QP's line in -j output; field names follow iproute2's
// rdma tool where they overlap (lqpn).
type simQPJSON struct {
	LQPN        uint32         `json:"lqpn"`
	Outcome     report.Outcome `json:"outcome"`
	DurationNS  int64          `json:"duration_ns"`
	Batch       int            `json:"batch"`
	RecvFlushed int            `json:"recv_flushed"`
	SendFlushed int            `json:"send_flushed"`
	Stalled     string         `json:"stalled,omitempty"`
	Error       string         `json:"error,omitempty"`
	Steps       []string       `json:"steps,omitempty"`
}

// simInputsJSON are the flags that shaped a simulation, and the limit.
type simInputsJSON struct {
	Device        string       `json:"ifname"`
	MaxQP         int          `json:"max_qp"`
	QPs           int          `json:"qps"`
	SRQ           bool         `json:"srq"`
	Taken         int          `json:"taken"`
	Sends         int          `json:"sends"`
	Quirks        []string     `json:"soft_quirks"`
	Policy        drain.Policy `json:"policy"`
	MaxBatch      int          `json:"max_batch"`
	MaxQuarantine int          `json:"max_quarantine"`
	RecvDrain     bool         `json:"recv_drain"`
	TimeoutNS     int64        `json:"timeout_ns"`
	TimeoutFlag   bool         `json:"timeout_given"`
}

type simJSON struct {
	Note     string        `json:"note,omitempty"` // why there is no libibverbs
	Inputs   simInputsJSON `json:"inputs"`
	TimedOut int           `json:"timed_out"`
	QPs      []simQPJSON   `json:"qps"`
	Stats    simStatsJSON  `json:"stats"`
}

// simStatsJSON is drain.Stats in -j output, keys in snake_case as every
// other key of the CLI. It converts from drain.Stats, so a field Stats gains
// and this lacks fails the build instead of going unprinted.
type simStatsJSON struct {
	Added           int `json:"added"`
	Pending         int `json:"pending"`
	Safe            int `json:"safe"`
	AfterEmptyCQ    int `json:"after_empty_cq"`
	Quarantined     int `json:"quarantined"`
	Failed          int `json:"failed"`
	DrainWRs        int `json:"drain_wrs"`
	RecvDrainWRs    int `json:"recv_drain_wrs"`
	InFlight        int `json:"in_flight"`
	MaxInFlight     int `json:"max_in_flight"`
	PostRetries     int `json:"post_retries"`
	RepeatedLastWQE int `json:"repeated_last_wqe"`
	LateEvents      int `json:"late_events"`
	LateDrainWCs    int `json:"late_drain_wcs"`
	ForeignWCs      int `json:"foreign_wcs"`
}

func (r *simResult) jsonView() simJSON {
	o := r.opts
	in := simInputsJSON{Device: softDefaultName, MaxQP: r.MaxQP, QPs: o.qps, SRQ: !o.noSRQ, Taken: o.taken, Sends: o.sends,
		Quirks: o.quirks.names, Policy: o.policy, MaxBatch: o.maxBatch, MaxQuarantine: o.maxQuarantine, RecvDrain: o.recvDrain,
		TimeoutNS: r.Timeout.Nanoseconds(), TimeoutFlag: o.timeout > 0}
	if in.Quirks == nil {
		in.Quirks = []string{}
	}
	out := simJSON{Note: r.note, Inputs: in, TimedOut: r.TimedOut(), Stats: simStatsJSON(r.Stats)}
	for _, rep := range r.Reports {
		q := simQPJSON{LQPN: rep.QPNum, Outcome: rep.Outcome, DurationNS: rep.Duration().Nanoseconds(), Batch: rep.Batch,
			RecvFlushed: rep.Flushed[report.QueueRecv].Flushed, SendFlushed: rep.Flushed[report.QueueSend].Flushed}
		if rep.Stall != nil {
			q.Stalled = rep.Stall.Error()
		}
		if rep.Err != nil {
			q.Error = rep.Err.Error()
		}
		for _, s := range rep.Steps() {
			q.Steps = append(q.Steps, fmt.Sprintf("+%v %s", s.At, s))
		}
		out.QPs = append(out.QPs, q)
	}
	return out
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/spf13/cobra"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/soft"
	"github.com/qpdrain/qpdrain/teardown"
)

func init() { subcommands = append(subcommands, newSimulateCmd) }

// simQuirks maps the --quirk names to the soft device's switches.
var simQuirks = map[string]func(*soft.Quirks){
	"send-in-error-not-flushed":    func(q *soft.Quirks) { q.SendInErrorNotFlushed = true },
	"no-last-wqe-reached":          func(q *soft.Quirks) { q.NoLastWQEReached = true },
	"last-wqe-reached-twice":       func(q *soft.Quirks) { q.LastWQEReachedTwice = true },
	"recv-in-error-flush-deferred": func(q *soft.Quirks) { q.RecvInErrorFlushDeferred = true },
	"drain-needs-rts":              func(q *soft.Quirks) { q.DrainNeedsRTS = true },
	"recv-in-error-not-flushed":    func(q *soft.Quirks) { q.RecvInErrorNotFlushed = true },
	"no-responder-error-event":     func(q *soft.Quirks) { q.NoResponderErrorEvent = true },
	"last-wqe-reached-again":       func(q *soft.Quirks) { q.LastWQEReachedAgain = true },
	"cq-overrun-keeps-qps":         func(q *soft.Quirks) { q.CQOverrunKeepsQPs = true },
	"flush-deferred":               func(q *soft.Quirks) { q.FlushDeferred = true },
	"sqd-drained-early":            func(q *soft.Quirks) { q.SQDrainedEarly = true },
}

// parseQuirks turns --quirk names into the soft device's switches.
func parseQuirks(names []string) (soft.Quirks, error) {
	var q soft.Quirks
	for _, name := range names {
		set, ok := simQuirks[name]
		if !ok {
			return soft.Quirks{}, fmt.Errorf("unknown quirk %q, want one of %s", name, strings.Join(simQuirkNames(), ", "))
		}
		set(&q)
	}
	return q, nil
}

func simQuirkNames() []string {
	names := make([]string, 0, len(simQuirks))
	for n := range simQuirks {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// simulateOptions are the flags of "qpdrain simulate".
type simulateOptions struct {
	qps           int
	noSRQ         bool
	taken         int
	sends         int
	quirks        []string
	policy        string
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
			"Quirks: " + strings.Join(simQuirkNames(), ", ") + ".\n" +
			"Exit status 1 when a QP is not safe to destroy (quarantined or failed).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := simulate(cmd.Context(), o, opts)
			if err != nil {
				return withExitCode(exitError, fmt.Errorf("simulate: %w", err))
			}
			if opts.json {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				err = enc.Encode(res.jsonView())
			} else {
				err = res.format(cmd.OutOrStdout(), opts.details)
			}
			if err != nil {
				return withExitCode(exitError, err)
			}
			if n := res.notSafe(); n > 0 {
				return withExitCode(exitFindings, fmt.Errorf("%d of %d QPs not safe to destroy", n, len(res.reports)))
			}
			return nil
		},
	}
	f := cmd.Flags()
	intFlag(f, &o.qps, "qps", 16, "QPs to drain (at most the soft device's max_qp, 65536)", between(1, simMaxCQE))
	f.BoolVar(&o.noSRQ, "no-srq", false, "give each QP its own receive queue instead of a shared SRQ")
	intFlag(f, &o.taken, "taken", 4, "receive WQEs each QP holds (taken from the SRQ, or posted on its own queue)", between(0, simMaxCQE))
	intFlag(f, &o.sends, "sends", 2, "sends outstanding on each QP", between(0, simMaxCQE))
	f.StringSliceVar(&o.quirks, "quirk", nil, "provider quirk of the soft device (repeatable): "+strings.Join(simQuirkNames(), ", "))
	f.StringVar(&o.policy, "policy", drain.Quarantine.String(), "policy for stalled drains: quarantine or destroy-when-empty")
	intFlag(f, &o.maxBatch, "max-batch", 0, "QPs per drain WR, 0 for no cap, 1 for one at a time as ib_drain_qp", atLeast(0))
	intFlag(f, &o.maxQuarantine, "max-quarantine", drain.DefaultMaxQuarantine, "QPs the quarantine holds at most", atLeast(1))
	f.BoolVar(&o.recvDrain, "recv-drain", false, "prove an own receive queue by a receive drain WR instead of counting its receives back")
	durationFlag(f, &o.timeout, "timeout", 0, fmt.Sprintf("bound on the wait for Last WQE Reached and for each drain WR (default: %v, and %v more per QP, so that it follows the work)", simBaseTimeout, simTimeoutPerQP), positive)
	return cmd
}

// simResult is what a simulation saw.
type simResult struct {
	opts    *simulateOptions
	timeout time.Duration // the wait bound used: --timeout or its default
	maxQP   int
	note    string // why there is no libibverbs, if there is none
	reports []*drain.Report
	stats   drain.Stats
}

// The simulation's wr_ids: receives and sends in two ranges, so that a
// flushed completion tells its queue.
const (
	simRecvBase uint64 = 1 << 32
	simSendBase uint64 = 2 << 32
)

var simQueue = drain.QueueByIDPrefix(32, simRecvBase, simSendBase)

// simMaxCQE bounds the one CQ of a simulation, and with it the QPs,
// receives and sends the flags may ask for: 4 Mi completions, some 200 MB.
const simMaxCQE = 1 << 22

// cqe is the depth of the simulation's CQ: room for every flushed receive
// and send, the drain WRs, and some slack. validate keeps it in range.
func (o *simulateOptions) cqe() int { return o.qps*(o.taken+o.sends+2) + 16 }

// The default --timeout: a base, and more per QP, since every step of
// every QP (the moves to ERROR, the events, the flushed completions) goes
// through one reaper, and a wait that starts with the first QP must
// outlast the work on all of them: 65,536 QPs took up to 0.6 s to 1.5 s
// on a shared 2-core machine, against a default of 6.8 s.
const (
	simBaseTimeout  = 200 * time.Millisecond
	simTimeoutPerQP = 100 * time.Microsecond
)

// waitTimeout is --timeout, or the default for the QPs asked for.
func (o *simulateOptions) waitTimeout() time.Duration {
	if o.timeout > 0 {
		return o.timeout
	}
	return simBaseTimeout + time.Duration(o.qps)*simTimeoutPerQP
}

// validate checks the flags that depend on each other.
func (o *simulateOptions) validate() error {
	switch {
	case o.cqe() > simMaxCQE:
		return fmt.Errorf("--qps %d with --taken %d and --sends %d: needs a CQ of %d completions, at most %d",
			o.qps, o.taken, o.sends, o.cqe(), simMaxCQE)
	}
	return nil
}

// simulate builds the device, drains every QP and tears everything down.
func simulate(ctx context.Context, o *simulateOptions, g *globalOptions) (res *simResult, err error) {
	if ctx == nil {
		ctx = context.Background()
	}
	q, err := parseQuirks(o.quirks)
	if err != nil {
		return nil, err
	}
	var policy drain.Policy
	switch o.policy {
	case drain.Quarantine.String():
	case drain.DestroyWhenEmpty.String():
		policy = drain.DestroyWhenEmpty
	default:
		return nil, fmt.Errorf("unknown policy %q, want quarantine or destroy-when-empty", o.policy)
	}
	if err := o.validate(); err != nil {
		return nil, err
	}

	// Objects are closed in reverse order of creation, children first,
	// whatever happens.
	var objs teardown.List
	keep := objs.Add
	defer func() {
		if cerr := objs.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()

	fab := soft.NewFabric()
	fab.SetAutoProgress(false) // sends stay outstanding until the QPs enter ERROR
	prefetch := o.taken
	if o.noSRQ {
		prefetch = 0
	}
	cqe := o.cqe()
	srqWR := max(o.qps*o.taken, 1)
	dev, err := soft.Open(soft.Config{Fabric: fab, Quirks: q, SRQPrefetch: prefetch,
		Limits: soft.Limits{MaxCQE: cqe, MaxSRQWR: srqWR, MaxQPWR: o.taken + o.sends + 2}})
	if err != nil {
		return nil, err
	}
	keep(dev)
	// The device's limit is known before anything is created on it.
	attr, err := dev.QueryDevice()
	if err != nil {
		return nil, err
	}
	if o.qps > attr.MaxQP {
		return nil, fmt.Errorf("--qps %d: %s creates at most %d QPs (max_qp)", o.qps, dev.Name(), attr.MaxQP)
	}
	// The peers live on a second device, so that all of max_qp is the
	// drained QPs'.
	peers, err := soft.Open(soft.Config{Fabric: fab, Name: "soft1", Limits: soft.Limits{MaxQPWR: o.taken + o.sends + 2}})
	if err != nil {
		return nil, err
	}
	keep(peers)
	ch, err := dev.CreateCompChannel()
	if err != nil {
		return nil, err
	}
	keep(ch)
	cq, err := dev.CreateCQ(cqe, ch)
	if err != nil {
		return nil, err
	}
	keep(cq)
	peerCQ, err := peers.CreateCQ(16, nil)
	if err != nil {
		return nil, err
	}
	keep(peerCQ)
	pd, err := dev.AllocPD()
	if err != nil {
		return nil, err
	}
	keep(pd)
	peerPD, err := peers.AllocPD()
	if err != nil {
		return nil, err
	}
	keep(peerPD)
	var srq ibv.SRQ
	if !o.noSRQ {
		if srq, err = pd.CreateSRQ(ibv.SRQAttr{MaxWR: uint32(srqWR), MaxSGE: 1}); err != nil {
			return nil, err
		}
		keep(srq)
		if err := srq.PostRecv(simRecvs(0, o.qps*o.taken)); err != nil {
			return nil, err
		}
	}
	qcap := ibv.QPCap{MaxSendWR: uint32(o.sends + 1), MaxRecvWR: uint32(o.taken + 1), MaxSendSGE: 1, MaxRecvSGE: 1}
	qps := make([]ibv.QP, o.qps)
	for i := range qps {
		qp, err := pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, SRQ: srq, Cap: qcap, Type: ibv.QPTRC})
		if err != nil {
			return nil, err
		}
		keep(qp)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		peer, err := peerPD.CreateQP(ibv.QPInitAttr{SendCQ: peerCQ, RecvCQ: peerCQ, Cap: qcap, Type: ibv.QPTRC})
		if err != nil {
			return nil, err
		}
		keep(peer)
		if err := soft.Connect(qp, peer, 1); err != nil {
			return nil, err
		}
		if o.noSRQ && o.taken > 0 {
			if err := qp.PostRecv(simRecvs(i*o.taken, o.taken)); err != nil {
				return nil, err
			}
		}
		if o.sends > 0 {
			if err := qp.PostSend(simSends(i*o.sends, o.sends)); err != nil {
				return nil, err
			}
		}
		qps[i] = qp
	}

	timeout := o.waitTimeout()
	rp := drain.NewReaper(cq, drain.Options{
		Policy: policy, MaxQuarantine: o.maxQuarantine, MaxBatch: o.maxBatch,
		LastWQETimeout: timeout, DrainTimeout: timeout, Queue: simQueue,
		Channel: ch, Events: dev, Log: g.log,
	})
	// Every QP is added, and the reaper handed the events their moves to
	// ERROR raised, before Run starts: Run reads events and completions in
	// two goroutines, and the batches, and so the output, would otherwise
	// depend on how the scheduler interleaves them.
	hs := make([]*drain.Handle, len(qps))
	for i, qp := range qps {
		// The simulator knows what it posted: no sends means a QP with an
		// SRQ shares the barrier; its own receives can be counted back.
		add := drain.AddOptions{NoSends: o.sends == 0, CountRecvs: o.noSRQ && !o.recvDrain, Recvs: o.taken}
		if hs[i], err = rp.Add(qp, add); err != nil {
			return nil, err
		}
	}
	raised, stop := context.WithCancel(ctx)
	stop() // NextAsyncEvent returns what is queued, then the context's error
	for {
		ev, err := dev.NextAsyncEvent(raised)
		if err != nil {
			break
		}
		rp.HandleEvent(ev)
	}
	runCtx, cancel := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- rp.Run(runCtx) }()
	defer func() {
		cancel()
		if rerr := <-runDone; rerr != nil && !errors.Is(rerr, context.Canceled) && err == nil {
			err = rerr
		}
	}()
	// Every step is bounded by the timeout; this bounds the whole run in
	// case the simulation itself is wrong.
	waitCtx, waitCancel := context.WithTimeout(ctx, 4*timeout+10*time.Second)
	defer waitCancel()
	res = &simResult{opts: o, note: noLibibverbs(), timeout: timeout, maxQP: attr.MaxQP}
	for _, h := range hs {
		rep, _ := h.Wait(waitCtx)
		res.reports = append(res.reports, rep)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	res.stats = rp.Stats()
	return res, nil
}

func simRecvs(first, n int) []ibv.RecvWR {
	wrs := make([]ibv.RecvWR, n)
	for i := range wrs {
		wrs[i].ID = simRecvBase | uint64(first+i)
	}
	return wrs
}

func simSends(first, n int) []ibv.SendWR {
	wrs := make([]ibv.SendWR, n)
	for i := range wrs {
		wrs[i] = ibv.SendWR{ID: simSendBase | uint64(first+i), Opcode: ibv.WRSend, Flags: ibv.SendSignaled}
	}
	return wrs
}

// timeoutSource says where the wait bound came from.
func (r *simResult) timeoutSource() string {
	if r.opts.timeout > 0 {
		return " (--timeout)"
	}
	return fmt.Sprintf(" (the default for %s: %v + %v each)", plural(r.opts.qps, "QP"), simBaseTimeout, simTimeoutPerQP)
}

// timedOut counts the QPs whose drain stalled because a wait ran out.
func (r *simResult) timedOut() int {
	n := 0
	for _, rep := range r.reports {
		if rep.Stall != nil && (errors.Is(rep.Stall, drain.ErrNoLastWQE) || errors.Is(rep.Stall, drain.ErrDrainNotFlushed) ||
			errors.Is(rep.Stall, drain.ErrNoHeadroom) || errors.Is(rep.Stall, drain.ErrRecvsMissing) || errors.Is(rep.Stall, drain.ErrCQNotEmpty) ||
			errors.Is(rep.Stall, drain.ErrPostDrain)) {
			n++
		}
	}
	return n
}

func (r *simResult) notSafe() int {
	n := 0
	for _, rep := range r.reports {
		if !rep.Outcome.SafeToDestroy() {
			n++
		}
	}
	return n
}

func (r *simResult) format(w io.Writer, details bool) error {
	o := r.opts
	srq := "SRQ"
	if o.noSRQ {
		srq = "own receive queues"
	}
	quirks := "none"
	if len(o.quirks) > 0 {
		quirks = strings.Join(o.quirks, ", ")
	}
	if r.note != "" {
		fmt.Fprintf(w, "the built-in soft device (%s)\n", r.note)
	}
	fmt.Fprintf(w, "%s (%s, %d receives taken and %d sends outstanding each) on one CQ of %s (max_qp %d); policy %s; quirks: %s; each wait bounded by %v%s\n",
		plural(o.qps, "QP"), srq, o.taken, o.sends, softDefaultName, r.maxQP, o.policy, quirks, r.timeout, r.timeoutSource())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "lqpn\toutcome\ttime\tbatch\trecv flushed\tsend flushed\tstalled")
	for _, rep := range r.reports {
		stalled := "-"
		if rep.Stall != nil {
			stalled = rep.Stall.Error()
		}
		fmt.Fprintf(tw, "%d\t%s\t%v\t%d\t%d\t%d\t%s\n", rep.QPNum, rep.Outcome, rep.Duration().Round(time.Microsecond),
			rep.Batch, rep.Flushed[drain.QueueRecv].Flushed, rep.Flushed[drain.QueueSend].Flushed, stalled)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	s := r.stats
	fmt.Fprintf(w, "%d safe, %d destroyed after an empty CQ, %d quarantined, %d failed; %s, %s, %d repeated Last WQE Reached\n",
		s.Safe, s.AfterEmptyCQ, s.Quarantined, s.Failed, plural(s.DrainWRs, "drain WR"), plural(s.RecvDrainWRs, "receive drain WR"), s.RepeatedLastWQE)
	if n := r.timedOut(); n > 0 && len(o.quirks) == 0 {
		fmt.Fprintf(w, "the wait bound of %v ran out for %s, with no quirk: the bound, not the device, may be what failed; "+
			"rerun with --timeout %v or more to tell a slow run from a step that never comes\n",
			r.timeout, plural(n, "QP"), (2 * r.timeout).Round(time.Millisecond))
	} else if n > 0 {
		fmt.Fprintf(w, "the wait bound of %v ran out for %s: what the quirks withhold never came\n", r.timeout, plural(n, "QP"))
	}
	if details {
		for _, rep := range r.reports {
			fmt.Fprintf(w, "\n%s", rep)
		}
	}
	return nil
}

// simQPJSON is one QP's line in -j output; field names follow iproute2's
// rdma tool where they overlap (lqpn).
type simQPJSON struct {
	LQPN        uint32   `json:"lqpn"`
	Outcome     string   `json:"outcome"`
	DurationNS  int64    `json:"duration_ns"`
	Batch       int      `json:"batch"`
	RecvFlushed int      `json:"recv_flushed"`
	SendFlushed int      `json:"send_flushed"`
	Stalled     string   `json:"stalled,omitempty"`
	Error       string   `json:"error,omitempty"`
	Steps       []string `json:"steps,omitempty"`
}

// simInputsJSON are the flags that shaped a simulation, and the limit.
type simInputsJSON struct {
	Device        string   `json:"ifname"`
	MaxQP         int      `json:"max_qp"`
	QPs           int      `json:"qps"`
	SRQ           bool     `json:"srq"`
	Taken         int      `json:"taken"`
	Sends         int      `json:"sends"`
	Quirks        []string `json:"soft_quirks"`
	Policy        string   `json:"policy"`
	MaxBatch      int      `json:"max_batch"`
	MaxQuarantine int      `json:"max_quarantine"`
	RecvDrain     bool     `json:"recv_drain"`
	TimeoutNS     int64    `json:"timeout_ns"`
	TimeoutFlag   bool     `json:"timeout_given"`
}

type simJSON struct {
	Note     string         `json:"note,omitempty"` // why there is no libibverbs
	Inputs   simInputsJSON  `json:"inputs"`
	TimedOut int            `json:"timed_out"`
	QPs      []simQPJSON    `json:"qps"`
	Stats    map[string]any `json:"stats"` // drain.Stats, snakeJSON
}

// snakeCase turns a Go field name into a JSON key as every other key of
// the CLI is written: "RecvDrainWRs" -> "recv_drain_wrs", "AfterEmptyCQ" ->
// "after_empty_cq".
func snakeCase(name string) string {
	var b strings.Builder
	rs := []rune(name)
	for i, r := range rs {
		upper := unicode.IsUpper(r)
		if upper && i > 0 && (!unicode.IsUpper(rs[i-1]) || i+1 < len(rs) && unicode.IsLower(rs[i+1]) && rs[i+1] != 's') {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

// snakeJSON is a flat struct of numbers as a JSON object with snake_case
// keys, so that drain.Stats is printed whole however its fields change.
func snakeJSON(v any) map[string]any {
	rv := reflect.ValueOf(v)
	out := make(map[string]any, rv.NumField())
	for i := range rv.NumField() {
		if f := rv.Type().Field(i); f.IsExported() {
			out[snakeCase(f.Name)] = rv.Field(i).Interface()
		}
	}
	return out
}

func (r *simResult) jsonView() simJSON {
	o := r.opts
	in := simInputsJSON{Device: softDefaultName, MaxQP: r.maxQP, QPs: o.qps, SRQ: !o.noSRQ, Taken: o.taken, Sends: o.sends,
		Quirks: o.quirks, Policy: o.policy, MaxBatch: o.maxBatch, MaxQuarantine: o.maxQuarantine, RecvDrain: o.recvDrain,
		TimeoutNS: r.timeout.Nanoseconds(), TimeoutFlag: o.timeout > 0}
	if in.Quirks == nil {
		in.Quirks = []string{}
	}
	out := simJSON{Note: r.note, Inputs: in, TimedOut: r.timedOut(), Stats: snakeJSON(r.stats)}
	for _, rep := range r.reports {
		q := simQPJSON{LQPN: rep.QPNum, Outcome: rep.Outcome.String(), DurationNS: rep.Duration().Nanoseconds(), Batch: rep.Batch,
			RecvFlushed: rep.Flushed[drain.QueueRecv].Flushed, SendFlushed: rep.Flushed[drain.QueueSend].Flushed}
		if rep.Stall != nil {
			q.Stalled = rep.Stall.Error()
		}
		if rep.Err != nil {
			q.Error = rep.Err.Error()
		}
		for _, s := range rep.Steps {
			q.Steps = append(q.Steps, fmt.Sprintf("+%v %s", s.At.Sub(rep.Start), s))
		}
		out.QPs = append(out.QPs, q)
	}
	return out
}

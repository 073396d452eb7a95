package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/qpdrain/qpdrain/clock"
	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/flushcheck"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/rcsetup"
	"github.com/qpdrain/qpdrain/soft"
)

func init() { subcommands = append(subcommands, newCheckCmd) }

// checkOptions are the flags of "qpdrain check".
type checkOptions struct {
	device string
	quirks softQuirks
	// cm connects the probes' pairs through the RDMA CM where by hand
	// would do (an iWARP device always connects through it); cmAddr is
	// the address it listens on, zero for the device's netdev's.
	cm          bool
	cmAddr      netip.Addr
	timeout     time.Duration
	callTimeout time.Duration
	// run and skip select probes by name (flushcheck.Options.Run, Skip).
	run, skip *regexp.Regexp
}

// selection is --run and --skip as given, for text: `--run "x" --skip "y"`.
func (o *checkOptions) selection() string {
	var parts []string
	for _, f := range []struct {
		name string
		re   *regexp.Regexp
	}{{"--run", o.run}, {"--skip", o.skip}} {
		if f.re != nil {
			parts = append(parts, fmt.Sprintf("%s %q", f.name, f.re))
		}
	}
	return strings.Join(parts, " ")
}

// probeOptions are the flushcheck.Options the flags give.
func (o *checkOptions) probeOptions() flushcheck.Options {
	return flushcheck.Options{Timeout: o.timeout, CallTimeout: o.callTimeout, Run: o.run, Skip: o.skip}
}

func newCheckCmd(opts *globalOptions) *cobra.Command {
	o := &checkOptions{}
	var names []string
	for _, p := range flushcheck.Probes() {
		names = append(names, p.Name)
	}
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Probe whether an RDMA device flushes the way drains need, and how to drain it",
		Long: "Run the provider flush check on one RDMA device: each probe sets up its own RC QPs (loopback\n" +
			"on the device), drives them into ERROR and checks one rule of the specification: " + strings.Join(names, ", ") + ".\n" +
			"Each probe's line is printed as it finishes, the probes that watch a quiet period last; a wait that\n" +
			"lasts a second is told on stderr. The check ends with the drain settings its findings\n" +
			"imply (flushcheck.Settings), one reason each.\n" +
			"Without --device it checks the first device libibverbs lists, or the built-in soft device when\n" +
			"there is none (and says so); --device soft (or soft0) picks the soft device. --soft-quirk switches\n" +
			"on a provider bug of the soft device, to see what the check reports for it; quirks: " + strings.Join(soft.QuirkNames(), ", ") + ".\n" +
			"--run and --skip select probes by name, as go test's -run and -skip do; the others are listed as skipped.\n" +
			"The probes' QP pairs connect by hand (RESET, INIT, RTR, RTS over the port's loopback route), or through\n" +
			"the RDMA CM as applications connect (librdmacm; the soft device's own CM for soft): always on an iWARP\n" +
			"device (--device soft:iwarp is the soft device with siw's rules), elsewhere with --cm. The CM listens on\n" +
			"--cm-addr, by default the IP address of the device's netdev (rdma link). A probe whose rule does not\n" +
			"exist on iWARP (RNR, retry_cnt, SQD) says so, with its source: not-applicable, neither pass nor error.\n" +
			"A verbs call that does not return within --call-timeout (a provider stuck in the kernel) ends the\n" +
			"check: its probe is reported hung, naming the call, the probes after it are not run (the device may\n" +
			"be wedged: see the kernel log), and the device is left open for the process's exit to release.\n" +
			"Exit status 0 when every probe run passes, 1 when the device deviates, 2 when a probe could not run,\n" +
			"3 when the device does not exist here, 4 when a verbs call hung.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmdContext(cmd)
			if len(o.probeOptions().Selected()) == 0 {
				return withExitCode(exitError, fmt.Errorf("check: no probe left to run by %s", o.selection()))
			}
			w := cmd.OutOrStdout()
			var each func(*checkResult, flushcheck.Result)
			if !opts.json {
				each = func(r *checkResult, res flushcheck.Result) { r.formatProbe(w, res) }
			}
			res, err := runCheck(ctx, o, func(r *checkResult) {
				if !opts.json {
					r.formatHead(w)
				}
			}, each, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			opts.log.WithField("device", res.device).WithField("probes", len(res.results)).Debug("flush check ran")
			if opts.json {
				err = printJSON(w, res.jsonView())
			} else {
				err = res.formatTail(w, opts.details)
			}
			if err != nil {
				return withExitCode(exitError, err)
			}
			return checkVerdict(res.results)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.device, "device", "", `RDMA device to check (default: the first one libibverbs lists, else "soft", the built-in soft device)`)
	quirkFlag(f, &o.quirks, "soft-quirk")
	f.BoolVar(&o.cm, "cm", false, "connect the probes' QPs through the RDMA CM (always on an iWARP device)")
	f.Var(&checkedValue[netip.Addr]{p: &o.cmAddr, typ: "address", worded: true, check: func(netip.Addr) error { return nil },
		parse: func(s string) (netip.Addr, error) {
			a, err := netip.ParseAddr(s)
			if err != nil {
				return a, errors.New("not an IP address")
			}
			return a, nil
		},
		format: func(a netip.Addr) string {
			if !a.IsValid() {
				return ""
			}
			return a.String()
		}}, "cm-addr", "IP address the RDMA CM listens on for the probes' connections; implies --cm (default: the device's netdev's)")
	durationFlag(f, &o.timeout, "timeout", flushcheck.DefaultTimeout, fmt.Sprintf("how long each probe waits for a completion or event the specification says must come (at least %v; a retry series gets one per retry timer after its own time, 2s at the least)", flushcheck.MinTimeout),
		atLeastDuration(flushcheck.MinTimeout))
	durationFlag(f, &o.callTimeout, "call-timeout", flushcheck.DefaultCallTimeout, fmt.Sprintf("how long one verbs call may take before its probe is reported hung and the check ends, exit status 4 (at least %v)", flushcheck.MinCallTimeout),
		atLeastDuration(flushcheck.MinCallTimeout))
	probeFlag(f, &o.run, "run", "run only the probes whose names match this regular expression, as go test -run")
	probeFlag(f, &o.skip, "skip", "skip the probes whose names match this regular expression, as go test -skip")
	return cmd
}

// probeFlag defines a flag whose value is a regular expression that
// matches the name of at least one probe: one that matches none is a typo,
// refused before the check runs.
func probeFlag(f *pflag.FlagSet, p **regexp.Regexp, name, usage string) {
	f.Var(&checkedValue[*regexp.Regexp]{p: p, typ: "regexp", parse: regexp.Compile, worded: true,
		check: func(re *regexp.Regexp) error {
			var names []string
			for _, p := range flushcheck.Probes() {
				if re.MatchString(p.Name) {
					return nil
				}
				names = append(names, p.Name)
			}
			return fmt.Errorf("matches no probe (%s)", strings.Join(names, ", "))
		},
		format: func(re *regexp.Regexp) string {
			if re == nil {
				return ""
			}
			return re.String()
		}}, name, usage)
}

// checkResult is what "qpdrain check" found on one device.
type checkResult struct {
	device string
	soft   bool
	// transport is the device's (ibv.DeviceInfo.Transport).
	transport ibv.TransportType
	// cm, when not nil, connects the probes' pairs through the RDMA CM
	// and closes the device (runCheck closes it instead of the device).
	cm     *checkCM
	note   string // why the soft device was chosen, if it was not asked for
	quirks []string
	opts   checkOptions // the flags: the inputs that shaped the results
	// clock is the device's own clock the probes wait on, nil for the
	// wall clock (flushcheck.Options.Clock).
	clock   clock.Clock
	results []flushcheck.Result
}

// openCheck opens the device check runs on; tests replace it.
var openCheck = openCheckDevice

// runCheck opens the device, calls head once it is open, runs the probes
// the flags select, calling each (if not nil) as each one finishes and
// telling progress of each wait that lasts flushcheck.LongWait (on stderr,
// not in the table or the JSON), and closes the device, unless a probe
// hung: a device with a verbs call blocked on it is left open, since
// closing it would block too, and the process's exit releases it. Its
// errors carry their exit code.
func runCheck(ctx context.Context, o *checkOptions, head func(*checkResult), each func(*checkResult, flushcheck.Result), progress io.Writer) (*checkResult, error) {
	dev, res, err := openCheck(o)
	if err != nil {
		return nil, fmt.Errorf("check: %w", err)
	}
	res.opts = *o
	if head != nil {
		head(res)
	}
	po := o.probeOptions()
	po.Clock = res.clock
	po.OnWait = func(w flushcheck.Wait) {
		fmt.Fprintf(progress, "check: %s still waiting for %s (%v so far, at most %v)\n", w.Probe, w.For, flushcheck.LongWait, w.Up)
	}
	closeDev := dev.Close
	if res.cm != nil {
		po.Connector, closeDev = res.cm.conn, res.cm.close
	}
	po.OnResult = func(r flushcheck.Result) {
		// Interrupted: what did not run is not reported.
		if each != nil && ctx.Err() == nil {
			each(res, r)
		}
	}
	res.results = flushcheck.Run(ctx, dev, po)
	if flushcheck.Count(res.results).Hung == 0 {
		if err := closeDev(); err != nil {
			return nil, withExitCode(exitError, fmt.Errorf("check: closing %s: %w", res.device, err))
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("check: %w", err)
	}
	return res, nil
}

// openCheckDevice opens the device --device names; without one, the first
// device libibverbs lists, or the soft device when there is none, when the
// build has no libibverbs, or when soft quirks were asked for.
func openCheckDevice(o *checkOptions) (ibv.Context, *checkResult, error) {
	c := deviceChoice{name: o.device, soft: soft.Config{Quirks: o.quirks.quirks}}
	if len(o.quirks.names) > 0 {
		c.softOnly = []string{"--soft-quirk"}
	}
	dev, err := openDevice(c)
	if err != nil {
		return nil, nil, err
	}
	res := &checkResult{device: dev.Name(), soft: dev.soft != nil, note: dev.note, quirks: o.quirks.names, transport: dev.Info().Transport}
	if dev.soft != nil {
		// The soft device's retry and RNR timers run on its fabric's
		// clock: waits on it take no real time.
		res.clock = dev.soft.Fabric()
	}
	if !o.cm && !o.cmAddr.IsValid() && !rcsetup.NeedsCM(dev) {
		return dev.Context, res, nil
	}
	if dev.soft != nil {
		if res.cm, err = softCM(dev); err != nil {
			return nil, nil, errors.Join(err, dev.Close())
		}
		return dev.Context, res, nil
	}
	// librdmacm opens the device itself: the probes run on its context.
	if err := dev.Close(); err != nil {
		return nil, nil, fmt.Errorf("closing %s: %w", res.device, err)
	}
	if res.cm, err = verbsCM(context.Background(), res.device, o.cmAddr); err != nil {
		return nil, nil, err
	}
	return res.cm.conn.Context(), res, nil
}

// checkVerdict turns the results into the exit status: a hang first, then
// errors, then deviations, each counted among the probes run.
func checkVerdict(results []flushcheck.Result) error {
	c := flushcheck.Count(results)
	ran := len(results) - c.Skipped - c.NotRun
	switch {
	case c.Hung > 0:
		i := slices.IndexFunc(results, func(r flushcheck.Result) bool { return r.Outcome == flushcheck.Hung })
		return withExitCode(exitHung, fmt.Errorf("%s hung: %s; %s not run", results[i].Name, results[i].Observed, plural(c.NotRun, "probe")))
	case c.Errors > 0:
		return withExitCode(exitError, fmt.Errorf("%d of %s could not run to a verdict", c.Errors, plural(ran, "probe")))
	case c.Deviations > 0:
		return withExitCode(exitFindings, fmt.Errorf("%d of %s found the device deviating", c.Deviations, plural(ran, "probe")))
	}
	return nil
}

// connection says how the probes' QPs are connected: "by hand" or
// "through the RDMA CM on ADDR:PORT".
func (r *checkResult) connection() string {
	if r.cm == nil {
		return "by hand"
	}
	return "through the RDMA CM on " + r.cm.conn.Addr().String()
}

func (r *checkResult) header() string {
	var b strings.Builder
	fmt.Fprintf(&b, "device %s", r.device)
	if r.soft {
		b.WriteString(" (the built-in soft device")
		if r.note != "" {
			b.WriteString(": " + r.note)
		}
		b.WriteString(")")
		fmt.Fprintf(&b, "; soft quirks: %s", quirkList(r.quirks))
	}
	if r.transport != ibv.TransportIB || r.cm != nil {
		fmt.Fprintf(&b, "; transport %s, QPs connected %s", r.transport, r.connection())
	}
	fmt.Fprintf(&b, "; timeout %v per wait, %v per verbs call", r.opts.timeout, r.opts.callTimeout)
	if sel := r.opts.selection(); sel != "" {
		b.WriteString("; " + sel)
	}
	return b.String()
}

// probeWidth is the width of the probe column: the longest probe name.
var probeWidth = func() int {
	n := len("probe")
	for _, p := range flushcheck.Probes() {
		n = max(n, len(p.Name))
	}
	return n
}()

// formatHead prints the header and the table's column names, before any
// probe has run.
func (r *checkResult) formatHead(w io.Writer) {
	fmt.Fprintln(w, r.header())
	fmt.Fprintf(w, "%-*s  %-*s  %9s  %s\n", probeWidth, "probe", r.outcomeWidth(), "outcome", "time", "observed")
}

// outcomeWidth is the width of the outcome column: "deviation", or
// "not-applicable" where a probe may be (iWARP, the RDMA CM).
func (r *checkResult) outcomeWidth() int {
	if r.transport == ibv.TransportIWARP || r.cm != nil {
		return len(flushcheck.NotApplicable.String())
	}
	return len(flushcheck.Deviation.String())
}

// formatProbe prints one probe's line of the table.
func (r *checkResult) formatProbe(w io.Writer, res flushcheck.Result) {
	fmt.Fprintf(w, "%-*s  %-*s  %9v  %s\n", probeWidth, res.Name, r.outcomeWidth(), res.Outcome, roundProbe(res.Duration), res.Observed)
}

// roundProbe rounds a probe's duration for the table.
func roundProbe(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(10 * time.Microsecond)
}

// formatTail prints the summary, the rules deviated from (every rule with
// details), the probe that hung, those not run or skipped, and the drain
// settings.
func (r *checkResult) formatTail(w io.Writer, details bool) error {
	c := flushcheck.Count(r.results)
	fmt.Fprintf(w, "%s: %d pass, %s, %s", plural(len(r.results), "probe"), c.Pass, plural(c.Deviations, "deviation"), plural(c.Errors, "error"))
	for _, n := range []struct {
		n    int
		what string
	}{{c.NotApplicable, "not applicable"}, {c.Hung, "hung"}, {c.NotRun, "not run"}, {c.Skipped, "skipped"}} {
		if n.n > 0 {
			fmt.Fprintf(w, ", %d %s", n.n, n.what)
		}
	}
	fmt.Fprintln(w)
	var hung string
	var notRun, skipped, na []string
	for _, res := range r.results {
		switch {
		case res.Outcome == flushcheck.Deviation:
			fmt.Fprintf(w, "  %s deviates from %s\n", res.Name, res.Rule)
		case res.Outcome == flushcheck.Error:
			fmt.Fprintf(w, "  %s could not check %s\n", res.Name, res.Rule)
		case res.Outcome == flushcheck.Hung:
			hung = res.Name
			fmt.Fprintf(w, "  %s hung: %s\n", res.Name, res.Observed)
		case res.Outcome == flushcheck.NotRun:
			notRun = append(notRun, res.Name)
		case res.Outcome == flushcheck.Skipped:
			skipped = append(skipped, res.Name)
		case res.Outcome == flushcheck.NotApplicable:
			na = append(na, res.Name)
		case details:
			fmt.Fprintf(w, "  %s checks %s\n", res.Name, res.Rule)
		}
	}
	if len(notRun) > 0 {
		fmt.Fprintf(w, "  not run because %s hung: %s\n", hung, strings.Join(notRun, ", "))
	}
	if len(skipped) > 0 {
		fmt.Fprintf(w, "  skipped (--run, --skip): %s\n", strings.Join(skipped, ", "))
	}
	if len(na) > 0 {
		fmt.Fprintf(w, "  not applicable (%s transport, QPs connected %s), each line says why: %s\n", r.transport, r.connection(), strings.Join(na, ", "))
	}
	fmt.Fprintf(w, "drain settings for %s (flushcheck.Settings):\n", r.device)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, s := range flushcheck.Settings(r.results).Settings {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", s.Name, s.Value, s.Reason)
	}
	return tw.Flush()
}

// checkProbeJSON is one probe in -j output.
type checkProbeJSON struct {
	Name       string             `json:"name"`
	Rule       string             `json:"rule"`
	Outcome    flushcheck.Outcome `json:"outcome"`
	Observed   string             `json:"observed"`
	DurationNS int64              `json:"duration_ns"`
}

// checkJSON is the -j output; ifname is the RDMA device's name, as in
// iproute2's rdma tool.
type checkJSON struct {
	Device string   `json:"ifname"`
	Soft   bool     `json:"soft"`
	Note   string   `json:"note,omitempty"`
	Quirks []string `json:"soft_quirks"`
	// Transport is the device's, as ibv_devinfo prints it ("iWARP");
	// Connection how the probes' QPs were connected: "by hand" or
	// "rdma_cm", on CMAddr.
	Transport     string `json:"transport"`
	Connection    string `json:"connection"`
	CMAddr        string `json:"cm_addr,omitempty"`
	TimeoutNS     int64  `json:"timeout_ns"`
	CallTimeoutNS int64  `json:"call_timeout_ns"`
	// Run and Skip are --run and --skip, "" when not given.
	Run        string           `json:"run"`
	Skip       string           `json:"skip"`
	Probes     []checkProbeJSON `json:"probes"`
	Pass       int              `json:"pass"`
	Deviations int              `json:"deviations"`
	Errors     int              `json:"errors"`
	Hung       int              `json:"hung"`
	NotRun     int              `json:"not_run"`
	Skipped    int              `json:"skipped"`
	// NotApplicable counts the probes whose rule the device's transport
	// does not have.
	NotApplicable int `json:"not_applicable"`
	// DrainOptions are the drain.Options the findings imply, Settings
	// each choice with its reason.
	DrainOptions drainOptionsJSON `json:"drain_options"`
	Settings     []settingJSON    `json:"settings"`
}

// drainOptionsJSON is the part of drain.Options that flushcheck.Settings
// chooses.
type drainOptionsJSON struct {
	MaxBatch         int          `json:"max_batch"`
	Policy           drain.Policy `json:"policy"`
	LastWQETimeoutNS int64        `json:"last_wqe_timeout_ns"`
	DrainTimeoutNS   int64        `json:"drain_timeout_ns"`
	ViaRTS           bool         `json:"via_rts"`
	Headroom         int          `json:"headroom"`
	// CountRecvs: add QPs with their own receive queue with
	// drain.AddOptions.CountRecvs (flushcheck.Recommendation).
	CountRecvs bool `json:"count_recvs"`
	// CountSends: add QPs with drain.AddOptions.CountSends.
	CountSends bool `json:"count_sends"`
}

type settingJSON struct {
	Name   string `json:"name"`
	Value  string `json:"value"`
	Reason string `json:"reason"`
}

func (r *checkResult) jsonView() checkJSON {
	out := checkJSON{Device: r.device, Soft: r.soft, Note: r.note, Quirks: r.quirks, TimeoutNS: r.opts.timeout.Nanoseconds(),
		CallTimeoutNS: r.opts.callTimeout.Nanoseconds(), Probes: []checkProbeJSON{}, Transport: r.transport.String(), Connection: "by hand"}
	if r.cm != nil {
		out.Connection, out.CMAddr = "rdma_cm", r.cm.conn.Addr().String()
	}
	if r.opts.run != nil {
		out.Run = r.opts.run.String()
	}
	if r.opts.skip != nil {
		out.Skip = r.opts.skip.String()
	}
	if out.Quirks == nil {
		out.Quirks = []string{}
	}
	for _, res := range r.results {
		out.Probes = append(out.Probes, checkProbeJSON{Name: res.Name, Rule: res.Rule, Outcome: res.Outcome,
			Observed: res.Observed, DurationNS: res.Duration.Nanoseconds()})
	}
	c := flushcheck.Count(r.results)
	out.Pass, out.Deviations, out.Errors, out.Hung, out.NotRun, out.Skipped, out.NotApplicable = c.Pass, c.Deviations, c.Errors, c.Hung, c.NotRun, c.Skipped, c.NotApplicable
	rec := flushcheck.Settings(r.results)
	do := rec.Options
	out.DrainOptions = drainOptionsJSON{MaxBatch: do.MaxBatch, Policy: do.Policy, LastWQETimeoutNS: do.LastWQETimeout.Nanoseconds(),
		DrainTimeoutNS: do.DrainTimeout.Nanoseconds(), ViaRTS: do.ViaRTS, Headroom: do.Headroom, CountRecvs: rec.CountRecvs,
		CountSends: rec.CountSends}
	out.Settings = []settingJSON{}
	for _, s := range rec.Settings {
		out.Settings = append(out.Settings, settingJSON(s))
	}
	return out
}

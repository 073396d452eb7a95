package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/qpdrain/qpdrain/flushcheck"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/soft"
)

func init() { subcommands = append(subcommands, newCheckCmd) }

// softDeviceName selects the built-in soft device with --device.
const softDeviceName = "soft"

// checkOptions are the flags of "qpdrain check".
type checkOptions struct {
	device  string
	quirks  []string
	timeout time.Duration
}

func newCheckCmd(opts *globalOptions) *cobra.Command {
	o := &checkOptions{}
	var names []string
	for _, p := range flushcheck.Probes() {
		names = append(names, p.Name)
	}
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Probe whether an RDMA device flushes the way drains need",
		Long: "Run the provider flush check on one RDMA device: each probe sets up its own RC QPs (loopback\n" +
			"on the device), drives them into ERROR and checks one rule of the specification: " + strings.Join(names, ", ") + ".\n" +
			"Without --device it checks the first device libibverbs lists, or the built-in soft device when\n" +
			"there is none (and says so). --soft-quirk switches on a provider bug of the soft device, to see\n" +
			"what the check reports for it; quirks: " + strings.Join(simQuirkNames(), ", ") + ".\n" +
			"Exit status 0 when every probe passes, 1 when the device deviates, 2 when a probe could not run.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
			defer stop()
			res, err := runCheck(ctx, o)
			if err != nil {
				return withExitCode(exitError, fmt.Errorf("check: %w", err))
			}
			opts.log.WithField("device", res.device).WithField("probes", len(res.results)).Debug("flush check ran")
			if opts.json {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				enc.SetEscapeHTML(false) // observations contain "->"
				err = enc.Encode(res.jsonView())
			} else {
				err = res.format(cmd.OutOrStdout(), opts.details)
			}
			if err != nil {
				return withExitCode(exitError, err)
			}
			return checkVerdict(res.results)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.device, "device", "", `RDMA device to check (default: the first one libibverbs lists, else "soft", the built-in soft device)`)
	f.StringSliceVar(&o.quirks, "soft-quirk", nil, "provider quirk of the soft device (repeatable): "+strings.Join(simQuirkNames(), ", "))
	f.DurationVar(&o.timeout, "timeout", flushcheck.DefaultTimeout, "how long each probe waits for a completion or event the specification says must come")
	return cmd
}

// checkResult is what "qpdrain check" found on one device.
type checkResult struct {
	device  string
	soft    bool
	note    string // why the soft device was chosen, if it was not asked for
	quirks  []string
	timeout time.Duration
	results []flushcheck.Result
}

// runCheck opens the device, runs every probe and closes the device.
func runCheck(ctx context.Context, o *checkOptions) (res *checkResult, err error) {
	if o.timeout <= 0 {
		return nil, errors.New("--timeout must be positive")
	}
	quirks, err := parseQuirks(o.quirks)
	if err != nil {
		return nil, err
	}
	dev, res, err := openCheckDevice(o, quirks)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := dev.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("closing %s: %w", res.device, cerr)
		}
	}()
	res.timeout = o.timeout
	res.results = flushcheck.Run(ctx, dev, flushcheck.Options{
		Timeout: o.timeout,
		Quiet:   min(flushcheck.DefaultQuiet, o.timeout/4),
	})
	return res, nil
}

// openCheckDevice opens the device --device names; without one, the first
// device libibverbs lists, or the soft device when there is none, when the
// build has no libibverbs, or when soft quirks were asked for.
func openCheckDevice(o *checkOptions, quirks soft.Quirks) (ibv.Context, *checkResult, error) {
	res := &checkResult{device: o.device, quirks: o.quirks}
	name := o.device
	if name == "" && len(o.quirks) > 0 {
		name, res.note = softDeviceName, "--soft-quirk given"
	}
	if name == "" {
		infos, err := ibv.Devices()
		switch {
		case errors.Is(err, ibv.ErrNotSupported):
			name, res.note = softDeviceName, noLibibverbs()
		case errors.Is(err, ibv.ErrNoDevice) || err == nil && len(infos) == 0:
			name, res.note = softDeviceName, "no RDMA device on this machine"
		case err != nil:
			return nil, nil, err
		default:
			name = infos[0].Name
		}
	}
	if name != softDeviceName {
		if len(o.quirks) > 0 {
			return nil, nil, fmt.Errorf("--soft-quirk applies to the soft device only, not %s", name)
		}
		dev, err := ibv.Open(name)
		if err != nil {
			return nil, nil, err
		}
		res.device = dev.Name()
		return dev, res, nil
	}
	dev, err := soft.Open(soft.Config{Quirks: quirks})
	if err != nil {
		return nil, nil, fmt.Errorf("opening the soft device: %w", err)
	}
	res.device, res.soft = dev.Name(), true
	return dev, res, nil
}

// checkVerdict turns the results into the exit status: errors first, then
// deviations.
func checkVerdict(results []flushcheck.Result) error {
	_, deviations, errs := flushcheck.Counts(results)
	switch {
	case errs > 0:
		return withExitCode(exitError, fmt.Errorf("%d of %d probes could not run to a verdict", errs, len(results)))
	case deviations > 0:
		return withExitCode(exitFindings, fmt.Errorf("%d of %d probes found the device deviating", deviations, len(results)))
	}
	return nil
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
		quirks := "none"
		if len(r.quirks) > 0 {
			quirks = strings.Join(r.quirks, ", ")
		}
		fmt.Fprintf(&b, "; soft quirks: %s", quirks)
	}
	fmt.Fprintf(&b, "; timeout %v per wait", r.timeout)
	return b.String()
}

func (r *checkResult) format(w io.Writer, details bool) error {
	fmt.Fprintln(w, r.header())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "probe\toutcome\ttime\tobserved")
	for _, res := range r.results {
		fmt.Fprintf(tw, "%s\t%s\t%v\t%s\n", res.Name, res.Outcome, res.Duration.Round(time.Microsecond), res.Observed)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	pass, deviations, errs := flushcheck.Counts(r.results)
	fmt.Fprintf(w, "%d probes: %d pass, %d deviations, %d errors\n", len(r.results), pass, deviations, errs)
	for _, res := range r.results {
		switch {
		case res.Outcome == flushcheck.Deviation:
			fmt.Fprintf(w, "  %s deviates from %s\n", res.Name, res.Rule)
		case res.Outcome == flushcheck.Error:
			fmt.Fprintf(w, "  %s could not check %s\n", res.Name, res.Rule)
		case details:
			fmt.Fprintf(w, "  %s checks %s\n", res.Name, res.Rule)
		}
	}
	return nil
}

// checkProbeJSON is one probe in -j output.
type checkProbeJSON struct {
	Name       string `json:"name"`
	Rule       string `json:"rule"`
	Outcome    string `json:"outcome"`
	Observed   string `json:"observed"`
	DurationUS int64  `json:"duration_us"`
}

// checkJSON is the -j output; ifname is the RDMA device's name, as in
// iproute2's rdma tool.
type checkJSON struct {
	Device     string           `json:"ifname"`
	Soft       bool             `json:"soft"`
	Note       string           `json:"note,omitempty"`
	Quirks     []string         `json:"soft_quirks"`
	TimeoutMS  int64            `json:"timeout_ms"`
	Probes     []checkProbeJSON `json:"probes"`
	Pass       int              `json:"pass"`
	Deviations int              `json:"deviations"`
	Errors     int              `json:"errors"`
}

func (r *checkResult) jsonView() checkJSON {
	out := checkJSON{Device: r.device, Soft: r.soft, Note: r.note, Quirks: r.quirks, TimeoutMS: r.timeout.Milliseconds(),
		Probes: []checkProbeJSON{}}
	if out.Quirks == nil {
		out.Quirks = []string{}
	}
	for _, res := range r.results {
		out.Probes = append(out.Probes, checkProbeJSON{Name: res.Name, Rule: res.Rule, Outcome: res.Outcome.String(),
			Observed: res.Observed, DurationUS: res.Duration.Microseconds()})
	}
	out.Pass, out.Deviations, out.Errors = flushcheck.Counts(r.results)
	return out
}

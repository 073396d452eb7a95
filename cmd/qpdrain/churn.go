package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/ipoibcm"
	"github.com/qpdrain/qpdrain/ipoibcm/churn"
	"github.com/qpdrain/qpdrain/ipoibcm/churn/churnplot"
	"github.com/qpdrain/qpdrain/soft"
	"github.com/qpdrain/qpdrain/teardown"
)

func init() { subcommands = append(subcommands, newChurnCmd) }

// churnOptions are the flags of "qpdrain churn".
type churnOptions struct {
	device       string
	quirks       softQuirks
	maxQP        int
	schedule     uint64
	seed         uint64
	events       int
	policy       ipoibcm.Policy
	quarantine   bool
	noSRQ        bool
	recvQueue    int
	maxNonSRQ    int
	update       time.Duration
	timeout      time.Duration
	delay        time.Duration
	drainTimeout time.Duration
	connectRate  float64
	sendRate     float64
	lifetime     time.Duration
	vanish       float64
	samples      int
	rows         int
	plot         string
	plotUntil    time.Duration
	realTime     bool
}

func newChurnCmd(opts *globalOptions) *cobra.Command {
	o := &churnOptions{}
	cmd := &cobra.Command{
		Use:   "churn",
		Short: "Simulate IPoIB connected-mode receive-side connection churn and show where its QPs go",
		Long: "Run the IPoIB-CM receive lifecycle (ipoib_cm.c's passive_ids, rx_error_list, rx_flush_list,\n" +
			"rx_drain_list, rx_reap_list) under seeded churn: peers connect, send, and disconnect with a DREQ or\n" +
			"vanish, on a soft device with any provider quirk (peers on a second soft device) over virtual\n" +
			"hours, or on a real device (--device) at its own pace. Prints the QPs on each list over time,\n" +
			"rejected connections, leaked and quarantined QPs, stale-detection and reap times; -j prints JSON,\n" +
			"--plot FILE.png|.svg draws the lists over time against the device's max_qp, and the connections\n" +
			"accepted and rejected (the QP axis follows --max-qp, the connection axis --events, the time axis\n" +
			"--plot-until: two runs of the same flags share them). --policy kernel is ipoib_cm.c's drain (no timeout\n" +
			"on the drain WR); bounded is qpdrain's. Quirks: " + strings.Join(soft.QuirkNames(), ", ") + ".\n" +
			"Exit status 1 when QPs leaked, a drain hung or a QP was destroyed too early.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			run, err := runChurn(cmd, o)
			if err != nil {
				return withExitCode(exitError, fmt.Errorf("churn: %w", err))
			}
			res := run.Result
			out := cmd.OutOrStdout()
			if o.plot != "" {
				// Before the report, so that a report always means a plot.
				po := churnplot.Options{MaxQP: run.MaxQP, Quirks: quirkList(run.Quirks), Until: o.plotUntil, SVG: fileKind(o.plot, ".svg") != ""}
				if err := writeFileAtomic(o.plot, func(w io.Writer) error { return churnplot.Write(w, res, po) }); err != nil {
					return withExitCode(exitError, fmt.Errorf("churn: --plot: %w", err))
				}
			}
			if opts.json {
				err = printJSON(out, run)
			} else {
				fmt.Fprintf(out, "device %s, max_qp %d, quirks: %s\n", run.Device, run.MaxQP, quirkList(o.quirks.names))
				err = res.WriteText(out, o.rows, true)
				if err == nil && o.plot != "" {
					_, err = fmt.Fprintf(out, "plot: %s%s\n", o.plot, plotCut(res, o.plotUntil))
				}
			}
			if err != nil {
				return withExitCode(exitError, err)
			}
			if res.Leaked > 0 || res.HungDrains > 0 || res.LateWCs > 0 {
				return withExitCode(exitFindings, fmt.Errorf("%s leaked, %d behind a hung drain, %d destroyed too early", plural(res.Leaked, "QP"), res.HungDrains, res.LateWCs))
			}
			return nil
		},
	}
	f := cmd.Flags()
	stringFlag(f, &o.device, "device", softDeviceName, "device: soft (the built-in soft device, peers on a second one) or a libibverbs device, peers in loopback", nonEmpty)
	quirkFlag(f, &o.quirks, "quirk")
	f.Uint64Var(&o.schedule, "schedule-seed", 0, "make the soft device adversarial with this schedule seed (0: orderly)")
	intFlag(f, &o.maxQP, "max-qp", 0, "QPs the soft device creates at most (0: its default, 65536); past it connections are rejected", atLeast(0))
	f.Uint64Var(&o.seed, "seed", 1, "seed of the churn schedule")
	intFlag(f, &o.events, "events", churn.DefaultEvents, "churn events to run (connects, sends, disconnects, vanishes)", between(1, churn.MaxEvents))
	wordFlag(f, &o.policy, "policy", ipoibcm.Kernel, "drain policy: kernel (ipoib_cm.c) or bounded (qpdrain's)", parseText[ipoibcm.Policy])
	f.BoolVar(&o.quarantine, "quarantine", false, "bounded policy: keep stalled QPs in the quarantine instead of destroying them once the CQ is empty")
	f.BoolVar(&o.noSRQ, "no-srq", false, "give each connection its own receive ring, as on devices without SRQs")
	intFlag(f, &o.recvQueue, "recvq-size", 16, "receives in the SRQ, or per connection without one (ipoib_recvq_size)", atLeast(1))
	intFlag(f, &o.maxNonSRQ, "max-nonsrq-conn-qp", ipoibcm.DefaultMaxNonSRQConn, "connections at most without an SRQ (max_nonsrq_conn_qp)", between(1, ipoibcm.MaxNonSRQConnLimit))
	durationFlag(f, &o.update, "rx-update-time", ipoibcm.DefaultUpdateTime, "IPOIB_CM_RX_UPDATE_TIME: activity refreshes a connection at most this often", positive)
	durationFlag(f, &o.timeout, "rx-timeout", ipoibcm.DefaultTimeout, "IPOIB_CM_RX_TIMEOUT: idle this long, a connection is stale", positive)
	durationFlag(f, &o.delay, "rx-delay", ipoibcm.DefaultDelay, "IPOIB_CM_RX_DELAY: the stale task runs this often", positive)
	durationFlag(f, &o.drainTimeout, "drain-timeout", 5*time.Second, "bounded policy: wait for Last WQE Reached and for each drain WR", positive)
	floatFlag(f, &o.connectRate, "connect-rate", churn.DefaultConnectRate, "connection requests per second", positiveFloat)
	floatFlag(f, &o.sendRate, "send-rate", churn.DefaultSendRate, "messages per second per connection", positiveFloat)
	durationFlag(f, &o.lifetime, "lifetime", churn.DefaultLifetime, "mean connection lifetime", positive)
	floatFlag(f, &o.vanish, "vanish", churn.DefaultVanishFraction, "share of peers that vanish without a DREQ (0: none, to 1: all)", fraction(false))
	intFlag(f, &o.samples, "samples", churn.DefaultSamples, "samples of the lists over the run", between(1, churn.MaxEvents))
	intFlag(f, &o.rows, "rows", 24, "rows of the text table (0: every sample)", atLeast(0))
	stringFlag(f, &o.plot, "plot", "", "write a plot of the lists over time to this .png or .svg file (written whole or not at all)", outputFile(".png", ".svg"))
	durationFlag(f, &o.plotUntil, "plot-until", 0, "end the plot's time axis here (0: at the run's end), to draw two runs on the same axes", atLeastDuration(0))
	f.BoolVar(&o.realTime, "real-time", false, "run the schedule on the real clock (always on a real device)")
	return cmd
}

// churnRun is one run with the inputs that shaped it, as -j prints it:
// the churn.Result's keys, then the device's.
type churnRun struct {
	*churn.Result
	Device       string   `json:"ifname"`
	MaxQP        int      `json:"max_qp"`
	Quirks       []string `json:"soft_quirks"`
	ScheduleSeed uint64   `json:"schedule_seed"`
	Events       int      `json:"events_asked"`
}

// checkChurnLimits refuses the queue sizes the device cannot hold, naming
// the flag, before any QP or CQ is created.
func checkChurnLimits(o *churnOptions, mc ipoibcm.Config, attr ibv.DeviceAttr) error {
	ring, limit, name := attr.MaxSRQWR, "max_srq_wr", "the SRQ"
	if o.noSRQ {
		ring, limit, name = attr.MaxQPWR, "max_qp_wr", "each connection's receive queue"
	}
	switch {
	case o.recvQueue > ring:
		return withExitCode(exitError, fmt.Errorf("--recvq-size %d: %s holds at most %d receives on %s (%s)", o.recvQueue, name, ring, o.device, limit))
	case mc.CQEntries() > attr.MaxCQE:
		return withExitCode(exitError, fmt.Errorf("--recvq-size %d: needs a CQ of %d entries, %s takes at most %d (max_cqe)", o.recvQueue, mc.CQEntries(), o.device, attr.MaxCQE))
	}
	return nil
}

// softOnly are the flags given that only the soft device takes (a value
// other than their default).
func (o *churnOptions) softOnly() []string {
	var given []string
	for _, f := range []struct {
		name string
		set  bool
	}{{"--quirk", len(o.quirks.names) > 0}, {"--max-qp", o.maxQP != 0}, {"--schedule-seed", o.schedule != 0}} {
		if f.set {
			given = append(given, f.name)
		}
	}
	return given
}

// plotCut says when --plot-until cut the run's end off the plot.
func plotCut(res *churn.Result, until time.Duration) string {
	if n := len(res.Samples); until > 0 && n > 0 && res.Samples[n-1].At > until {
		return fmt.Sprintf(" (its time axis ends at --plot-until %v; the run went on to %v)", until, res.Samples[n-1].At.Round(time.Second))
	}
	return ""
}

func runChurn(cmd *cobra.Command, o *churnOptions) (run *churnRun, err error) {
	cfg := churn.Config{Seed: o.seed, Events: o.events, ConnectRate: o.connectRate, SendRate: o.sendRate,
		Lifetime: o.lifetime, VanishFraction: o.vanish, Samples: o.samples, RealTime: o.realTime,
		Manager: ipoibcm.Config{Policy: o.policy, QuarantinePolicy: o.quarantine, NoSRQ: o.noSRQ,
			RecvQueueSize: o.recvQueue, MaxNonSRQConn: o.maxNonSRQ,
			UpdateTime: o.update, Timeout: o.timeout, Delay: o.delay}}
	cfg.Manager.Drain.LastWQETimeout, cfg.Manager.Drain.DrainTimeout = o.drainTimeout, o.drainTimeout
	stderr := cmd.ErrOrStderr()
	cfg.Progress = func(done, total int) {
		// Long runs say how far they are, every tenth, on stderr.
		if total >= 50000 && done%max(1, total/10) == 0 {
			fmt.Fprintf(stderr, "churn: %d of %d events\n", done, total)
		}
	}
	var closers teardown.List
	defer func() {
		if cerr := closers.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	run = &churnRun{Device: o.device, Quirks: o.quirks.names, ScheduleSeed: o.schedule, Events: o.events}
	if run.Quirks == nil {
		run.Quirks = []string{}
	}
	dev, err := openDevice(deviceChoice{name: o.device, softOnly: o.softOnly(),
		soft: soft.Config{Name: softDefaultName, Quirks: o.quirks.quirks, Limits: soft.Limits{MaxQP: o.maxQP}, Schedule: soft.Schedule{Seed: o.schedule}}})
	if err != nil {
		return nil, err
	}
	closers.Add(dev)
	cfg.Device = dev.Context
	if dev.soft != nil {
		peers, err := soft.Open(soft.Config{Fabric: dev.soft.Fabric(), Name: "soft1"})
		if err != nil {
			return nil, fmt.Errorf("opening the peers' soft device: %w", err)
		}
		closers.Add(peers)
		cfg.PeerDevice, cfg.DeviceClock = peers, dev.soft.Fabric()
	} else {
		cfg.RealTime = true
	}
	// The limit the story is about, known before any QP is created.
	attr, err := cfg.Device.QueryDevice()
	if err != nil {
		return nil, fmt.Errorf("querying %s: %w", o.device, err)
	}
	run.Device, run.MaxQP = cfg.Device.Name(), attr.MaxQP
	if err := checkChurnLimits(o, cfg.Manager, attr); err != nil {
		return nil, err
	}
	run.Result, err = churn.Run(cmd.Context(), cfg)
	if err != nil {
		return nil, err
	}
	return run, nil
}

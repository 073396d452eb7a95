package flushcheck

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/qpdrain/qpdrain/clock"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/rcsetup"
)

// Outcome is a probe's verdict.
type Outcome uint8

// Outcomes.
const (
	// Pass: the device did what the rule says.
	Pass Outcome = iota
	// Deviation: the device did something else; Result.Observed says what.
	Deviation
	// Error: the probe could not reach a verdict (a verb failed, or the
	// context ended); Result.Err says why.
	Error
	// Hung: a verbs call of the probe did not return within
	// Options.CallTimeout; Result.Observed names the call. The device may
	// be wedged, so Run runs no probe after it.
	Hung
	// Skipped: Options.Run or Options.Skip left the probe out.
	Skipped
	// NotRun: an earlier probe hung, so Run did not run this one.
	NotRun
	// NotApplicable: the rule the probe checks does not exist on the
	// device's transport, or the probe's setup cannot be made on it (an
	// iWARP device has no RNR, no retry_cnt of its own); Result.Observed
	// says why, with the source. It is a finding about the transport,
	// neither a pass nor a failure to check.
	NotApplicable
)

var outcomeNames = [...]string{"pass", "deviation", "error", "hung", "skipped", "not-run", "not-applicable"}

// String names the outcome ("pass", "deviation", "error", "hung",
// "skipped", "not-run", "not-applicable").
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// MarshalText encodes the outcome as its name, for JSON.
func (o Outcome) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// UnmarshalText decodes an outcome's name, so that JSON reads back; any
// other text is an error naming the outcomes.
func (o *Outcome) UnmarshalText(text []byte) error {
	for i, n := range outcomeNames {
		if string(text) == n {
			*o = Outcome(i)
			return nil
		}
	}
	return fmt.Errorf("unknown outcome %q, want pass, deviation, error, hung, skipped, not-run or not-applicable", text)
}

// verdict reports whether the probe ran to a verdict: passed or deviated.
func (o Outcome) verdict() bool { return o == Pass || o == Deviation }

// Result is what one probe found.
type Result struct {
	// Name is the probe's name ("recv-in-error").
	Name string
	// Rule is the specification rule the probe checks.
	Rule    string
	Outcome Outcome
	// Observed says what the device did, in words, with times.
	Observed string
	// Duration is how long the probe ran, setup and teardown included;
	// for Hung, until the check gave up on it.
	Duration time.Duration
	// Err is why the outcome is Error or Hung (wrapping ErrHung); nil
	// otherwise.
	Err error
}

// Default bounds. A healthy provider flushes in microseconds (rxe under
// qemu without KVM in milliseconds). No transport timer stands behind a
// flush or the async event of a state change: rxe raises them from the
// QP's tasks as soon as those run (rxe_qp.c, rxe_qp_error schedules them),
// so a wait for them bounds the machine's scheduling, not the device's
// protocol. The slowest such answer in the rxe records under qemu TCG
// came 18.8 ms after its cause (CQ_ERR of cq-overrun on 6.1): 2 s is a
// hundred times that and separates "slow" from "never". Waits behind a
// transport timer (a retry series, an RNR retry) add the timer's time.
const (
	// MinTimeout is the shortest Options.Timeout the probes accept:
	// several times the slowest answer a healthy device gives outside a
	// retry series (rxe under qemu flushes in milliseconds). Shorter,
	// slow answers would be reported as missing. A probe that waits out a
	// retry series (peer-gone, rnr-exhausted) allows one Timeout per
	// retry timer, and 2 s at the least.
	MinTimeout     = 100 * time.Millisecond
	DefaultTimeout = 2 * time.Second
	DefaultQuiet   = 500 * time.Millisecond
	DefaultPort    = 1
	// MinCallTimeout is the shortest Options.CallTimeout the probes
	// accept: far above the slowest verbs call seen (rxe under qemu TCG
	// destroyed a QP in 7.7 ms), so that a slow call is not taken for a
	// hung one.
	MinCallTimeout = time.Second
	// DefaultCallTimeout is generous: a call that has not returned after
	// it is stuck in the provider or the kernel.
	DefaultCallTimeout = 30 * time.Second
)

// Options configure the probes. The zero value is usable.
type Options struct {
	// Port is the device port the probes' QPs use (default 1).
	Port uint8
	// Connector, when not nil, connects the probes' QP pairs (an
	// *rcsetup.CM: through the RDMA CM, as applications connect, on the
	// CM's own context of the device, which must be the device Run is
	// given). Nil connects them by hand over the loopback route of Port
	// (rcsetup.Loopback), which an iWARP device refuses: on one (the
	// device's transport is IBV_TRANSPORT_IWARP, rcsetup.NeedsCM) the
	// probes that need a connected pair report Error without a
	// Connector.
	Connector rcsetup.Connector
	// Timeout bounds each wait for a completion or event the rule says
	// must come (default DefaultTimeout, at least MinTimeout: a probe run
	// with less reports Error), once per retry timer for a send a retry
	// series fails; when it passes, the probe reports a deviation.
	Timeout time.Duration
	// Quiet is how long a probe watches for something the rule says must
	// not happen, such as a second Last WQE Reached (default DefaultQuiet,
	// or a quarter of Timeout when that is shorter, so that a short
	// Timeout shortens the whole probe).
	Quiet time.Duration
	// CallTimeout bounds each verbs call a probe makes (default
	// DefaultCallTimeout, at least MinCallTimeout). A call stuck in the
	// kernel cannot be cancelled, so a probe runs in a goroutine of its
	// own and the check stops waiting for it: the outcome is Hung, naming
	// the call. A probe that has not returned CallTimeout after its
	// context ended is Hung too, blocked where it records no call.
	CallTimeout time.Duration
	// Run and Skip select the probes Run runs, by name, as go test's -run
	// and -skip do: a probe runs when Run (if not nil) matches its name
	// and Skip (if not nil) does not. The others are reported Skipped.
	// Probe.Run ignores them.
	Run, Skip *regexp.Regexp
	// Clock is the time every wait of a probe runs on, Timeout and Quiet
	// included (default clock.Real): the device's own clock. A soft
	// device's fabric (soft.Fabric, not in real time) is one: the probes
	// then let its time pass in steps, firing its retry and RNR timers at
	// their times, so that a wait for what a healthy device never does
	// takes no real time and the check of a soft device takes about a
	// second. CallTimeout and Result.Duration stay wall time.
	Clock clock.Clock
	// OnResult, if not nil, is called with each result as Run produces it,
	// in the order Run runs the probes (Skipped and NotRun ones too), so
	// that a caller can show progress; it runs on Run's goroutine.
	OnResult func(Result)
	// OnWait, if not nil, is called once for each wait of a probe on the
	// wall clock that has lasted LongWait without its answer and may last
	// longer, so that a caller can show the check is not stuck. It runs on
	// the probe's goroutine, which Probe.Run waits for unless it gives the
	// probe up as Hung; a probe given up tells no wait begun after that.
	OnWait func(Wait)
}

// LongWait is how long a wait lasts before Options.OnWait hears of it.
const LongWait = time.Second

// Wait is a probe's wait that has lasted LongWait.
type Wait struct {
	// Probe is the probe's name.
	Probe string
	// For says what the probe waits for ("1 completion", "an async
	// event").
	For string
	// Up is the most the wait lasts: its deadline from its start.
	Up time.Duration
}

func (o Options) withDefaults() Options {
	if o.Port == 0 {
		o.Port = DefaultPort
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Quiet <= 0 {
		o.Quiet = min(DefaultQuiet, o.Timeout/4)
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = DefaultCallTimeout
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	return o
}

// skips says why o leaves the probe called name out of Run, or "" when Run
// runs it.
func (o Options) skips(name string) string {
	switch {
	case o.Run != nil && !o.Run.MatchString(name):
		return fmt.Sprintf("skipped: the run pattern %q does not match it", o.Run)
	case o.Skip != nil && o.Skip.MatchString(name):
		return fmt.Sprintf("skipped: the skip pattern %q matches it", o.Skip)
	}
	return ""
}

// Selected returns the probes Run runs with o (Options.Run, Options.Skip),
// in order.
func (o Options) Selected() []Probe {
	var out []Probe
	for _, p := range probes {
		if o.skips(p.Name) == "" {
			out = append(out, p)
		}
	}
	return out
}

// settle is how long a probe lets the device work after moving a QP to
// ERROR before it posts to it: a fifth of Quiet.
func (o Options) settle() time.Duration { return o.Quiet / 5 }

// budget bounds one probe as a whole: no probe waits more than four
// timeouts, two quiet periods and its retry series (milliseconds), so the
// budget only ends a probe that is itself stuck.
func (o Options) budget() time.Duration { return 4*o.Timeout + 2*o.Quiet + 10*time.Second }

// ErrTimeoutTooShort is the error of a probe run with an Options.Timeout
// below MinTimeout, or an Options.CallTimeout below MinCallTimeout.
var ErrTimeoutTooShort = errors.New("timeout too short to observe the device")

// ErrHung is wrapped by the error of a Hung result: a verbs call did not
// return within Options.CallTimeout.
var ErrHung = errors.New("did not return")

// Probe is one check of a device's error-path behaviour.
type Probe struct {
	// Name is short and stable, for tables and scripts.
	Name string
	// Rule is the specification rule the probe checks, with its source.
	Rule string
	// NotOnIWARP, when not empty, is why the probe does not apply to an
	// iWARP device, with its source: Run reports it NotApplicable there.
	NotOnIWARP string
	// NeedsManual, when not empty, is why the probe needs QPs connected
	// by hand: with a Connector that is not an rcsetup.Route (the RDMA
	// CM) it is NotApplicable, for that reason.
	NeedsManual string
	run         func(e *env) (verdict, error)
}

// notApplicable says why p does not apply to dev connected as o says, or
// "" when it does.
func (p Probe) notApplicable(dev ibv.Context, o Options) string {
	if p.NotOnIWARP != "" && rcsetup.NeedsCM(dev) {
		return "not applicable to iWARP: " + p.NotOnIWARP
	}
	if _, manual := o.Connector.(rcsetup.Route); p.NeedsManual != "" && o.Connector != nil && !manual {
		return "not applicable through the RDMA CM: " + p.NeedsManual
	}
	return ""
}

// verdict is what a probe that ran to the end concluded.
type verdict struct {
	ok       bool
	observed string
}

func pass(format string, args ...any) verdict {
	return verdict{ok: true, observed: fmt.Sprintf(format, args...)}
}

func deviation(format string, args ...any) verdict {
	return verdict{observed: fmt.Sprintf(format, args...)}
}

// Probes returns every probe, in the order Run runs them.
func Probes() []Probe { return slices.Clone(probes) }

// Lookup returns the probe called name.
func Lookup(name string) (Probe, bool) {
	for _, p := range probes {
		if p.Name == name {
			return p, true
		}
	}
	return Probe{}, false
}

// Run runs the probes o selects on dev, one after the other, and returns a
// result for every probe, in the order of Probes: those o leaves out are
// Skipped. It runs first the probes that end when the device answers, then
// those that watch a quiet period on any device (quietWatchers), so that
// Options.OnResult has most results early. A probe that errs does not stop
// the others; once ctx has ended the remaining probes report Error without
// running. A probe that hangs (Options.CallTimeout) stops the check: the
// device may be wedged, so the probes run after it are NotRun, and the hung
// probe's goroutine and objects are left behind (Probe.Run).
func Run(ctx context.Context, dev ibv.Context, o Options) []Result {
	out := make([]Result, len(probes))
	hung := ""
	for _, i := range runOrder {
		p := probes[i]
		r := Result{Name: p.Name, Rule: p.Rule}
		switch why := o.skips(p.Name); {
		case why != "":
			r.Outcome, r.Observed = Skipped, why
		case hung != "":
			r.Outcome, r.Observed = NotRun, fmt.Sprintf("not run: %s hung before it, and the device may be wedged", hung)
		default:
			r = p.Run(ctx, dev, o)
		}
		if r.Outcome == Hung {
			hung = p.Name
		}
		out[i] = r
		if o.OnResult != nil {
			o.OnResult(r)
		}
	}
	return out
}

// Run runs the probe on dev. Every object it creates is closed before it
// returns; a close that fails makes the outcome Error. A verbs call that
// does not return within Options.CallTimeout makes the outcome Hung, and
// Run returns without waiting for it: the probe's goroutine and the
// objects it created stay until the call returns, if it ever does, so the
// device cannot be closed meanwhile (and should not be used again).
func (p Probe) Run(ctx context.Context, dev ibv.Context, o Options) Result {
	o = o.withDefaults()
	res := Result{Name: p.Name, Rule: p.Rule}
	start := time.Now()
	fail := func(err error) Result {
		res.Outcome, res.Err, res.Observed = Error, err, err.Error()
		res.Duration = time.Since(start)
		return res
	}
	switch {
	case ctx == nil:
		return fail(errors.New("not run: nil context"))
	case dev == nil:
		return fail(errors.New("not run: no device"))
	case p.run == nil:
		return fail(fmt.Errorf("not run: unknown probe %q", p.Name))
	case ctx.Err() != nil:
		return fail(fmt.Errorf("not run: %w", context.Cause(ctx)))
	case o.Timeout < MinTimeout:
		return fail(fmt.Errorf("not run: timeout %v is below the minimum %v: %w", o.Timeout, MinTimeout, ErrTimeoutTooShort))
	case o.CallTimeout < MinCallTimeout:
		return fail(fmt.Errorf("not run: call timeout %v is below the minimum %v: %w", o.CallTimeout, MinCallTimeout, ErrTimeoutTooShort))
	}
	if why := p.notApplicable(dev, o); why != "" {
		res.Outcome, res.Observed, res.Duration = NotApplicable, why, time.Since(start)
		return res
	}
	// Cancelled on return: a probe given up as hung stops at its next wait
	// if its call ever returns.
	pctx, cancel := context.WithTimeoutCause(ctx, o.budget(), fmt.Errorf("probe %s exceeded its budget of %v", p.Name, o.budget()))
	defer cancel()
	e := newEnv(pctx, dev, o)
	e.name = p.Name
	ended := make(chan probeEnd, 1)
	go func() {
		v, err := p.run(e)
		if cerr := e.close(); cerr != nil && err == nil {
			err = cerr
		}
		ended <- probeEnd{v, err}
	}()
	end, err := e.await(ended)
	if err != nil {
		res = fail(err)
		res.Outcome, res.Observed = Hung, err.Error()+"; the device may be wedged: see the kernel log (dmesg)"
		return res
	}
	if end.err != nil {
		return fail(end.err)
	}
	res.Outcome = Pass
	if !end.v.ok {
		res.Outcome = Deviation
	}
	res.Observed = end.v.observed
	res.Duration = time.Since(start)
	return res
}

// quietWatchers are the probes that watch for something that must not
// happen for a quiet period (Options.Quiet) or more, even on a device that
// answers at once: a repeated event, a completion after a destroy or a
// RESET, an event too early.
var quietWatchers = []string{ProbeLastWQEReached, ProbeLastWQERepeat, ProbeCQOverrun, ProbeDestroyOutstanding, ProbeResetReuse, ProbeSQD}

// runOrder is the order Run runs the probes in, as indexes into probes:
// the quiet watchers last, each group in the order of probes.
var runOrder = func() []int {
	var first, last []int
	for i, p := range probes {
		if slices.Contains(quietWatchers, p.Name) {
			last = append(last, i)
		} else {
			first = append(first, i)
		}
	}
	return append(first, last...)
}()

// Tally is how many results have each outcome.
type Tally struct {
	Pass, Deviations, Errors, Hung, Skipped, NotRun, NotApplicable int
}

// Count returns how many results have each outcome; one that is no
// Outcome counts as an error.
func Count(results []Result) Tally {
	var t Tally
	for _, r := range results {
		switch r.Outcome {
		case Pass:
			t.Pass++
		case Deviation:
			t.Deviations++
		case Hung:
			t.Hung++
		case Skipped:
			t.Skipped++
		case NotRun:
			t.NotRun++
		case NotApplicable:
			t.NotApplicable++
		default:
			t.Errors++
		}
	}
	return t
}

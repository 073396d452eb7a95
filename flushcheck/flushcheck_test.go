package flushcheck

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/internal/testing/texttest"
	"github.com/qpdrain/qpdrain/soft"
)

// quick are bounds for the soft device, which answers at once: a missing
// completion or event is certain after a few milliseconds.
var quick = Options{Timeout: MinTimeout, Quiet: 20 * time.Millisecond}

// on returns o with the device's own clock when dev is a soft device: the
// probes then wait on its fabric's time, which passes at once.
func on(dev ibv.Context, o Options) Options {
	if d, ok := dev.(*soft.Device); ok {
		o.Clock = d.Fabric()
	}
	return o
}

// onRealTime puts a soft device's clock on real time, for tests of what
// the wall clock bounds (a hung verbs call).
func onRealTime(dev ibv.Context) {
	if d, ok := dev.(*soft.Device); ok {
		d.Fabric().SetRealTime(true)
	}
}

func openSoft(t *testing.T, q soft.Quirks) ibv.Context {
	t.Helper()
	dev, err := soft.Open(soft.Config{Quirks: q, Schedule: devtest.Schedule(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Fails with ErrBusy if a probe left an object open.
		if err := dev.Close(); err != nil {
			t.Errorf("closing the device after the probes: %v", err)
		}
	})
	return dev
}

func deviating(t *testing.T, results []Result) []string {
	t.Helper()
	var names []string
	for _, r := range results {
		switch r.Outcome {
		case Deviation:
			names = append(names, r.Name)
		case Error:
			t.Errorf("probe %s: error: %v", r.Name, r.Err)
		}
		if r.Name == "" || r.Rule == "" || r.Observed == "" || r.Duration <= 0 {
			t.Errorf("incomplete result %+v", r)
		}
	}
	return names
}

// scheduleMay are the probes an adversarial schedule of the soft device
// (devtest.Explore, soft:adversarial) may make deviate, and what they then
// observe: it interleaves the flushes of work queues sharing a CQ, as the
// specification allows.
var scheduleMay = map[string]string{
	"flush-order": "a barrier on one QP does not cover another's flushes here",
}

// allowed reports whether probe r may deviate on t's schedule without the
// quirks that make it, and fails t if its observation says otherwise.
func allowed(t *testing.T, r Result) bool {
	t.Helper()
	says, ok := scheduleMay[r.Name]
	if !ok || devtest.Schedule(t).Seed == 0 || r.Outcome != Deviation {
		return false
	}
	if !strings.Contains(r.Observed, says) {
		t.Errorf("%s observed %q on seed %d, want it to say %q", r.Name, r.Observed, devtest.Schedule(t).Seed, says)
	}
	return true
}

func TestSoftPasses(t *testing.T) {
	dev := openSoft(t, soft.Quirks{})
	results := Run(context.Background(), dev, on(dev, quick))
	if len(results) != len(probes) {
		t.Fatalf("%d results, want %d", len(results), len(probes))
	}
	for i, r := range results {
		t.Logf("%-22s %-9s %v: %s", r.Name, r.Outcome, r.Duration, r.Observed)
		if r.Name != probes[i].Name {
			t.Errorf("result %d is %s, want %s", i, r.Name, probes[i].Name)
		}
	}
	wantPasses(t, results)
}

// wantPasses fails t unless every probe passed, but for those t's schedule
// may make deviate (scheduleMay).
func wantPasses(t *testing.T, results []Result) {
	t.Helper()
	got := slices.DeleteFunc(deviating(t, results), func(name string) bool {
		r, _ := lookupResult(results, name)
		return allowed(t, r)
	})
	if len(got) > 0 {
		t.Errorf("deviations on the soft device without quirks: %v, want none", got)
	}
	if c := Count(results); c.Pass+c.Deviations != len(probes) || c.Deviations > len(scheduleMay) || c != (Tally{Pass: c.Pass, Deviations: c.Deviations}) {
		t.Errorf("Count = %+v; want %d passes", c, len(probes))
	}
}

// TestSoftQuirks: each provider quirk of the soft device shows in exactly
// the probes that depend on the behaviour it breaks.
func TestSoftQuirks(t *testing.T) {
	for _, tc := range []struct {
		name  string
		quirk soft.Quirks
		want  []string
		says  string // in what each deviating probe observed
		// mayPass are probes of want that an adversarial schedule may not
		// show deviating: the quirk makes the deviation possible, the
		// schedule's interleaving decides whether it shows.
		mayPass []string
	}{
		// The eHCA bug: the drain WR, and flush-order's barrier, is a send
		// posted in ERROR.
		{"SendInErrorNotFlushed", soft.Quirks{SendInErrorNotFlushed: true}, []string{"send-in-error", "flush-before-rts", "drain-wr", "flush-order"}, "never", nil},
		{"RecvInErrorNotFlushed", soft.Quirks{RecvInErrorNotFlushed: true}, []string{"recv-in-error"}, "never completed", nil},
		{"RecvInErrorFlushDeferred", soft.Quirks{RecvInErrorFlushDeferred: true}, []string{"recv-in-error"}, deferredFlush, nil},
		{"NoLastWQEReached", soft.Quirks{NoLastWQEReached: true}, []string{"last-wqe-reached", "last-wqe-repeat"}, "no Last WQE Reached", nil},
		{"LastWQEReachedTwice", soft.Quirks{LastWQEReachedTwice: true}, []string{"last-wqe-reached", "last-wqe-repeat"}, "Last WQE Reached", nil},
		{"LastWQEReachedAgain", soft.Quirks{LastWQEReachedAgain: true}, []string{"last-wqe-repeat"}, "again after a second modify to ERROR (1, ", nil},
		{"NoResponderErrorEvent", soft.Quirks{NoResponderErrorEvent: true}, []string{"responder-access-error"}, "responder: no async event", nil},
		{"DrainNeedsRTS", soft.Quirks{DrainNeedsRTS: true}, []string{"flush-before-rts"}, "never completed", nil},
		// hns: flushes come when the CQ is polled, so one QP's after
		// another's later completion, and Last WQE Reached with them.
		// flush-order shows it only when the later completion is polled
		// before the deferred flushes are generated, which an adversarial
		// schedule may order the other way (seeds 173, 175 and 238).
		{"FlushDeferred", soft.Quirks{FlushDeferred: true}, []string{"last-wqe-reached", "last-wqe-repeat", "flush-order"}, "", []string{"flush-order"}},
		// Passes: the rule asks only for CQ_ERR; the observation differs.
		{"CQOverrunKeepsQPs", soft.Quirks{CQOverrunKeepsQPs: true}, nil, "", nil},
		// rxe's SQD: the RNR retry rewinds the send, taken for drained.
		{"SQDrainedEarly", soft.Quirks{SQDrainedEarly: true}, []string{"sqd"}, "SQ_DRAINED already raised while a send was in progress", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := openSoft(t, tc.quirk)
			results := Run(context.Background(), dev, on(dev, quick))
			var want []string
			for _, r := range results {
				if r.Outcome != Pass {
					t.Logf("%s: %s: %s", r.Name, r.Outcome, r.Observed)
				}
				mayPass := devtest.Schedule(t).Seed != 0 && slices.Contains(tc.mayPass, r.Name) && r.Outcome == Pass
				if slices.Contains(tc.want, r.Name) && !mayPass {
					want = append(want, r.Name)
				}
				if r.Outcome == Deviation && slices.Contains(tc.want, r.Name) && !strings.Contains(r.Observed, tc.says) {
					t.Errorf("%s observed %q, want it to say %q", r.Name, r.Observed, tc.says)
				}
			}
			got := slices.DeleteFunc(deviating(t, results), func(name string) bool {
				r, _ := lookupResult(results, name)
				return !slices.Contains(want, name) && allowed(t, r)
			})
			if !slices.Equal(got, want) {
				t.Errorf("deviations %v, want %v", got, want)
			}
		})
	}
}

// CQOverrunKeepsQPs shows in what cq-overrun observes: a CQ_ERR per lost
// completion and the QP still in RTS, as on rxe.
func TestCQOverrunObserved(t *testing.T) {
	p, _ := Lookup("cq-overrun")
	for _, tc := range []struct {
		quirk soft.Quirks
		says  string
	}{
		{soft.Quirks{}, "events [CQ_ERR cq at +"},
		{soft.Quirks{CQOverrunKeepsQPs: true}, "QP RTS; 4 completions polled (4 SUCCESS), 2 lost"},
	} {
		dev := openSoft(t, tc.quirk)
		r := p.Run(context.Background(), dev, on(dev, quick))
		if r.Outcome != Pass || !strings.Contains(r.Observed, tc.says) {
			t.Errorf("cq-overrun with %+v: %s, %q; want pass saying %q", tc.quirk, r.Outcome, r.Observed, tc.says)
		}
	}
}

func TestObserved(t *testing.T) {
	dev := openSoft(t, soft.Quirks{NoLastWQEReached: true, NoResponderErrorEvent: true})
	for name, want := range map[string]string{
		"last-wqe-reached": "no Last WQE Reached within 100ms of ERROR",
		// Quiet, not Timeout: the requester's REM_ACCESS_ERR says the
		// responder found the violation already.
		"responder-access-error": "requester: REM_ACCESS_ERR; responder: no async event within 20ms, state ERR, 2 of 2 receives flushed",
		"recv-in-error":          "the receive posted in ERROR completed with WR_FLUSH_ERR ",
	} {
		p, ok := Lookup(name)
		if !ok {
			t.Fatalf("no probe %s", name)
		}
		r := p.Run(context.Background(), dev, on(dev, quick))
		if len(r.Observed) < len(want) || r.Observed[:len(want)] != want {
			t.Errorf("%s observed %q, want it to start with %q", name, r.Observed, want)
		}
	}
}

// A probe never runs past its context and reports that as an error, not a
// deviation; every object it created is closed.
func TestContextEnded(t *testing.T) {
	dev := openSoft(t, soft.Quirks{NoLastWQEReached: true})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, r := range Run(ctx, dev, on(dev, quick)) {
		if r.Outcome != Error || !errors.Is(r.Err, context.Canceled) {
			t.Errorf("%s with a cancelled context: %s, %v; want error wrapping context.Canceled", r.Name, r.Outcome, r.Err)
		}
	}
	p, _ := Lookup("last-wqe-reached")
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	r := p.Run(ctx, dev, Options{Timeout: time.Hour})
	if r.Outcome != Error || !errors.Is(r.Err, context.DeadlineExceeded) || r.Duration > 10*time.Second {
		t.Errorf("last-wqe-reached bounded by a 30ms context: %s after %v, %v; want an error wrapping DeadlineExceeded", r.Outcome, r.Duration, r.Err)
	}
}

func TestBadInput(t *testing.T) {
	if r := (Probe{Name: "nope"}).Run(context.Background(), openSoft(t, soft.Quirks{}), Options{}); r.Outcome != Error {
		t.Errorf("a probe without a body: %s, want error", r.Outcome)
	}
	p, _ := Lookup("drain-wr")
	if r := p.Run(context.Background(), nil, Options{}); r.Outcome != Error {
		t.Errorf("no device: %s, want error", r.Outcome)
	}
	var nilCtx context.Context // bad input the probe must survive
	if r := p.Run(nilCtx, openSoft(t, soft.Quirks{}), Options{}); r.Outcome != Error {
		t.Errorf("nil context: %s, want error", r.Outcome)
	}
	if r := p.Run(context.Background(), openSoft(t, soft.Quirks{}), Options{CallTimeout: MinCallTimeout - 1}); r.Outcome != Error || !errors.Is(r.Err, ErrTimeoutTooShort) {
		t.Errorf("call timeout below the minimum: %s, %v; want an error wrapping ErrTimeoutTooShort", r.Outcome, r.Err)
	}
	if _, ok := Lookup("nope"); ok {
		t.Error("Lookup found a probe that does not exist")
	}
	if s := Outcome(9).String(); s != "Outcome(9)" {
		t.Errorf("Outcome(9).String() = %q", s)
	}
}

func lookupResult(results []Result, name string) (Result, bool) {
	for _, r := range results {
		if r.Name == name {
			return r, true
		}
	}
	return Result{}, false
}

// An outcome marshals as its name (check -j prints it) and reads back from
// its JSON; a name that is no outcome is refused.
func TestOutcomeText(t *testing.T) {
	texttest.MarshalsAsString(t, Pass, Deviation, Error, Hung, Skipped, NotRun, Outcome(200))
	for _, o := range []Outcome{Pass, Deviation, Error, Hung, Skipped, NotRun} {
		b, err := json.Marshal(o)
		var back Outcome
		if err != nil || json.Unmarshal(b, &back) != nil || back != o {
			t.Errorf("%v: marshalled %s (%v), read back %v", o, b, err, back)
		}
	}
	var o Outcome
	if err := o.UnmarshalText([]byte("fine")); err == nil {
		t.Errorf("UnmarshalText(fine) = nil, want an error")
	}
}

// Options.Run and Options.Skip select probes as go test's -run and -skip
// do; the others are reported skipped, each saying which pattern left it
// out. OnResult sees every result in the order Run runs them: the probes
// that watch a quiet period last, so that the others' results come early;
// Run returns them in the order of Probes.
func TestSelect(t *testing.T) {
	o := quick
	o.Run = regexp.MustCompile("-in-error$")
	o.Skip = regexp.MustCompile("recv")
	if sel := o.Selected(); len(sel) != 1 || sel[0].Name != ProbeSendInError {
		t.Fatalf("Selected() = %v, want send-in-error alone", sel)
	}
	var seen []string
	o.OnResult = func(r Result) { seen = append(seen, r.Name) }
	dev := openSoft(t, soft.Quirks{})
	results := Run(context.Background(), dev, on(dev, o))
	for i, r := range results {
		var want string
		switch r.Name {
		case ProbeSendInError:
			if r.Outcome != Pass {
				t.Errorf("send-in-error: %s, want pass", r.Outcome)
			}
			continue
		case ProbeRecvInError:
			want = `skipped: the skip pattern "recv" matches it`
		default:
			want = `skipped: the run pattern "-in-error$" does not match it`
		}
		if r.Outcome != Skipped || r.Observed != want || r.Rule != probes[i].Rule || r.Duration != 0 {
			t.Errorf("%s: %s, %q; want skipped, %q", r.Name, r.Outcome, r.Observed, want)
		}
	}
	var first, last []string
	for _, name := range probeNames() {
		if slices.Contains(quietWatchers, name) {
			last = append(last, name)
		} else {
			first = append(first, name)
		}
	}
	if want := append(first, last...); !slices.Equal(seen, want) {
		t.Errorf("OnResult saw %v, want every probe, those watching a quiet period last: %v", seen, want)
	}
	for i, r := range results {
		if r.Name != probes[i].Name {
			t.Errorf("result %d is %s, want %s: Run returns the results in the order of Probes", i, r.Name, probes[i].Name)
		}
	}
	if c := Count(results); c != (Tally{Pass: 1, Skipped: len(probes) - 1}) {
		t.Errorf("Count = %+v", c)
	}
}

func probeNames() []string {
	var names []string
	for _, p := range probes {
		names = append(names, p.Name)
	}
	return names
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/flushcheck"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/soft"
)

func TestCheckSoft(t *testing.T) {
	for _, name := range []string{"soft", "soft0"} {
		out, err := runSub("check", "--device", name, "--timeout", "100ms", "-d")
		if code := exitCode(err); code != exitClean {
			t.Fatalf("qpdrain check --device %s: exit code %d (%v), want %d\n%s", name, code, err, exitClean, out)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if !strings.HasPrefix(lines[0], "device soft0 (the built-in soft device); soft quirks: none; timeout 100ms per wait") {
			t.Errorf("header %q", lines[0])
		}
		if !strings.HasPrefix(lines[1], "probe ") || !strings.Contains(lines[1], "outcome") || !strings.Contains(lines[1], "observed") {
			t.Errorf("table header %q", lines[1])
		}
		// The rows come as the probes end, in the order flushcheck.Run
		// runs them.
		rows := map[string][]string{}
		for _, l := range lines[2 : 2+len(flushcheck.Probes())] {
			if f := strings.Fields(l); len(f) > 0 {
				rows[f[0]] = f
			}
		}
		for _, p := range flushcheck.Probes() {
			want := "pass"
			if f := rows[p.Name]; len(f) < 4 || f[1] != want {
				t.Errorf("row %q, want probe %s: %s", f, p.Name, want)
			}
			if want == "pass" && !strings.Contains(out, "  "+p.Name+" checks "+p.Rule) {
				t.Errorf("-d does not print the rule of %s", p.Name)
			}
		}
		wantAll(t, "output", out,
			"\n15 probes: 15 pass, 0 deviations, 0 errors\n",
			"\ndrain settings for soft0 (flushcheck.Settings):\n",
			"\n  receive drain WR  yes         recv-in-error: ",
			"\n  MaxBatch          0           flush-order: ",
			"\n  Policy            quarantine  last-wqe-reached, drain-wr: ",
		)
	}
}

// cancelAtProbeLine records the lines written to it and cancels the
// command's context once the first probe line comes.
type cancelAtProbeLine struct {
	lines  []string
	cancel context.CancelFunc
}

func (w *cancelAtProbeLine) Write(p []byte) (int, error) {
	for _, l := range strings.SplitAfter(string(p), "\n") {
		if l != "" {
			w.lines = append(w.lines, l)
			if len(w.lines) == 3 { // header, table header, first probe
				w.cancel()
			}
		}
	}
	return len(p), nil
}

// The header and each probe's line are written as the probe finishes, not
// all at the end: the check is cancelled when the first probe line comes,
// so output kept back until the end would hold every probe's line, and
// streamed output holds only that one (what did not run is not reported).
// Time plays no part, so a slow machine cannot fail it.
func TestCheckStreams(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &cancelAtProbeLine{cancel: cancel}
	root := newRootCmd(w, io.Discard)
	root.SetArgs([]string{"check", "--device", "soft", "--timeout", "200ms"})
	err := root.ExecuteContext(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("check cancelled at its first probe line: %v, want context.Canceled", err)
	}
	if len(w.lines) != 3 {
		t.Fatalf("%d lines written, want the header, the table's and the first probe's:\n%s", len(w.lines), strings.Join(w.lines, ""))
	}
	if first := flushcheck.Probes()[0].Name + " "; !strings.HasPrefix(w.lines[2], first) {
		t.Errorf("third line %q, want the first probe's (%s)", w.lines[2], first)
	}
}

// Without --device the check takes the first libibverbs device, or says in
// its first line that it checks the soft device because there is none.
func TestCheckDefaultDevice(t *testing.T) {
	if infos, err := ibv.Devices(); err == nil && len(infos) > 0 {
		// With hardware (rxe in the VM) the default is the first device,
		// and its deviations are findings, not errors.
		out, err := runSub("check", "--timeout", "1s")
		if code := exitCode(err); code != exitClean && code != exitFindings {
			t.Fatalf("qpdrain check: exit code %d (%v)\n%s", code, err, out)
		}
		if want := "device " + infos[0].Name + ";"; !strings.HasPrefix(out, want) {
			t.Errorf("output starts %q, want the first RDMA device (%q)", firstLine(out), want)
		}
		return
	}
	out, err := runSub("check", "--timeout", "100ms")
	if code := exitCode(err); code != exitClean {
		t.Fatalf("qpdrain check: exit code %d (%v)\n%s", code, err, out)
	}
	why := "no RDMA device on this machine"
	if no := noLibibverbs(); no != "" {
		why = no
	}
	if first := firstLine(out); first != "device soft0 (the built-in soft device: "+why+"); soft quirks: none; timeout 100ms per wait, 30s per verbs call" {
		t.Errorf("first line %q does not say why the soft device is checked (%s)", first, why)
	}
}

// A provider bug switched on in the soft device is a finding (exit 1), in
// the probes that depend on it, with the rule it breaks.
func TestCheckQuirkFindings(t *testing.T) {
	out, err := runSub("check", "--soft-quirk", "no-last-wqe-reached", "--soft-quirk", "no-responder-error-event", "--timeout", "100ms")
	if code := exitCode(err); code != exitFindings {
		t.Fatalf("exit code %d (%v), want %d:\n%s", code, err, exitFindings, out)
	}
	wantAll(t, "output", out,
		"device soft0 (the built-in soft device: --soft-quirk given); soft quirks: no-last-wqe-reached, no-responder-error-event",
		"15 probes: 12 pass, 3 deviations, 0 errors",
		"  last-wqe-reached deviates from IBTA vol. 1 o11-5.2.5: ",
		"  last-wqe-repeat deviates from IBTA vol. 1 o11-5.2.5: ",
		"  responder-access-error deviates from IBTA vol. 1 Table 58",
		"  Policy            destroy-when-empty  last-wqe-reached: no Last WQE Reached within 100ms of ERROR; an SRQ QP waits LastWQETimeout",
	)
}

func TestCheckJSON(t *testing.T) {
	out, err := runSub("check", "--device", "soft", "--soft-quirk", "send-in-error-not-flushed", "--timeout", "100ms", "-j")
	if code := exitCode(err); code != exitFindings {
		t.Fatalf("exit code %d (%v), want %d", code, err, exitFindings)
	}
	var got checkJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("-j output is not JSON: %v\n%s", err, out)
	}
	if got.Device != "soft0" || !got.Soft || got.Note != "" || !slices.Equal(got.Quirks, []string{"send-in-error-not-flushed"}) || got.TimeoutNS != 100e6 ||
		got.CallTimeoutNS != 30e9 || got.Run != "" || got.Skip != "" {
		t.Errorf("device fields %+v", got)
	}
	var deviating []string
	for _, p := range got.Probes {
		if p.Name == "" || p.Rule == "" || p.Observed == "" || p.DurationNS < 0 {
			t.Errorf("incomplete probe %+v", p)
		}
		if p.Outcome == flushcheck.Deviation {
			deviating = append(deviating, p.Name)
		} else if p.Outcome != flushcheck.Pass {
			t.Errorf("probe %s: %s", p.Name, p.Outcome)
		}
	}
	if want := []string{"send-in-error", "flush-before-rts", "drain-wr", "flush-order"}; !slices.Equal(deviating, want) {
		t.Errorf("deviations %v, want %v", deviating, want)
	}
	if got.Pass != 11 || got.Deviations != 4 || got.Errors != 0 || got.Hung != 0 || got.NotRun != 0 || got.Skipped != 0 {
		t.Errorf("counts %d/%d/%d/%d/%d/%d, want 11/4/0/0/0/0", got.Pass, got.Deviations, got.Errors, got.Hung, got.NotRun, got.Skipped)
	}
	for _, key := range []string{`"call_timeout_ns": 30000000000`, `"run": ""`, `"skip": ""`, `"hung": 0`, `"not_run": 0`, `"skipped": 0`} {
		if !strings.Contains(out, key) {
			t.Errorf("-j output lacks %s", key)
		}
	}
	// A drain WR that never comes proves nothing: quarantine, one per QP,
	// the sends counted, and the receives too (an SRQ QP's barrier would
	// hold the headroom a receive drain WR needs).
	if want := (drainOptionsJSON{MaxBatch: 1, Policy: drain.Quarantine, LastWQETimeoutNS: 5e9, DrainTimeoutNS: 5e9, ViaRTS: false, Headroom: 1, CountRecvs: true, CountSends: true}); got.DrainOptions != want {
		t.Errorf("drain_options %+v, want %+v", got.DrainOptions, want)
	}
	if len(got.Settings) == 0 || got.Settings[0].Name != "receive drain WR" || got.Settings[0].Reason == "" {
		t.Errorf("settings %+v", got.Settings)
	}
	for _, key := range []string{`"drain_options": {`, `"count_recvs": true`, `"count_sends": true`, `"max_batch": 1`, `"via_rts": false`, `"settings": [`, `"reason": "`} {
		if !strings.Contains(out, key) {
			t.Errorf("-j output lacks %s", key)
		}
	}
}

func TestCheckRejects(t *testing.T) {
	wantRefused(t, []string{"check"}, []badInput{
		{[]string{"--soft-quirk", "nope"}, exitError, `unknown quirk "nope"`},
		{[]string{"--timeout", "0s"}, exitError, "want at least 100ms"},
		{[]string{"--timeout", "99ms"}, exitError, `invalid argument "99ms" for "--timeout" flag: want at least 100ms`},
		{[]string{"--call-timeout", "999ms"}, exitError, `invalid argument "999ms" for "--call-timeout" flag: want at least 1s`},
		{[]string{"--run", "("}, exitError, `invalid argument "(" for "--run" flag: error parsing regexp: missing closing )`},
		{[]string{"--skip", "nope"}, exitError, `invalid argument "nope" for "--skip" flag: matches no probe (flush-outstanding, `},
		{[]string{"--skip", "."}, exitError, `check: no probe left to run by --skip "."`},
		{[]string{"--device", "nosuchdevice0"}, exitUnsupported, `no such RDMA device "nosuchdevice0"`},
		{[]string{"--device", "rxe0", "--soft-quirk", "no-last-wqe-reached"}, exitError, "--soft-quirk applies to the soft device only"},
		{[]string{"extra-arg"}, exitError, `unknown command "extra-arg"`},
	})
}

// A hang outranks errors, and errors deviations, in the exit status;
// skipped probes do not count.
func TestCheckVerdict(t *testing.T) {
	r := func(o flushcheck.Outcome) flushcheck.Result { return flushcheck.Result{Outcome: o} }
	for _, tc := range []struct {
		results []flushcheck.Result
		want    int
	}{
		{[]flushcheck.Result{r(flushcheck.Pass), r(flushcheck.Pass)}, exitClean},
		{[]flushcheck.Result{r(flushcheck.Pass), r(flushcheck.Deviation)}, exitFindings},
		{[]flushcheck.Result{r(flushcheck.Deviation), r(flushcheck.Error)}, exitError},
		{[]flushcheck.Result{r(flushcheck.Skipped), r(flushcheck.Pass)}, exitClean},
		{[]flushcheck.Result{r(flushcheck.Error), r(flushcheck.Hung), r(flushcheck.NotRun)}, exitHung},
	} {
		if got := exitCode(checkVerdict(tc.results)); got != tc.want {
			t.Errorf("%v: exit code %d, want %d", tc.results, got, tc.want)
		}
	}
}

// TestCheckTestDevice runs "qpdrain check" on the device the device tests
// use (QPDRAIN_TEST_DEVICE; the soft device when unset) and logs what it
// prints: on rxe in the VM that is the operator's view of the kernel's
// findings, which flushcheck's TestDevice asserts probe by probe.
func TestCheckTestDevice(t *testing.T) {
	name := devtest.DeviceName()
	if devtest.CurrentProvider() == devtest.ProviderSoft {
		name = softDeviceName // the CLI has the orderly soft device only
	}
	// 2 s per wait: rxe answers in milliseconds, and a deviation costs its
	// whole timeout (flushcheck's TestDevice has the same reasoning).
	start := time.Now()
	out, err := runSub("check", "--device", name, "--timeout", "2s")
	t.Logf("qpdrain check --device %s --timeout 2s (wall time %v):\n%s", name, time.Since(start).Round(10*time.Millisecond), out)
	// rxe deviates on every kernel seen (docs/PROVIDERS.md); soft follows
	// every rule the probes check.
	want := exitFindings
	if devtest.CurrentProvider() == devtest.ProviderSoft {
		want = exitClean
	}
	if code := exitCode(err); code != want && devtest.CurrentProvider() != devtest.ProviderOther {
		t.Errorf("exit code %d (%v), want %d", code, err, want)
	}
	if n := strings.Count(out, "\n"); n < 2+len(flushcheck.Probes()) {
		t.Errorf("%d lines, want a header, a table and a summary", n)
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// --run and --skip select probes as go test's -run and -skip do; the
// others are listed as skipped, in the table, the summary and -j.
func TestCheckSelect(t *testing.T) {
	out, err := runSub("check", "--device", "soft", "--timeout", "100ms", "--run", "in-error$", "--skip", "recv")
	if code := exitCode(err); code != exitClean {
		t.Fatalf("exit code %d (%v)\n%s", code, err, out)
	}
	wantAll(t, "output", out,
		`; timeout 100ms per wait, 30s per verbs call; --run "in-error$" --skip "recv"`+"\n",
		"\nsend-in-error           pass   ",
		"\nrecv-in-error           skipped           0s  skipped: the skip pattern \"recv\" matches it\n",
		"\nsqd                     skipped           0s  skipped: the run pattern \"in-error$\" does not match it\n",
		"\n15 probes: 1 pass, 0 deviations, 0 errors, 14 skipped\n",
		"\n  skipped (--run, --skip): flush-outstanding, recv-in-error, flush-before-rts, ",
	)
	out, err = runSub("check", "--device", "soft", "--timeout", "100ms", "--run", "^sqd$", "-j")
	if code := exitCode(err); code != exitClean {
		t.Fatalf("-j: exit code %d (%v)\n%s", code, err, out)
	}
	var got checkJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("-j output is not JSON: %v\n%s", err, out)
	}
	if got.Run != "^sqd$" || got.Skip != "" || got.Pass != 1 || got.Skipped != len(flushcheck.Probes())-1 || len(got.Probes) != len(flushcheck.Probes()) {
		t.Errorf("-j: run %q, skip %q, %d pass, %d skipped, %d probes; want ^sqd$ alone run, every probe listed", got.Run, got.Skip, got.Pass, got.Skipped, len(got.Probes))
	}
}

// A verbs call that never returns (the soft device blocks every move of a
// QP to RESET, as rxe on Linux 5.10 did not return from reset-reuse's calls)
// ends the check within --call-timeout: exit 4, the probe hung naming the
// call, the probes after it not run, one line on stderr, and -j one
// complete document. The device is left open; the test closes it once the
// call returns.
func TestCheckHung(t *testing.T) {
	for _, jsonOut := range []bool{false, true} {
		unblock := make(chan struct{})
		var dev *soft.Device
		openCheck = func(o *checkOptions) (ibv.Context, *checkResult, error) {
			d, err := soft.Open(soft.Config{Trace: func(e soft.TraceEntry) {
				if e.Kind == soft.TraceState && e.To == ibv.QPSReset {
					<-unblock
				}
			}})
			if err != nil {
				return nil, nil, err
			}
			d.Fabric().SetRealTime(true)
			dev = d
			return d, &checkResult{device: d.Name(), soft: true}, nil
		}
		args := []string{"check", "--timeout", "100ms", "--call-timeout", "1s"}
		if jsonOut {
			args = append(args, "-j")
		}
		start := time.Now()
		stdout, stderr, code := runCLI(nil, args...)
		took := time.Since(start)
		openCheck = openCheckDevice
		close(unblock)
		if dev != nil {
			// The probe given up on closes its objects once its call returns.
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if err := dev.Close(); !errors.Is(err, ibv.ErrBusy) || time.Now().After(deadline) {
					if err != nil {
						t.Errorf("closing the device: %v", err)
					}
					break
				}
			}
		}
		t.Logf("qpdrain %q: exit %d after %v\n%s%s", args, code, took.Round(time.Millisecond), stdout, stderr)
		// The probes before reset-reuse take well under a second on soft.
		if code != exitHung || took > 10*time.Second {
			t.Errorf("qpdrain %q: exit %d after %v, want %d within 10s", args, code, took, exitHung)
		}
		call := regexp.MustCompile(`ibv_modify_qp on QP \d+ to RESET did not return within 1s \(blocked for 1(\.\d+)?s\); the device may be wedged: see the kernel log \(dmesg\)`)
		if !regexp.MustCompile(`^qpdrain: reset-reuse hung: ` + call.String() + `; 1 probe not run\n$`).MatchString(stderr) {
			t.Errorf("stderr %q, want one line naming the probe and the call", stderr)
		}
		if !jsonOut {
			wantAll(t, "output", stdout,
				"\nreset-reuse             hung         ",
				"\nsqd                     not-run           0s  not run: reset-reuse hung before it, and the device may be wedged\n",
				"\n15 probes: 13 pass, 0 deviations, 0 errors, 1 hung, 1 not run\n",
				"\n  reset-reuse hung: ibv_modify_qp on QP ",
				"\n  not run because reset-reuse hung: sqd\n",
				"\ndrain settings for soft0 (flushcheck.Settings):\n",
			)
			if !call.MatchString(stdout) {
				t.Errorf("the output does not name the call:\n%s", stdout)
			}
			continue
		}
		var got checkJSON
		dec := json.NewDecoder(strings.NewReader(stdout))
		if err := dec.Decode(&got); err != nil || dec.More() {
			t.Fatalf("-j output is not one JSON document (%v):\n%s", err, stdout)
		}
		outcomes := map[flushcheck.Outcome][]string{}
		for _, p := range got.Probes {
			outcomes[p.Outcome] = append(outcomes[p.Outcome], p.Name)
			if p.Outcome == flushcheck.Hung && !call.MatchString(p.Observed) {
				t.Errorf("hung probe's observed %q does not name the call", p.Observed)
			}
		}
		if !slices.Equal(outcomes[flushcheck.Hung], []string{"reset-reuse"}) || !slices.Equal(outcomes[flushcheck.NotRun], []string{"sqd"}) ||
			got.Pass != 13 || got.Hung != 1 || got.NotRun != 1 || got.CallTimeoutNS != 1e9 || len(got.Settings) == 0 {
			t.Errorf("-j: %+v, %d pass, %d hung, %d not run", outcomes, got.Pass, got.Hung, got.NotRun)
		}
	}
}

// A wait on the wall clock that lasts flushcheck.LongWait is told on
// stderr, once, naming the probe and what it waits for; stdout keeps the
// table or the one JSON document.
func TestCheckProgress(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out flushcheck.LongWait in real time")
	}
	defer func() { openCheck = openCheckDevice }()
	openCheck = func(o *checkOptions) (ibv.Context, *checkResult, error) {
		d, err := soft.Open(soft.Config{Quirks: soft.Quirks{RecvInErrorNotFlushed: true}})
		if err != nil {
			return nil, nil, err
		}
		d.Fabric().SetRealTime(true)
		return d, &checkResult{device: d.Name(), soft: true}, nil
	}
	stdout, stderr, code := runCLI(nil, "check", "--run", "^recv-in-error$", "--timeout", "1200ms", "-j")
	if want := "check: recv-in-error still waiting for 1 completion (1s so far, at most 1.2s)\n"; stderr != want || code != exitFindings {
		t.Errorf("exit %d, stderr %q; want %d, the wait told as %q", code, stderr, exitFindings, want)
	}
	var doc checkJSON
	if err := json.Unmarshal([]byte(stdout), &doc); err != nil || doc.Deviations != 1 {
		t.Errorf("stdout is not the JSON document of one deviation (%v):\n%s", err, stdout)
	}
}

// TestCheckSoftIWARP: --device soft:iwarp checks the soft device with
// siw's rules through its RDMA CM: every probe reaches a verdict or says
// why it does not apply to iWARP, never "could not check"; the JSON says
// how the QPs were connected.
func TestCheckSoftIWARP(t *testing.T) {
	stdout, stderr, code := runCLI(nil, "check", "--device", "soft:iwarp", "-j")
	if code != exitFindings {
		t.Fatalf("exit %d, want %d (no Last WQE Reached)\n%s%s", code, exitFindings, stdout, stderr)
	}
	var doc checkJSON
	if err := json.Unmarshal([]byte(stdout), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Transport != "iWARP" || doc.Connection != "rdma_cm" || doc.CMAddr == "" {
		t.Errorf("transport %q, connection %q on %q, want iWARP, rdma_cm on an address", doc.Transport, doc.Connection, doc.CMAddr)
	}
	if doc.Errors != 0 || doc.NotApplicable != 4 || doc.Pass+doc.Deviations+doc.NotApplicable != len(flushcheck.Probes()) {
		t.Errorf("%d pass, %d deviations, %d errors, %d not applicable", doc.Pass, doc.Deviations, doc.Errors, doc.NotApplicable)
	}
	for _, p := range doc.Probes {
		if p.Outcome == flushcheck.NotApplicable && !strings.Contains(p.Observed, "siw") {
			t.Errorf("%s: not applicable without siw's source: %q", p.Name, p.Observed)
		}
	}
}

// TestCheckSoftCM: --cm connects the soft device's QPs through its RDMA CM;
// on InfiniBand every probe passes but reset-reuse, which reconnects a QP
// by hand and says so.
func TestCheckSoftCM(t *testing.T) {
	out, err := runSub("check", "--device", "soft", "--cm", "--timeout", "100ms")
	if code := exitCode(err); code != exitClean {
		t.Fatalf("exit %d (%v)\n%s", code, err, out)
	}
	if !strings.Contains(firstLine(out), "transport InfiniBand, QPs connected through the RDMA CM on 192.0.2.1:") {
		t.Errorf("header %q", firstLine(out))
	}
	if !strings.Contains(out, "15 probes: 14 pass, 0 deviations, 0 errors, 1 not applicable") {
		t.Errorf("summary missing:\n%s", out)
	}
}

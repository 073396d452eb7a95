package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/qpdrain/qpdrain/flushcheck"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/devtest"
)

func runCheckCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	root := newRootCmd(&out, &errOut)
	root.SetArgs(append([]string{"check"}, args...))
	err := root.Execute()
	return out.String(), err
}

// exitCodeOf is the exit status main gives err.
func exitCodeOf(err error) int {
	if err == nil {
		return exitClean
	}
	var ec *exitCodeError
	if errors.As(err, &ec) {
		return ec.code
	}
	return exitError
}

func TestCheckSoftClean(t *testing.T) {
	out, err := runCheckCmd(t, "--device", "soft", "--timeout", "100ms", "-d")
	if err != nil {
		t.Fatalf("qpdrain check: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if !strings.HasPrefix(lines[0], "device soft0 (the built-in soft device); soft quirks: none; timeout 100ms per wait") {
		t.Errorf("header %q", lines[0])
	}
	if !strings.HasPrefix(lines[1], "probe ") || !strings.Contains(lines[1], "outcome") || !strings.Contains(lines[1], "observed") {
		t.Errorf("table header %q", lines[1])
	}
	for i, p := range flushcheck.Probes() {
		f := strings.Fields(lines[2+i])
		if len(f) < 4 || f[0] != p.Name || f[1] != "pass" {
			t.Errorf("line %q, want probe %s passing", lines[2+i], p.Name)
		}
		if !strings.Contains(out, "  "+p.Name+" checks "+p.Rule) {
			t.Errorf("-d does not print the rule of %s", p.Name)
		}
	}
	if !strings.Contains(out, "\n7 probes: 7 pass, 0 deviations, 0 errors\n") {
		t.Errorf("no summary line:\n%s", out)
	}
}

// Without --device the check takes the first libibverbs device, or says in
// its first line that it checks the soft device because there is none.
func TestCheckDefaultDevice(t *testing.T) {
	if infos, err := ibv.Devices(); err == nil && len(infos) > 0 {
		// With hardware (rxe in the VM) the default is the first device,
		// and its deviations are findings, not errors.
		out, err := runCheckCmd(t, "--timeout", "1s")
		if code := exitCodeOf(err); code != exitClean && code != exitFindings {
			t.Fatalf("qpdrain check: exit code %d (%v)\n%s", code, err, out)
		}
		if want := "device " + infos[0].Name + ";"; !strings.HasPrefix(out, want) {
			t.Errorf("output starts %q, want the first RDMA device (%q)", firstLine(out), want)
		}
		return
	}
	out, err := runCheckCmd(t, "--timeout", "100ms")
	if err != nil {
		t.Fatalf("qpdrain check: %v\n%s", err, out)
	}
	first := firstLine(out)
	if first != "device soft0 (the built-in soft device: no RDMA device on this machine); soft quirks: none; timeout 100ms per wait" &&
		first != "device soft0 (the built-in soft device: this build has no libibverbs); soft quirks: none; timeout 100ms per wait" {
		t.Errorf("first line %q does not say why the soft device is checked", first)
	}
}

// A provider bug switched on in the soft device is a finding (exit 1), in
// the probes that depend on it, with the rule it breaks.
func TestCheckQuirkFindings(t *testing.T) {
	out, err := runCheckCmd(t, "--soft-quirk", "no-last-wqe-reached", "--soft-quirk", "no-responder-error-event", "--timeout", "50ms")
	if code := exitCodeOf(err); code != exitFindings {
		t.Fatalf("exit code %d (%v), want %d:\n%s", code, err, exitFindings, out)
	}
	for _, want := range []string{
		"device soft0 (the built-in soft device: --soft-quirk given); soft quirks: no-last-wqe-reached, no-responder-error-event",
		"7 probes: 5 pass, 2 deviations, 0 errors",
		"  last-wqe-reached deviates from o11-5.2.5: ",
		"  responder-access-error deviates from IBTA Table 58",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestCheckJSON(t *testing.T) {
	out, err := runCheckCmd(t, "--device", "soft", "--soft-quirk", "send-in-error-not-flushed", "--timeout", "50ms", "-j")
	if code := exitCodeOf(err); code != exitFindings {
		t.Fatalf("exit code %d (%v), want %d", code, err, exitFindings)
	}
	var got checkJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("-j output is not JSON: %v\n%s", err, out)
	}
	if got.Device != "soft0" || !got.Soft || got.Note != "" || !slices.Equal(got.Quirks, []string{"send-in-error-not-flushed"}) || got.TimeoutMS != 50 {
		t.Errorf("device fields %+v", got)
	}
	var deviating []string
	for _, p := range got.Probes {
		if p.Name == "" || p.Rule == "" || p.Observed == "" || p.DurationUS < 0 {
			t.Errorf("incomplete probe %+v", p)
		}
		if p.Outcome == "deviation" {
			deviating = append(deviating, p.Name)
		} else if p.Outcome != "pass" {
			t.Errorf("probe %s: %s", p.Name, p.Outcome)
		}
	}
	if want := []string{"send-in-error", "flush-before-rts", "drain-wr"}; !slices.Equal(deviating, want) {
		t.Errorf("deviations %v, want %v", deviating, want)
	}
	if got.Pass != 4 || got.Deviations != 3 || got.Errors != 0 {
		t.Errorf("counts %d/%d/%d, want 4/3/0", got.Pass, got.Deviations, got.Errors)
	}
}

func TestCheckRejects(t *testing.T) {
	for _, args := range [][]string{
		{"--soft-quirk", "nope"},
		{"--timeout", "0s"},
		{"--device", "nosuchdevice0"},
		{"--device", "rxe0", "--soft-quirk", "no-last-wqe-reached"},
		{"extra-arg"},
	} {
		out, err := runCheckCmd(t, args...)
		if code := exitCodeOf(err); code != exitError {
			t.Errorf("check %v: exit code %d (%v), want %d", args, code, err, exitError)
		}
		if out != "" {
			t.Errorf("check %v printed %q", args, out)
		}
	}
}

// Errors outrank deviations in the exit status.
func TestCheckVerdict(t *testing.T) {
	r := func(o flushcheck.Outcome) flushcheck.Result { return flushcheck.Result{Outcome: o} }
	for _, tc := range []struct {
		results []flushcheck.Result
		want    int
	}{
		{[]flushcheck.Result{r(flushcheck.Pass), r(flushcheck.Pass)}, exitClean},
		{[]flushcheck.Result{r(flushcheck.Pass), r(flushcheck.Deviation)}, exitFindings},
		{[]flushcheck.Result{r(flushcheck.Deviation), r(flushcheck.Error)}, exitError},
	} {
		if got := exitCodeOf(checkVerdict(tc.results)); got != tc.want {
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
	out, err := runCheckCmd(t, "--device", name, "--timeout", "2s")
	t.Logf("qpdrain check --device %s:\n%s", name, out)
	want := exitClean
	if devtest.CurrentProvider() == devtest.ProviderRXE {
		want = exitFindings // no responder event on any rxe seen (docs/PROVIDERS.md)
	}
	if code := exitCodeOf(err); code != want && devtest.CurrentProvider() != devtest.ProviderOther {
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

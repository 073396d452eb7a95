package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/ipoibcm/churn"
)

// The eHCA thread on the CLI: the kernel's policy leaks on a provider that
// never completes a send posted in ERROR (exit 1) and rejects every later
// connection; the bounded policy keeps accepting and leaks nothing (exit 0).
func TestChurnCmd(t *testing.T) {
	common := []string{"--events", "2000", "--quirk", "send-in-error-not-flushed", "--max-qp", "64"}
	out, err := runSub("churn", common...)
	if code := exitCode(err); code != exitFindings {
		t.Fatalf("kernel policy: exit %d (%v), want %d\n%s", code, err, exitFindings, out)
	}
	wantAll(t, "kernel policy output", out, "rx_flush_list", "first rejection: event", "accepted after it: 0", "hung drains 1")
	plot := filepath.Join(t.TempDir(), "churn.png")
	out, err = runSub("churn", append(common, "--policy", "bounded", "--rx-timeout", "10s", "--rx-delay", "15s", "--rx-update-time", "5s", "--plot", plot, "-j")...)
	if err != nil {
		t.Fatalf("bounded policy: %v\n%s", err, out)
	}
	var res map[string]any
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("-j output: %v\n%s", err, out)
	}
	for _, key := range []string{"leaked_qps", "hung_drains", "false_safe", "rejected_no_qp", "samples", "time_to_reap", "ifname", "max_qp", "soft_quirks", "vanished_at_end"} {
		if _, ok := res[key]; !ok {
			t.Errorf("-j output lacks %q", key)
		}
	}
	if res["leaked_qps"] != 0.0 || res["hung_drains"] != 0.0 {
		t.Errorf("bounded policy leaked %v, hung %v, want 0 and 0", res["leaked_qps"], res["hung_drains"])
	}
	png, err := os.ReadFile(plot)
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Errorf("--plot wrote no PNG: %v", err)
	}
}

// churn on the test device: on a real one (rxe in the VM) the schedule runs
// on the real clock with peers in loopback; nothing leaks under the bounded
// policy on either kernel.
func TestChurnCmdDevice(t *testing.T) {
	name := devtest.DeviceName()
	if devtest.CurrentProvider() == devtest.ProviderSoft {
		name = softDeviceName
	}
	out, err := runSub("churn", "--device", name, "--policy", "bounded", "--events", "300", "--connect-rate", "200",
		"--send-rate", "20", "--lifetime", "20ms", "--rx-update-time", "20ms", "--rx-timeout", "50ms", "--rx-delay", "75ms",
		"--drain-timeout", "1s", "--samples", "10")
	if err != nil {
		t.Fatalf("churn on %s: %v\n%s", name, err, out)
	}
	if !strings.Contains(out, "leaked 0") || !strings.Contains(out, "false safe 0") {
		t.Errorf("churn on %s:\n%s", name, out)
	}
	t.Logf("%s", out)
}

// The plot's axes: integer ticks from 0, no line across the churn's end,
// and the same axes for two runs of the same flags.
func TestChurnPlotAxes(t *testing.T) {
	for _, tc := range []struct {
		lo, hi float64
		want   string
	}{{0, 150, "0 20 40 60 80 100 120 140"}, {0, 3000, "0 500 1000 1500 2000 2500 3000"}, {0, 7, "0 1 2 3 4 5 6 7"}, {0, 60, "0 10 20 30 40 50 60"}} {
		var labels []string
		for _, tk := range (intTicks{}).Ticks(tc.lo, tc.hi) {
			if tk.Label != "" {
				labels = append(labels, tk.Label)
			}
		}
		if got := strings.Join(labels, " "); got != tc.want {
			t.Errorf("ticks %v-%v: %q, want %q", tc.lo, tc.hi, got, tc.want)
		}
	}
	s := func(at time.Duration, events int) churn.Sample { return churn.Sample{At: at, Events: events, QPs: 100} }
	samples := []churn.Sample{s(time.Minute, 10), s(2*time.Minute, 20), s(3*time.Minute, 30), s(4*time.Minute, 30), s(5*time.Minute, 30)}
	if segs := churnSegments(samples, 30); len(segs) != 2 || len(segs[0]) != 3 || len(segs[1]) != 2 {
		t.Errorf("segments %v, want the events' 3 samples, then the settle's 2", segs)
	}
	gap := []churn.Sample{s(time.Minute, 1), s(2*time.Minute, 2), s(3*time.Minute, 3), s(30*time.Minute, 4), s(31*time.Minute, 5)}
	if segs := churnSegments(gap, 100); len(segs) != 2 || len(segs[0]) != 3 {
		t.Errorf("segments %v, want a break at the gap", segs)
	}
	short := &churnRun{Result: &churn.Result{Samples: samples, Events: churn.Events{Connects: 10, Sends: 20}}, MaxQP: 128}
	long := &churnRun{Result: &churn.Result{Samples: gap, Events: churn.Events{Connects: 25, Sends: 5}}, MaxQP: 128}
	if a, b := newChurnAxes(short, time.Hour), newChurnAxes(long, time.Hour); a != b || a.limit != 128 || a.xMax != 60 || a.unitName != "minutes" {
		t.Errorf("axes %+v and %+v, want the same, to 60 minutes, max_qp 128 drawn", a, b)
	}
}

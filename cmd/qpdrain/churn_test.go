package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qpdrain/qpdrain/internal/testing/devtest"
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

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func runSimulate(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	root := newRootCmd(&out, &errOut)
	root.SetArgs(append([]string{"simulate"}, args...))
	err := root.Execute()
	return out.String(), err
}

func TestSimulateHealthy(t *testing.T) {
	out, err := runSimulate(t, "--qps", "5")
	if err != nil {
		t.Fatalf("qpdrain simulate: %v\n%s", err, out)
	}
	if !strings.Contains(out, "5 safe, 0 destroyed after an empty CQ, 0 quarantined, 0 failed; 2 drain WRs") {
		t.Errorf("want 5 safe QPs behind 2 drain WRs:\n%s", out)
	}
}

// A provider that never completes the drain WR: every QP is quarantined and
// the exit status says there are findings.
func TestSimulateQuirkFindings(t *testing.T) {
	out, err := runSimulate(t, "--qps", "2", "--quirk", "send-in-error-not-flushed", "--timeout", "20ms", "-j")
	var ec *exitCodeError
	if !errors.As(err, &ec) || ec.code != exitFindings {
		t.Fatalf("error %v, want exit code %d (findings)", err, exitFindings)
	}
	var got simJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("-j output is not JSON: %v\n%s", err, out)
	}
	if len(got.QPs) != 2 || got.Stats.Quarantined != 2 {
		t.Fatalf("want 2 QPs, both quarantined: %+v", got)
	}
	for _, q := range got.QPs {
		if q.Outcome != "quarantined" || !strings.Contains(q.Stalled, "drain WR never completed") || q.RecvFlushed != 4 || q.SendFlushed != 2 {
			t.Errorf("qp %+v: want quarantined after the drain WR stalled, 4 receives and 2 sends flushed", q)
		}
	}
}

func TestSimulateRejects(t *testing.T) {
	for _, args := range [][]string{{"--quirk", "nope"}, {"--policy", "nope"}, {"--qps", "0"}} {
		var ec *exitCodeError
		if _, err := runSimulate(t, args...); !errors.As(err, &ec) || ec.code != exitError {
			t.Errorf("simulate %v: %v, want exit code %d", args, err, exitError)
		}
	}
}

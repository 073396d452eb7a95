package main

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/scenario"
)

// QPs with sends outstanding need a drain WR each on their own send
// queue; without sends, only their SRQ side is open and they share
// barriers: the first QP alone, the other four behind the second.
func TestSimulateHealthy(t *testing.T) {
	for _, tc := range []struct {
		sends, drainWRs string
	}{{"2", "5"}, {"0", "2"}} {
		out, err := runSub("simulate", "--qps", "5", "--sends", tc.sends)
		if err != nil {
			t.Fatalf("qpdrain simulate: %v\n%s", err, out)
		}
		if !strings.Contains(out, "5 safe, 0 destroyed after an empty CQ, 0 quarantined, 0 failed; "+tc.drainWRs+" drain WRs") {
			t.Errorf("--sends %s: want 5 safe QPs behind %s drain WRs:\n%s", tc.sends, tc.drainWRs, out)
		}
	}
}

// A provider that never completes the drain WR: every QP is quarantined and
// the exit status says there are findings. The second QP times out
// waiting for the headroom the first one's drain WR holds, at the same
// time as the first.
func TestSimulateQuirkFindings(t *testing.T) {
	out, err := runSub("simulate", "--qps", "2", "--quirk", "send-in-error-not-flushed", "--timeout", "20ms", "-j")
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
		stalled := strings.Contains(q.Stalled, "drain WR never completed") || strings.Contains(q.Stalled, "no headroom for a drain WR")
		if q.Outcome != report.Quarantined || !stalled || q.RecvFlushed != 4 || q.SendFlushed != 2 {
			t.Errorf("qp %+v: want quarantined after the drain WR stalled, 4 receives and 2 sends flushed", q)
		}
	}
}

// Bad flags give exit code 2 and an error naming the flag and its value,
// before any object is created.
func TestSimulateRejects(t *testing.T) {
	wantRefused(t, []string{"simulate"}, []badInput{
		{[]string{"--quirk", "nope"}, exitError, `unknown quirk "nope"`},
		{[]string{"--policy", "nope"}, exitError, `unknown policy "nope"`},
		{[]string{"--qps", "0"}, exitError, `invalid argument "0" for "--qps" flag: want 1 to`},
		{[]string{"--qps", "-3"}, exitError, `"-3" for "--qps"`},
		{[]string{"--taken", "-1"}, exitError, `"-1" for "--taken"`},
		{[]string{"--sends", "-1"}, exitError, `"-1" for "--sends"`},
		{[]string{"--max-batch", "-1"}, exitError, `"-1" for "--max-batch" flag: want at least 0`},
		{[]string{"--max-quarantine", "0"}, exitError, `"0" for "--max-quarantine" flag: want at least 1`},
		{[]string{"--timeout", "0s"}, exitError, `"0s" for "--timeout" flag: want a positive duration`},
		{[]string{"--timeout", "-1s"}, exitError, `"-1s" for "--timeout"`},
		{[]string{"--qps", "9223372036854775807"}, exitError, "want 1 to 4194304"},
		{[]string{"--qps", "65537"}, exitError, "--qps 65537: soft0 creates at most 65536 QPs (max_qp)"},
		{[]string{"--qps", "60000", "--taken", "100"}, exitError, "needs a CQ of"},
	})
}

// Every JSON key is snake_case, drain.Stats' included, and QP numbers are
// printed in decimal, as check and scenario print them.
func TestSimulateKeys(t *testing.T) {
	out, err := runSub("simulate", "--qps", "2", "--quirk", "last-wqe-reached-twice", "-j")
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Inputs simInputsJSON  `json:"inputs"`
		Stats  map[string]any `json:"stats"`
	}
	if err := json.Unmarshal([]byte(out), &raw); err != nil || len(raw.Stats) == 0 {
		t.Fatalf("stats %v (%v)", raw.Stats, err)
	}
	// The inputs that shaped it, the default timeout included.
	if in := raw.Inputs; in.QPs != 2 || in.MaxQP != 65536 || !slices.Equal(in.Quirks, []string{"last-wqe-reached-twice"}) ||
		in.TimeoutNS != int64(scenario.BaseTimeout+2*scenario.TimeoutPerQP) || in.TimeoutFlag || !in.SRQ || in.Policy != drain.Quarantine {
		t.Errorf("inputs %+v", in)
	}
	for k := range raw.Stats {
		if k != strings.ToLower(k) {
			t.Errorf("stats key %q is not snake_case", k)
		}
	}
	for _, k := range []string{"after_empty_cq", "recv_drain_wrs", "repeated_last_wqe", "late_drain_wcs"} {
		if _, ok := raw.Stats[k]; !ok {
			t.Errorf("stats lack %q: %v", k, raw.Stats)
		}
	}
	text, err := runSub("simulate", "--qps", "2", "-d")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(text, "\n0x") || strings.Contains(text, "qpn 0x") {
		t.Errorf("QP numbers in hex:\n%s", text)
	}
}

// -j writes a step's "->" as it is, as every command's document does, not
// HTML-escaped as \u003e.
func TestSimulateJSONUnescaped(t *testing.T) {
	out, err := runSub("simulate", "--qps", "1", "-j")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "RTS -> ERR") || strings.Contains(out, `\u003e`) {
		t.Errorf("simulate -j steps not as written:\n%s", out)
	}
}

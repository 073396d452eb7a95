package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// traceRecords is a kept trace (--records) of a program that destroys a QP
// on an SRQ 1 ms after moving it to ERROR, without waiting for Last WQE
// Reached.
const traceRecords = `open t=1000000 pid=7 tid=7 ctx=0x10 dev=rxe0 traced=1
cq t=1000000 pid=7 tid=7 ctx=0x10 cq=0x20 cqe=16 ex=0
srq t=1000000 pid=7 tid=7 ctx=0x10 srq=0x40 max_wr=16
qp t=2000000 pid=7 tid=7 ctx=0x10 qp=0x31 qpn=17 type=2 scq=0x20 rcq=0x20 srq=0x40 max_send_wr=8 max_recv_wr=0 sig_all=0 ex=0
mod t=3000000 pid=7 tid=7 qp=0x31 state=3 ret=0
mod t=4000000 pid=7 tid=7 qp=0x31 state=6 ret=0
qpd t=5000000 pid=7 tid=7 qp=0x31 begin=1
qpd t=5000000 pid=7 tid=7 qp=0x31 ret=0
exit t=6000000 pid=7 tid=7
`

func TestTraceFrom(t *testing.T) {
	dir := t.TempDir()
	rec := writeFile(t, filepath.Join(dir, "run.rec"), traceRecords)
	out, err := runSub("trace", "-d", "--last-wqe", "raises", "--from", rec)
	if code := exitCode(err); code != exitFindings {
		t.Fatalf("exit %d (%v), want %d:\n%s", code, err, exitFindings, out)
	}
	wantAll(t, "report", out, "pid 7 on rxe0: 1 QPs, 1 CQs, 1 SRQs", "1 finding(s):",
		"srq-destroyed-before-last-wqe  pid 7  rxe0  qpn 17  srq queue  at 4.0 ms",
		"was destroyed 1.0 ms after ERROR, before the program got IBV_EVENT_QP_LAST_WQE_REACHED for it; rxe0 raises it (--last-wqe raises)",
		"  rule: IBTA vol. 1 o11-5.2.5")
	// never: a note, clean; -j into --report, nothing on stdout
	report := filepath.Join(dir, "r.json")
	out, err = runSub("trace", "-j", "--last-wqe", "never", "--report", report, "--from", rec)
	if code := exitCode(err); code != exitClean || out != "" {
		t.Fatalf("exit %d (%v), stdout %q; want clean, nothing on stdout", code, err, out)
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Findings []json.RawMessage `json:"findings"`
		Notes    []string          `json:"notes"`
	}
	if err := json.Unmarshal(b, &doc); err != nil || len(doc.Findings) != 0 || len(doc.Notes) != 1 || !strings.Contains(doc.Notes[0], "which rxe0 does not raise (--last-wqe never)") {
		t.Errorf("--report -j: %v\n%s", err, b)
	}
	// a suppressed kind: counted, not a finding, exit 0; a line that does
	// not match (another kind, another queue) leaves it a finding
	supp := writeFile(t, filepath.Join(dir, "ok.supp"), "# accepted\n\ncq-overrun\nsrq-destroyed-before-last-wqe queue=srq device=rxe*\n")
	out, err = runSub("trace", "--last-wqe", "raises", "--suppressions", supp, "--from", rec)
	if code := exitCode(err); code != exitClean {
		t.Fatalf("--suppressions: exit %d (%v), want clean:\n%s", code, err, out)
	}
	wantAll(t, "--suppressions report", out, "\nclean\n1 finding(s) suppressed, not shown: 1 srq-destroyed-before-last-wqe ("+supp+":4)\n")
	other := writeFile(t, filepath.Join(dir, "other.supp"), "cq-overrun\nsrq-destroyed-before-last-wqe queue=recv\n")
	out, err = runSub("trace", "--last-wqe", "raises", "--suppressions", other, "--from", rec)
	if code := exitCode(err); code != exitFindings || strings.Contains(out, "suppressed") {
		t.Fatalf("--suppressions not matching: exit %d (%v), want findings, none suppressed:\n%s", code, err, out)
	}
	// --error-exitcode: the status findings give, 0 for never
	for _, tc := range []struct {
		arg  string
		want int
	}{{"0", exitClean}, {"7", 7}, {"1", exitFindings}} {
		_, err = runSub("trace", "--last-wqe", "raises", "--error-exitcode", tc.arg, "--from", rec)
		if code := exitCode(err); code != tc.want {
			t.Errorf("--error-exitcode %s: exit %d (%v), want %d", tc.arg, code, err, tc.want)
		}
	}
}

func TestTraceBadArgs(t *testing.T) {
	bad := writeFile(t, filepath.Join(t.TempDir(), "bad.rec"), "open t=1 pid=1\n")
	// the suppressions are read before anything runs: their error, not the records'
	badSupp := writeFile(t, filepath.Join(t.TempDir(), "kind.supp"), "# ok so far\ncq-overrun program=ib_*\nleak\n")
	badKey := writeFile(t, filepath.Join(t.TempDir(), "key.supp"), "cq-overrun qpn=7\n")
	badGlob := writeFile(t, filepath.Join(t.TempDir(), "glob.supp"), "cq-overrun program=[x\n")
	wantRefused(t, []string{"trace"}, []badInput{
		{nil, exitError, "give a program to run (after --) or --from FILE"},
		{[]string{"--from", bad, "--", "true"}, exitError, "not both"},
		{[]string{"--last-wqe", "maybe", "--from", bad}, exitError, `"maybe" for "--last-wqe" flag: want one of auto, raises, never`},
		{[]string{"--from", bad}, exitError, "bad trace record: line 1"},
		{[]string{"--suppressions", badSupp, "--from", bad}, exitError, badSupp + `:3: "leak" is not a kind of finding: want one of destroyed-with-outstanding,`},
		{[]string{"--suppressions", badKey, "--from", bad}, exitError, badKey + `:1: bad suppression: "qpn=7": want program=, device=, queue= or caller= after the kind`},
		{[]string{"--suppressions", badGlob, "--from", bad}, exitError, badGlob + `:1: bad suppression: program="[x": syntax error in pattern`},
		{[]string{"--suppressions", filepath.Join(t.TempDir(), "none.supp"), "--from", bad}, exitError, "none.supp: no such file"},
		{[]string{"--error-exitcode", "2", "--from", bad}, exitError, `"2" for "--error-exitcode" flag: want 0 to 125, not 2 or 3`},
		{[]string{"--from", filepath.Join(t.TempDir(), "none")}, exitError, "no such file"},
	})
}

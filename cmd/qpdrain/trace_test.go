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
	// an accepted kind: counted, not a finding, exit 0; another kind is still one
	out, err = runSub("trace", "--last-wqe", "raises", "--accept", "srq-destroyed-before-last-wqe", "--from", rec)
	if code := exitCode(err); code != exitClean {
		t.Fatalf("--accept: exit %d (%v), want clean:\n%s", code, err, out)
	}
	wantAll(t, "--accept report", out, "\nclean\n1 finding(s) accepted (--accept), not shown: 1 srq-destroyed-before-last-wqe\n")
	out, err = runSub("trace", "--last-wqe", "raises", "--accept", "cq-overrun", "--from", rec)
	if code := exitCode(err); code != exitFindings {
		t.Fatalf("--accept of another kind: exit %d (%v), want findings:\n%s", code, err, out)
	}
}

func TestTraceBadArgs(t *testing.T) {
	bad := writeFile(t, filepath.Join(t.TempDir(), "bad.rec"), "open t=1 pid=1\n")
	wantRefused(t, []string{"trace"}, []badInput{
		{nil, exitError, "give a program to run (after --) or --from FILE"},
		{[]string{"--from", bad, "--", "true"}, exitError, "not both"},
		{[]string{"--last-wqe", "maybe", "--from", bad}, exitError, `"maybe" for "--last-wqe" flag: want one of auto, raises, never`},
		{[]string{"--from", bad}, exitError, "bad trace record: line 1"},
		{[]string{"--accept", "leak", "--from", bad}, exitError, `"leak" is not a kind of finding: want one of destroyed-with-outstanding,`},
		{[]string{"--from", filepath.Join(t.TempDir(), "none")}, exitError, "no such file"},
	})
}

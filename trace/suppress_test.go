package trace

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestSuppress: a suppression matches its kind and each of program (base
// name, or whole path with a "/"), device and queue it gives; the first
// matching line suppresses a finding, which is counted by that line; the
// others stay findings.
func TestSuppress(t *testing.T) {
	s := &stream{}
	s.at(0, "start", "exe=/usr/bin/ibv_rc_pingpong")
	s.b.WriteString(rcPair().b.String())
	s.at(10, "recv", "qp=0x32", "wr=0x1").
		at(10, "send", "qp=0x31", "wr=0x2", "op=2", "sig=1").
		at(20, "exit")
	fmt.Fprintf(&s.b, "start t=%d pid=300 tid=300 exe=/opt/rdma/server\n", 5_030_000_000)
	for _, r := range []string{"open ctx=0x10 dev=mlx5_0", "cq ctx=0x10 cq=0x20 cqe=16 ex=0",
		"qp ctx=0x10 qp=0x31 qpn=40 type=2 scq=0x20 rcq=0x20 srq=0x0 sig_all=0 ex=0", "recv qp=0x31 wr=0x1", "exit"} {
		k, rest, _ := strings.Cut(r, " ")
		fmt.Fprintf(&s.b, "%s t=%d pid=300 tid=300 %s\n", k, 5_031_000_000, rest)
	}
	recs := s.records(t)
	base := Analyze(recs, Options{})
	if len(base.Findings) != 3 || base.Findings[0].Program != "/usr/bin/ibv_rc_pingpong" || base.Findings[2].Program != "/opt/rdma/server" {
		t.Fatalf("want 3 findings with their programs:\n%+v", base.Findings)
	}
	for _, tc := range []struct {
		file string
		// want: for each finding (pid 100 send, pid 100 recv, pid 300
		// recv, in report order), the line suppressing it or ""
		want [3]string
	}{
		{"destroyed-with-outstanding", [3]string{"s:1", "s:1", "s:1"}},
		{"cq-overrun\ndestroyed-with-outstanding program=ibv_rc_pingpong queue=recv\ndestroyed-with-outstanding program=/opt/*/server",
			[3]string{"", "s:2", "s:3"}},
		{"destroyed-with-outstanding program=server", [3]string{"", "", "s:1"}},
		{"destroyed-with-outstanding program=/usr/bin/*", [3]string{"s:1", "s:1", ""}},
		{"destroyed-with-outstanding program=/usr/bin", [3]string{"", "", ""}},
		{"destroyed-with-outstanding device=mlx5_*\ndestroyed-with-outstanding queue=send", [3]string{"s:2", "", "s:1"}},
		{"# a comment\n\n  destroyed-with-outstanding   device=rxe0  queue=recv  ", [3]string{"", "s:3", ""}},
		{"srq-destroyed-before-last-wqe", [3]string{"", "", ""}},
	} {
		sups, err := ParseSuppressions(strings.NewReader(tc.file), "s")
		if err != nil {
			t.Fatalf("%q: %v", tc.file, err)
		}
		rep := Analyze(recs, Options{})
		var order [3]string
		for i, f := range base.Findings {
			order[i] = fmt.Sprintf("%d %s", f.PID, f.Queue)
		}
		rep.Suppress(sups)
		var got [3]string
		for _, f := range rep.Suppressed {
			for i := range order {
				if order[i] == fmt.Sprintf("%d %s", f.PID, f.Queue) {
					got[i] = f.SuppressedBy
				}
			}
		}
		n := 0
		for _, w := range tc.want {
			if w == "" {
				n++
			}
		}
		if got != tc.want || len(rep.Findings) != n || rep.Clean() != (n == 0) {
			t.Errorf("%q: suppressed by %q (findings %v in order), want %q; %d findings left", tc.file, got, order, tc.want, len(rep.Findings))
		}
	}
	// the report names each process's program and counts the suppressed by line
	sups, _ := ParseSuppressions(strings.NewReader("destroyed-with-outstanding program=ibv_rc_pingpong\ndestroyed-with-outstanding"), "ci.supp")
	rep := Analyze(recs, Options{})
	rep.Suppress(sups)
	out := text(t, rep)
	for _, w := range []string{"pid 100 (ibv_rc_pingpong) on rxe0: 2 QPs", "pid 300 (server) on mlx5_0:", "\nclean\n",
		"3 finding(s) suppressed, not shown: 2 destroyed-with-outstanding (ci.supp:1), 1 destroyed-with-outstanding (ci.supp:2)\n"} {
		if !strings.Contains(out, w) {
			t.Errorf("report lacks %q:\n%s", w, out)
		}
	}
	// a finding from records without the program (an older shim) matches
	// no program= line
	old := Analyze(recs[1:], Options{})
	sups, _ = ParseSuppressions(strings.NewReader("destroyed-with-outstanding program=*"), "s")
	if old.Suppress(sups); len(old.Suppressed) != 1 || old.Suppressed[0].PID != 300 {
		t.Errorf("program=* suppressed %+v, want pid 300's finding only", old.Suppressed)
	}
}

// TestParseSuppressionsErrors: each bad line is refused with its file and
// line, wrapping ErrBadSuppression (ErrUnknownKind for a bad kind).
func TestParseSuppressionsErrors(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{"leak", `f:2: "leak" is not a kind of finding: want one of destroyed-with-outstanding,`},
		{"cq-overrun qpn=17", `f:2: bad suppression: "qpn=17": want program=, device=, queue= or caller= after the kind`},
		{"cq-overrun program", `f:2: bad suppression: "program": want program=VALUE`},
		{"cq-overrun device=", `f:2: bad suppression: "device=": want device=VALUE`},
		{"cq-overrun queue=sq", `f:2: bad suppression: queue="sq": want send, recv or srq`},
		{"cq-overrun program=a program=b", `f:2: bad suppression: program= given twice`},
		{`cq-overrun program=a\`, `f:2: bad suppression: program="a\\": syntax error in pattern`},
		{"program=x cq-overrun", `f:2: "program=x" is not a kind of finding`},
		{"cq-overrun caller=prog!", `f:2: bad suppression: caller="prog!": empty pattern`},
		{"cq-overrun caller=[!f", `f:2: bad suppression: caller="[!f": syntax error in pattern`},
	} {
		_, err := ParseSuppressions(strings.NewReader("# first\n"+tc.line+"\ncq-overrun\n"), "f")
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) || !errors.Is(err, ErrBadSuppression) && !errors.Is(err, ErrUnknownKind) {
			t.Errorf("%q: %v, want %q...", tc.line, err, tc.want)
		}
	}
}

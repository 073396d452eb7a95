package trace

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/internal/testing/testmain"
)

func TestMain(m *testing.M) { testmain.Run(m) }

// stream builds a synthetic record stream, one process (pid 100), times in ms.
type stream struct{ b strings.Builder }

func (s *stream) at(ms int, kind string, kv ...string) *stream { return s.by(100, ms, kind, kv...) }

// by adds a record of thread tid of pid 100.
func (s *stream) by(tid, ms int, kind string, kv ...string) *stream {
	fmt.Fprintf(&s.b, "%s t=%d pid=100 tid=%d", kind, int64(ms)*1_000_000+5_000_000_000, tid)
	for _, x := range kv {
		s.b.WriteString(" " + x)
	}
	s.b.WriteString("\n")
	return s
}

func (s *stream) records(t *testing.T) []Record {
	t.Helper()
	recs, err := Parse(strings.NewReader(s.b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// rcPair opens rxe0 and creates one CQ (cqe 16) and two RC QPs on it, qpn 17
// and 18, moved to RTS: what the synthetic programs share.
func rcPair() *stream {
	s := &stream{}
	s.at(0, "open", "ctx=0x10", "dev=rxe0", "traced=1").
		at(1, "cq", "ctx=0x10", "cq=0x20", "cqe=16", "ex=0")
	for _, q := range []struct{ ptr, qpn string }{{"0x31", "17"}, {"0x32", "18"}} {
		s.at(2, "qp", "ctx=0x10", "qp="+q.ptr, "qpn="+q.qpn, "type=2", "scq=0x20", "rcq=0x20", "srq=0x0", "max_send_wr=16", "max_recv_wr=16", "sig_all=0", "ex=0")
		for _, st := range []string{"1", "2", "3"} {
			s.at(3, "mod", "qp="+q.ptr, "state="+st, "ret=0")
		}
	}
	return s
}

// traffic: qpn 17 sends one message to qpn 18, both completions polled.
func (s *stream) traffic(ms int) *stream {
	return s.at(ms, "recv", "qp=0x32", "wr=0x1").
		at(ms, "send", "qp=0x31", "wr=0x2", "op=2", "sig=1").
		at(ms+1, "wc", "cq=0x20", "wr=0x2", "st=0", "op=0", "qpn=17").
		at(ms+1, "wc", "cq=0x20", "wr=0x1", "st=0", "op=128", "qpn=18")
}

// teardown: both QPs to ERROR, destroyed, then the CQ; the device closed.
func (s *stream) teardown(ms int) *stream {
	return s.at(ms, "mod", "qp=0x31", "state=6", "ret=0").
		at(ms, "mod", "qp=0x32", "state=6", "ret=0").
		at(ms+1, "qpd", "qp=0x31", "begin=1").at(ms+1, "qpd", "qp=0x31", "ret=0").
		at(ms+1, "qpd", "qp=0x32", "begin=1").at(ms+1, "qpd", "qp=0x32", "ret=0").
		at(ms+2, "cqd", "cq=0x20", "begin=1").at(ms+2, "cqd", "cq=0x20", "ret=0").
		at(ms+3, "close", "ctx=0x10", "ret=0").at(ms+3, "exit")
}

// srqPair: like rcPair, qpn 18 on SRQ 0x40 with 4 receives posted to the SRQ.
func srqPair() *stream {
	s := &stream{}
	s.at(0, "open", "ctx=0x10", "dev=rxe0", "traced=1").
		at(1, "cq", "ctx=0x10", "cq=0x20", "cqe=16", "ex=0").
		at(1, "srq", "ctx=0x10", "srq=0x40", "max_wr=16")
	for i := 1; i <= 4; i++ {
		s.at(1, "srecv", "srq=0x40", fmt.Sprintf("wr=0x%x", 100+i))
	}
	s.at(2, "qp", "ctx=0x10", "qp=0x32", "qpn=18", "type=2", "scq=0x20", "rcq=0x20", "srq=0x40", "max_send_wr=16", "max_recv_wr=0", "sig_all=0", "ex=0")
	for _, st := range []string{"1", "2", "3"} {
		s.at(3, "mod", "qp=0x32", "state="+st, "ret=0")
	}
	return s.at(10, "mod", "qp=0x32", "state=6", "ret=0")
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func kinds(rep *Report) []Kind {
	var ks []Kind
	for _, f := range rep.Findings {
		ks = append(ks, f.Kind)
	}
	return ks
}

func TestAnalyze(t *testing.T) {
	raises := Options{LastWQE: func(dev string) (LastWQE, bool) {
		return LastWQE{Raises: true, Source: "test"}, dev == "rxe0"
	}}
	for _, tc := range []struct {
		name     string
		s        *stream
		o        Options
		want     []Kind
		evidence string // in the first finding's evidence
	}{
		{"clean", rcPair().traffic(10).teardown(20), Options{}, nil, ""},
		{"clean with flushes", rcPair().traffic(10).
			at(15, "recv", "qp=0x32", "wr=0x7").at(15, "recv", "qp=0x32", "wr=0x8").
			at(20, "mod", "qp=0x32", "state=6", "ret=0").
			at(21, "wc", "cq=0x20", "wr=0x7", "st=5", "op=0", "qpn=18").
			at(21, "wc", "cq=0x20", "wr=0x8", "st=5", "op=0", "qpn=18").teardown(30), Options{}, nil, ""},
		{"unsignaled sends retire with the signaled one after them", rcPair().
			at(10, "recv", "qp=0x32", "wr=0x1").at(10, "recv", "qp=0x32", "wr=0x2").
			at(10, "send", "qp=0x31", "wr=0xa", "op=2", "sig=0").
			at(10, "send", "qp=0x31", "wr=0xb", "op=2", "sig=1").
			at(11, "wc", "cq=0x20", "wr=0xb", "st=0", "op=0", "qpn=17").
			at(11, "wc", "cq=0x20", "wr=0x1", "st=0", "op=128", "qpn=18").
			at(11, "wc", "cq=0x20", "wr=0x2", "st=0", "op=128", "qpn=18").teardown(20), Options{}, nil, ""},
		{"one signaled send in many, every WR with the same id (perftest)", func() *stream {
			s := rcPair()
			for i := 1; i <= 8; i++ {
				s.at(10, "send", "qp=0x31", "wr=0x0", "op=0", fmt.Sprintf("sig=%d", b2i(i%4 == 0)))
			}
			return s.at(11, "wc", "cq=0x20", "wr=0x0", "st=0", "op=1", "qpn=17").
				at(11, "wc", "cq=0x20", "wr=0x0", "st=0", "op=1", "qpn=17").teardown(20)
		}(), Options{}, nil, ""},
		{"an older shim's WR not posted (ok=0) is not outstanding", rcPair().traffic(10).
			at(15, "send", "qp=0x31", "wr=0x9", "op=2", "sig=1", "ok=0", "ret=12").teardown(20), Options{}, nil, ""},
		{"RESET empties the queues", rcPair().at(10, "recv", "qp=0x32", "wr=0x1").
			at(11, "mod", "qp=0x32", "state=0", "ret=0").teardown(20), Options{}, nil, ""},
		{"destroyed with outstanding", rcPair().
			at(10, "recv", "qp=0x32", "wr=0x1").at(10, "recv", "qp=0x32", "wr=0x2").
			teardown(20), Options{}, []Kind{DestroyedWithOutstanding},
			"qpn 18 destroyed with 2 WR(s) outstanding on its recv queue (first wr_id 0x1), 1.0 ms after ERROR"},
		{"destroyed without ERROR", rcPair().at(10, "send", "qp=0x31", "wr=0x5", "op=2", "sig=1").
			at(20, "qpd", "qp=0x31", "ret=0").at(20, "qpd", "qp=0x32", "ret=0"), Options{}, []Kind{DestroyedWithOutstanding},
			"on its send queue (first wr_id 0x5), it never entered ERROR"},
		{"srq QP destroyed before Last WQE Reached", srqPair().at(11, "qpd", "qp=0x32", "ret=0").at(12, "exit"), raises,
			[]Kind{SRQDestroyedBeforeLastWQE}, "qpn 18 (on SRQ 0x40) was destroyed 1.0 ms after ERROR, before the program got IBV_EVENT_QP_LAST_WQE_REACHED"},
		{"srq QP after its Last WQE Reached", srqPair().
			at(11, "ev", "ctx=0x10", "type=16", "qp=0x32", "qpn=18").at(11, "ack", "type=16", "qp=0x32", "qpn=18").
			at(12, "qpd", "qp=0x32", "ret=0").at(12, "exit"), raises, nil, ""},
		{"srq QP, the device does not raise it: a note", srqPair().at(11, "qpd", "qp=0x32", "ret=0").at(12, "exit"),
			Options{LastWQE: func(string) (LastWQE, bool) { return LastWQE{Source: "test"}, true }}, nil, ""},
		{"srq QP, device unknown: a note", srqPair().at(11, "qpd", "qp=0x32", "ret=0").at(12, "exit"), Options{}, nil, ""},
		{"srq QP, the trace shows the device raises it", srqPair().
			at(2, "qp", "ctx=0x10", "qp=0x33", "qpn=19", "type=2", "scq=0x20", "rcq=0x20", "srq=0x40", "max_send_wr=16", "max_recv_wr=0", "sig_all=0", "ex=0").
			at(3, "mod", "qp=0x33", "state=2", "ret=0").at(10, "mod", "qp=0x33", "state=6", "ret=0").
			at(11, "ev", "ctx=0x10", "type=16", "qp=0x33", "qpn=19").at(11, "ack", "type=16", "qp=0x33", "qpn=19").
			at(12, "qpd", "qp=0x33", "ret=0").at(12, "qpd", "qp=0x32", "ret=0").at(13, "exit"), Options{},
			[]Kind{SRQDestroyedBeforeLastWQE}, "rxe0 raises it (this trace: rxe0 raised it for qpn 19)"},
		{"completion for a destroyed QP", rcPair().
			at(10, "recv", "qp=0x32", "wr=0x1").at(10, "send", "qp=0x31", "wr=0x2", "op=2", "sig=1").
			at(11, "qpd", "qp=0x31", "ret=0").
			at(12, "wc", "cq=0x20", "wr=0x2", "st=0", "op=0", "qpn=17").
			at(12, "wc", "cq=0x20", "wr=0x1", "st=0", "op=128", "qpn=18").
			at(20, "mod", "qp=0x32", "state=6", "ret=0").at(21, "qpd", "qp=0x32", "ret=0").at(22, "exit"), Options{},
			[]Kind{CompletionForDestroyedQP}, "1 completion(s) of qpn 17 polled after it was destroyed, the first 1.0 ms after ibv_destroy_qp"},
		{"CQ over its size", func() *stream {
			s := rcPair()
			for i := 0; i < 20; i++ {
				s.at(10, "recv", "qp=0x32", fmt.Sprintf("wr=0x%x", i+1))
			}
			for i := 0; i < 20; i++ {
				s.at(11, "send", "qp=0x31", "wr=0x99", "op=0", "sig=1").
					at(12, "wc", "cq=0x20", "wr=0x99", "st=0", "op=0", "qpn=17").
					at(12, "wc", "cq=0x20", fmt.Sprintf("wr=0x%x", i+1), "st=0", "op=128", "qpn=18")
			}
			return s.teardown(20)
		}(), Options{}, []Kind{CQOverSize}, "up to 21 WRs outstanding whose completions go to this CQ of cqe 16"},
		{"CQ overrun", rcPair().traffic(10).at(15, "pollerr", "cq=0x20", "ret=-1").teardown(20), Options{},
			[]Kind{CQOverrun}, "ibv_poll_cq returned -1"},
		{"CQ_ERR", rcPair().traffic(10).at(15, "ev", "ctx=0x10", "type=0", "cq=0x20").at(15, "ack", "type=0", "cq=0x20").teardown(20), Options{},
			[]Kind{CQOverrun}, "IBV_EVENT_CQ_ERR at 15.0 ms"},
		{"async event not acknowledged", srqPair().
			at(11, "ev", "ctx=0x10", "type=16", "qp=0x32", "qpn=18").at(20, "exit"), raises,
			[]Kind{EventNotAcked}, "1 IBV_EVENT_QP_LAST_WQE_REACHED of qpn 18 never acknowledged"},
		{"posted in ERROR, never flushed, process ended", rcPair().traffic(10).
			at(20, "mod", "qp=0x32", "state=6", "ret=0").at(30, "recv", "qp=0x32", "wr=0x5").at(1300, "exit"), Options{},
			[]Kind{PostedInErrorNotFlushed}, "1 WR(s) posted to the recv queue of qpn 18 in ERROR (first wr_id 0x5, 10.0 ms after ERROR) had no completion 1270.0 ms later, when the process ended"},
		{"posted in ERROR, never flushed, then destroyed", rcPair().traffic(10).
			at(20, "mod", "qp=0x32", "state=6", "ret=0").at(30, "recv", "qp=0x32", "wr=0x5").teardown(1300), Options{},
			[]Kind{PostedInErrorNotFlushed}, "when it was destroyed"},
		{"posted in ERROR and destroyed at once: destroyed with outstanding", rcPair().traffic(10).
			at(20, "mod", "qp=0x32", "state=6", "ret=0").at(30, "recv", "qp=0x32", "wr=0x5").teardown(31), Options{},
			[]Kind{DestroyedWithOutstanding}, "qpn 18 destroyed with 1 WR(s) outstanding on its recv queue"},
		{"posted in ERROR, flushed", rcPair().traffic(10).
			at(20, "mod", "qp=0x32", "state=6", "ret=0").at(30, "recv", "qp=0x32", "wr=0x5").
			at(31, "wc", "cq=0x20", "wr=0x5", "st=5", "op=0", "qpn=18").teardown(1300), Options{}, nil, ""},
		{"an ibv_qp_ex send path the shim could not take over is not judged", func() *stream {
			s := &stream{}
			return s.at(0, "open", "ctx=0x10", "dev=rxe0").at(1, "cq", "ctx=0x10", "cq=0x20", "cqe=16", "ex=0").
				at(2, "qp", "ctx=0x10", "qp=0x31", "qpn=17", "type=2", "scq=0x20", "rcq=0x20", "srq=0x0", "ex=1").
				at(3, "send", "qp=0x31", "wr=0x1", "op=0", "sig=1").at(4, "qpd", "qp=0x31", "ret=0")
		}(), Options{}, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := Analyze(tc.s.records(t), tc.o)
			got := kinds(rep)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("findings %v, want %v:\n%s", got, tc.want, text(t, rep))
			}
			if tc.evidence != "" && !strings.Contains(rep.Findings[0].Evidence, tc.evidence) {
				t.Errorf("evidence %q lacks %q", rep.Findings[0].Evidence, tc.evidence)
			}
			for _, f := range rep.Findings {
				if f.Rule == "" || f.Rule != Rule(f.Kind) {
					t.Errorf("%s has no rule", f.Kind)
				}
			}
			out := text(t, rep)
			if rep.Clean() != strings.Contains(out, "\nclean\n") {
				t.Errorf("text says clean %v, report %v:\n%s", !rep.Clean(), rep.Clean(), out)
			}
		})
	}
}

func text(t *testing.T, rep *Report) string {
	t.Helper()
	var b bytes.Buffer
	if err := rep.WriteText(&b, true); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestNotes(t *testing.T) {
	recs := srqPair().at(11, "qpd", "qp=0x32", "ret=0").at(12, "exit").records(t)
	z := NewAnalyzer(Options{})
	for _, r := range recs {
		z.Add(r)
	}
	if got := z.NeedsLastWQE(); fmt.Sprint(got) != "[rxe0]" {
		t.Errorf("NeedsLastWQE = %v, want [rxe0]", got)
	}
	if rep := z.Report(func(string) (LastWQE, bool) { return LastWQE{Raises: true, Source: "probe"}, true }); fmt.Sprint(kinds(rep)) != "[srq-destroyed-before-last-wqe]" {
		t.Errorf("Report with the device's answer: %v", kinds(rep))
	}
	rep := Analyze(recs, Options{})
	if len(rep.Notes) != 1 || !strings.Contains(rep.Notes[0], "whether rxe0 raises it is unknown") {
		t.Errorf("notes %q", rep.Notes)
	}
	if len(rep.Processes) != 1 || rep.Processes[0].SRQs != 1 || rep.Processes[0].Posted != 4 || !rep.Processes[0].Exited {
		t.Errorf("processes %+v", rep.Processes)
	}
	b, err := json.Marshal(rep)
	if err != nil || !strings.Contains(string(b), `"findings":[]`) {
		t.Errorf("JSON %s, %v", b, err)
	}
	// A process that never opened a device is not listed.
	empty := Analyze((&stream{}).at(0, "fail", "verb=ibv_create_cq", "errno=12").records(t), Options{})
	if len(empty.Processes) != 0 || !strings.Contains(text(t, empty), "no process of the program opened an RDMA device\nclean\n") {
		t.Errorf("empty trace: %+v", empty)
	}
}

func TestParseErrors(t *testing.T) {
	for _, in := range []string{
		"open t=1 pid=1\n",
		"open t=x pid=1 tid=1 ctx=0x1 dev=a\n",
		"open t=1 pid=1 tid=1 dev=a\n",
		"wc t=1 pid=1 tid=1 cq=0x1 wr=zz st=0 qpn=1\n",
		"open t=1 pid=1 tid=1 ctx\n",
		"exit t=1 pid=1 tid=1",
	} {
		if _, err := Parse(strings.NewReader(in)); !errors.Is(err, ErrBadRecord) {
			t.Errorf("Parse(%q) = %v, want ErrBadRecord", in, err)
		}
	}
	recs, err := Parse(strings.NewReader("newkind t=1 pid=1 tid=2 what=ever\n"))
	if err != nil || len(recs) != 1 || recs[0].TID != 2 || recs[0].Str("what") != "ever" {
		t.Errorf("an unknown kind: %+v, %v", recs, err)
	}
}

// TestRules holds each rule of the analysis by a synthetic record stream
// that gives another verdict when that rule is broken.
func TestRules(t *testing.T) {
	raises := Options{LastWQE: func(string) (LastWQE, bool) { return LastWQE{Raises: true, Source: "test"}, true }}
	srqQP := func(s *stream, ptr, qpn string) *stream {
		return s.at(2, "qp", "ctx=0x10", "qp="+ptr, "qpn="+qpn, "type=2", "scq=0x20", "rcq=0x20", "srq=0x40", "max_send_wr=16", "max_recv_wr=0", "sig_all=0", "ex=0")
	}
	for _, tc := range []struct {
		rule  string
		s     *stream
		o     Options
		want  []Kind
		check func(t *testing.T, rep *Report)
	}{
		{"a send recorded unsignaled on a QP created with sq_sig_all counts as signaled", func() *stream {
			s := &stream{}
			s.at(0, "open", "ctx=0x10", "dev=rxe0").at(1, "cq", "ctx=0x10", "cq=0x20", "cqe=16", "ex=0").
				at(2, "qp", "ctx=0x10", "qp=0x31", "qpn=17", "type=2", "scq=0x20", "rcq=0x20", "srq=0x0", "sig_all=1", "ex=0")
			return s.at(3, "send", "qp=0x31", "wr=0x1", "op=0", "sig=0").at(3, "send", "qp=0x31", "wr=0x2", "op=0", "sig=0").
				at(4, "wc", "cq=0x20", "wr=0x1", "st=0", "op=0", "qpn=17").at(4, "wc", "cq=0x20", "wr=0x2", "st=0", "op=0", "qpn=17").
				at(5, "qpd", "qp=0x31", "ret=0").at(6, "exit")
		}(), Options{}, nil, nil},
		{"a flushed completion retires the WR with its wr_id in whichever queue holds it", rcPair().
			at(10, "recv", "qp=0x32", "wr=0x7").at(10, "send", "qp=0x32", "wr=0x8", "op=0", "sig=1").
			at(20, "mod", "qp=0x32", "state=6", "ret=0").
			// the opcodes of flushed completions are garbage (ibv_poll_cq(3)): a send's opcode on the receive, and back
			at(21, "wc", "cq=0x20", "wr=0x7", "st=5", "op=0", "qpn=18").
			at(21, "wc", "cq=0x20", "wr=0x8", "st=5", "op=128", "qpn=18").teardown(30), Options{}, nil, nil},
		{"a successful receive completion of an SRQ QP retires that WR from the SRQ", func() *stream {
			s := srqPair() // 4 receives on the SRQ, CQ of cqe 16
			for i := 5; i <= 24; i++ {
				s.at(20, "srecv", "srq=0x40", fmt.Sprintf("wr=0x%x", 100+i)).
					at(21, "wc", "cq=0x20", fmt.Sprintf("wr=0x%x", 100+i-4), "st=0", "op=128", "qpn=18")
			}
			return s.at(30, "ev", "ctx=0x10", "type=16", "qp=0x32", "qpn=18").at(30, "ack", "type=16", "qp=0x32", "qpn=18").
				at(31, "qpd", "qp=0x32", "ret=0").at(32, "exit")
		}(), raises, nil, nil},
		{"RESET clears the QP's ERROR time", rcPair().
			at(10, "mod", "qp=0x32", "state=6", "ret=0").at(11, "mod", "qp=0x32", "state=0", "ret=0").
			at(12, "mod", "qp=0x32", "state=1", "ret=0").at(12, "recv", "qp=0x32", "wr=0x5").
			at(1000, "qpd", "qp=0x32", "ret=0").at(1000, "qpd", "qp=0x31", "ret=0").at(1001, "exit"), Options{},
			[]Kind{DestroyedWithOutstanding}, func(t *testing.T, rep *Report) {
				if !strings.Contains(rep.Findings[0].Evidence, "it never entered ERROR") {
					t.Errorf("evidence %q: the QP left ERROR through RESET", rep.Findings[0].Evidence)
				}
			}},
		{"a WR posted after ibv_destroy_qp returned 0 is not outstanding", rcPair().traffic(10).teardown(20).
			at(30, "send", "qp=0x31", "wr=0x9", "op=0", "sig=1").at(30, "recv", "qp=0x32", "wr=0x9"), Options{},
			nil, func(t *testing.T, rep *Report) {
				if rep.Processes[0].Posted != 2 {
					t.Errorf("%d WRs posted counted, want 2 (not the 2 posted to destroyed QPs)", rep.Processes[0].Posted)
				}
			}},
		{"exactly cqe WRs outstanding is not over-size", func() *stream {
			s := rcPair()
			for i := 1; i <= 16; i++ {
				s.at(10, "recv", "qp=0x32", fmt.Sprintf("wr=0x%x", i))
			}
			for i := 1; i <= 16; i++ {
				s.at(11, "wc", "cq=0x20", fmt.Sprintf("wr=0x%x", i), "st=0", "op=128", "qpn=18")
			}
			return s.teardown(20)
		}(), Options{}, nil, nil},
		{"an SRQ QP destroyed before it reached RTR needs no Last WQE Reached", srqQP(func() *stream {
			s := &stream{}
			return s.at(0, "open", "ctx=0x10", "dev=rxe0").at(1, "cq", "ctx=0x10", "cq=0x20", "cqe=16", "ex=0").
				at(1, "srq", "ctx=0x10", "srq=0x40", "max_wr=16")
		}(), "0x32", "18").at(3, "mod", "qp=0x32", "state=1", "ret=0").at(4, "qpd", "qp=0x32", "ret=0").at(5, "exit"), raises, nil, nil},
		{"acks match events by object, not by type", srqQP(srqPair(), "0x33", "19").
			at(11, "ev", "ctx=0x10", "type=16", "qp=0x32", "qpn=18").at(11, "ev", "ctx=0x10", "type=16", "qp=0x33", "qpn=19").
			at(12, "ack", "type=16", "qp=0x33", "qpn=19").at(12, "ack", "type=16", "qp=0x33", "qpn=19").at(13, "exit"), raises,
			[]Kind{EventNotAcked}, func(t *testing.T, rep *Report) {
				if f := rep.Findings[0]; f.Object != "IBV_EVENT_QP_LAST_WQE_REACHED of qpn 18" || f.Count != 1 {
					t.Errorf("finding about %q (%d), want qpn 18's event, once", f.Object, f.Count)
				}
			}},
		{"a non-flush error completion moves a connected QP to ERROR", rcPair().
			at(10, "send", "qp=0x31", "wr=0x1", "op=0", "sig=1").
			at(11, "wc", "cq=0x20", "wr=0x1", "st=12", "op=0", "qpn=17").
			at(20, "recv", "qp=0x31", "wr=0x2").
			at(1000, "qpd", "qp=0x31", "ret=0").at(1000, "qpd", "qp=0x32", "ret=0").at(1001, "exit"), Options{},
			[]Kind{PostedInErrorNotFlushed}, nil},
		{"an error completion leaves a UD QP as it was", func() *stream {
			s := &stream{}
			return s.at(0, "open", "ctx=0x10", "dev=rxe0").at(1, "cq", "ctx=0x10", "cq=0x20", "cqe=16", "ex=0").
				at(2, "qp", "ctx=0x10", "qp=0x31", "qpn=17", "type=4", "scq=0x20", "rcq=0x20", "srq=0x0", "sig_all=0", "ex=0").
				at(10, "send", "qp=0x31", "wr=0x1", "op=0", "sig=1").
				at(11, "wc", "cq=0x20", "wr=0x1", "st=4", "op=0", "qpn=17").
				at(20, "recv", "qp=0x31", "wr=0x2").at(1000, "qpd", "qp=0x31", "ret=0").at(1001, "exit")
		}(), Options{}, []Kind{DestroyedWithOutstanding}, nil},
		{"the devices the trace saw raise Last WQE Reached are not probed again", srqQP(srqPair(), "0x33", "19").
			at(3, "mod", "qp=0x33", "state=2", "ret=0").at(10, "mod", "qp=0x33", "state=6", "ret=0").
			at(11, "ev", "ctx=0x10", "type=16", "qp=0x33", "qpn=19").at(11, "ack", "type=16", "qp=0x33", "qpn=19").
			at(12, "qpd", "qp=0x33", "ret=0").at(12, "qpd", "qp=0x32", "ret=0").at(13, "exit"), Options{},
			[]Kind{SRQDestroyedBeforeLastWQE}, nil},
		{"the queues of a CQ made by ibv_create_cq_ex whose polls the shim could not take over (ex=1) are not judged", func() *stream {
			s := &stream{}
			return s.at(0, "open", "ctx=0x10", "dev=rxe0").at(1, "cq", "ctx=0x10", "cq=0x20", "cqe=16", "ex=1").
				at(2, "qp", "ctx=0x10", "qp=0x31", "qpn=17", "type=2", "scq=0x20", "rcq=0x20", "srq=0x0", "sig_all=0", "ex=0").
				at(10, "recv", "qp=0x31", "wr=0x2").at(20, "qpd", "qp=0x31", "ret=0").at(21, "exit")
		}(), Options{}, nil, func(t *testing.T, rep *Report) {
			if len(rep.Notes) != 1 || !strings.Contains(rep.Notes[0], "ibv_create_cq_ex") {
				t.Errorf("notes %q, want the CQ's", rep.Notes)
			}
		}},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			z := NewAnalyzer(tc.o)
			for _, r := range tc.s.records(t) {
				z.Add(r)
			}
			if strings.Contains(tc.rule, "not probed again") {
				if got := z.NeedsLastWQE(); len(got) != 0 {
					t.Errorf("NeedsLastWQE = %v: the trace itself showed rxe0 raises it", got)
				}
			}
			rep := z.Report(tc.o.LastWQE)
			if got := kinds(rep); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("findings %v, want %v:\n%s", got, tc.want, text(t, rep))
			}
			if tc.check != nil {
				tc.check(t, rep)
			}
		})
	}
}

// rping: one RC QP whose send and receive queues complete to one CQ, every
// WR with wr_id 0 (rping's pattern), in loopback with the QP of rcPair.
func rping() *stream {
	s := &stream{}
	return s.at(0, "open", "ctx=0x10", "dev=rxe0").at(1, "cq", "ctx=0x10", "cq=0x20", "cqe=16", "ex=0").
		at(2, "qp", "ctx=0x10", "qp=0x31", "qpn=17", "type=2", "scq=0x20", "rcq=0x20", "srq=0x0", "sig_all=0", "ex=0").
		at(3, "mod", "qp=0x31", "state=3", "ret=0")
}

// TestAmbiguousFlush: a flushed completion whose wr_id both queues hold is
// attributed only when the counts leave one answer, else its WRs are a
// note, never a finding against the program's own counts.
func TestAmbiguousFlush(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    *stream
		want []Kind
		note string
	}{
		{"the send's success after the receive's flush: clean", rping().
			at(10, "recv", "qp=0x31", "wr=0x0").at(10, "send", "qp=0x31", "wr=0x0", "op=2", "sig=1").
			at(20, "mod", "qp=0x31", "state=6", "ret=0").
			at(21, "wc", "cq=0x20", "wr=0x0", "st=5", "op=0", "qpn=17"). // the receive's flush, opcode garbage
			at(22, "wc", "cq=0x20", "wr=0x0", "st=0", "op=0", "qpn=17"). // the send's success, after it
			at(30, "qpd", "qp=0x31", "ret=0").at(31, "exit"), nil, ""},
		{"two flushes for two of four WRs: not judged, a note", rping().
			at(10, "recv", "qp=0x31", "wr=0x0").at(10, "recv", "qp=0x31", "wr=0x0").
			at(10, "send", "qp=0x31", "wr=0x0", "op=2", "sig=1").at(10, "send", "qp=0x31", "wr=0x0", "op=2", "sig=1").
			at(20, "mod", "qp=0x31", "state=6", "ret=0").
			at(21, "wc", "cq=0x20", "wr=0x0", "st=5", "op=0", "qpn=17").at(21, "wc", "cq=0x20", "wr=0x0", "st=5", "op=0", "qpn=17").
			at(30, "qpd", "qp=0x31", "ret=0").at(31, "exit"), nil, "qpn 17: flushed completions with wr_id 0x0 came while its send and its receive queue both held"},
		{"all four flushed: clean", rping().
			at(10, "recv", "qp=0x31", "wr=0x0").at(10, "recv", "qp=0x31", "wr=0x0").
			at(10, "send", "qp=0x31", "wr=0x0", "op=2", "sig=1").at(10, "send", "qp=0x31", "wr=0x0", "op=2", "sig=1").
			at(20, "mod", "qp=0x31", "state=6", "ret=0").
			at(21, "wc", "cq=0x20", "wr=0x0", "st=5", "op=0", "qpn=17").at(21, "wc", "cq=0x20", "wr=0x0", "st=5", "op=0", "qpn=17").
			at(21, "wc", "cq=0x20", "wr=0x0", "st=5", "op=0", "qpn=17").at(21, "wc", "cq=0x20", "wr=0x0", "st=5", "op=0", "qpn=17").
			at(30, "qpd", "qp=0x31", "ret=0").at(31, "exit"), nil, ""},
		{"another wr_id left outstanding is still judged", rping().
			at(10, "recv", "qp=0x31", "wr=0x0").at(10, "recv", "qp=0x31", "wr=0x5").
			at(10, "send", "qp=0x31", "wr=0x0", "op=2", "sig=1").
			at(20, "mod", "qp=0x31", "state=6", "ret=0").
			at(21, "wc", "cq=0x20", "wr=0x0", "st=5", "op=0", "qpn=17").
			at(22, "wc", "cq=0x20", "wr=0x0", "st=0", "op=0", "qpn=17").
			at(30, "qpd", "qp=0x31", "ret=0").at(31, "exit"), []Kind{DestroyedWithOutstanding}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := Analyze(tc.s.records(t), Options{})
			if got := kinds(rep); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("findings %v, want %v:\n%s", got, tc.want, text(t, rep))
			}
			if tc.want != nil && !strings.Contains(rep.Findings[0].Evidence, "wr_id 0x5") {
				t.Errorf("evidence %q, want the WR with wr_id 0x5", rep.Findings[0].Evidence)
			}
			notes := strings.Join(rep.Notes, "\n")
			if tc.note == "" && notes != "" || !strings.Contains(notes, tc.note) {
				t.Errorf("notes %q, want %q", notes, tc.note)
			}
		})
	}
}

// TestPostRecords: the shim records a post's WRs before the provider's
// post, so that a completion another thread polls while the post runs
// (siw sends inside ibv_post_send) comes after them; a post that fails adds
// an unposted record from the same thread, which takes back its last WRs
// (bad_wr and those after it), and only those.
func TestPostRecords(t *testing.T) {
	for _, tc := range []struct {
		name   string
		s      *stream
		want   []Kind
		posted int
	}{
		{"a completion polled by another thread while the post runs: clean", rping().
			at(10, "recv", "qp=0x31", "wr=0x0").
			at(11, "send", "qp=0x31", "wr=0x0", "op=2", "sig=1").
			by(200, 11, "wc", "cq=0x20", "wr=0x0", "st=0", "op=0", "qpn=17"). // before the post returned
			by(200, 12, "wc", "cq=0x20", "wr=0x0", "st=0", "op=128", "qpn=17").
			at(20, "mod", "qp=0x31", "state=6", "ret=0").
			at(30, "qpd", "qp=0x31", "ret=0").at(31, "exit"), nil, 2},
		{"a receive chain failed at its second WR, another thread posting between", rcPair().
			at(10, "recv", "qp=0x32", "wr=0x1").
			at(10, "recv", "qp=0x32", "wr=0x2").at(10, "recv", "qp=0x32", "wr=0x3").
			by(200, 10, "recv", "qp=0x32", "wr=0x7"). // while the first is in its post
			at(10, "unposted", "qp=0x32", "wrs=2", "ret=12").
			at(11, "send", "qp=0x31", "wr=0xa", "op=2", "sig=1").at(11, "send", "qp=0x31", "wr=0xb", "op=2", "sig=1").
			at(12, "wc", "cq=0x20", "wr=0xa", "st=0", "op=0", "qpn=17").at(12, "wc", "cq=0x20", "wr=0x1", "st=0", "op=128", "qpn=18").
			at(12, "wc", "cq=0x20", "wr=0xb", "st=0", "op=0", "qpn=17").at(12, "wc", "cq=0x20", "wr=0x7", "st=0", "op=128", "qpn=18").
			teardown(20), nil, 4},
		{"a failed post's WRs are taken back, not the thread's earlier ones", rcPair().
			at(10, "recv", "qp=0x32", "wr=0x1").
			at(11, "recv", "qp=0x32", "wr=0x2").at(11, "unposted", "qp=0x32", "wrs=1", "ret=12").
			teardown(20), []Kind{DestroyedWithOutstanding}, 1},
		{"a failed ibv_wr_complete batch (every WR unposted)", rcPair().traffic(10).
			at(15, "send", "qp=0x31", "wr=0x5", "op=2", "sig=1").at(15, "send", "qp=0x31", "wr=0x6", "op=2", "sig=1").
			at(15, "unposted", "qp=0x31", "wrs=2", "ret=22").teardown(20), nil, 2},
		{"an unposted record after a WR of an untraced QP takes nothing back", rcPair().
			at(10, "recv", "qp=0x32", "wr=0x1").
			at(11, "recv", "qp=0x99", "wr=0x2").at(11, "unposted", "qp=0x99", "wrs=1", "ret=12").
			teardown(20), []Kind{DestroyedWithOutstanding}, 1},
		{"an SRQ chain failed at its first WR", srqPair().
			at(5, "srecv", "srq=0x40", "wr=0x9").at(5, "unposted", "srq=0x40", "wrs=1", "ret=12").
			at(10, "mod", "qp=0x32", "state=6", "ret=0").at(11, "ev", "ctx=0x10", "type=16", "qp=0x32", "qpn=18").
			at(11, "ack", "type=16", "qp=0x32", "qpn=18").at(12, "qpd", "qp=0x32", "ret=0").
			at(13, "srqd", "srq=0x40", "ret=0").at(14, "exit"), nil, 4},
		{"18 receives on a CQ of 16, bad_wr the 17th: not over-size", func() *stream {
			s := rcPair()
			for i := 1; i <= 18; i++ {
				s.at(10, "recv", "qp=0x32", fmt.Sprintf("wr=0x%x", i))
			}
			s.at(10, "unposted", "qp=0x32", "wrs=2", "ret=12").at(11, "mod", "qp=0x32", "state=6", "ret=0")
			for i := 1; i <= 16; i++ {
				s.at(12, "wc", "cq=0x20", fmt.Sprintf("wr=0x%x", i), "st=5", "op=0", "qpn=18")
			}
			return s.teardown(20)
		}(), nil, 16},
		{"17 receives posted on a CQ of 16, then a failed one: over-size", func() *stream {
			s := rcPair()
			for i := 1; i <= 17; i++ {
				s.at(10, "recv", "qp=0x32", fmt.Sprintf("wr=0x%x", i))
			}
			s.at(10, "recv", "qp=0x32", "wr=0x99").at(10, "unposted", "qp=0x32", "wrs=1", "ret=12").at(11, "mod", "qp=0x32", "state=6", "ret=0")
			for i := 1; i <= 17; i++ {
				s.at(12, "wc", "cq=0x20", fmt.Sprintf("wr=0x%x", i), "st=5", "op=0", "qpn=18")
			}
			return s.teardown(20)
		}(), []Kind{CQOverSize}, 17},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := Analyze(tc.s.records(t), Options{LastWQE: func(string) (LastWQE, bool) { return LastWQE{Raises: true, Source: "test"}, true }})
			if got := kinds(rep); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("findings %v, want %v:\n%s", got, tc.want, text(t, rep))
			}
			if got := rep.Processes[0].Posted; got != tc.posted {
				t.Errorf("%d WRs posted, want %d", got, tc.posted)
			}
			if len(rep.Notes) != 0 {
				t.Errorf("notes %q", rep.Notes)
			}
		})
	}
}

// TestForkAndExit: a child forked after the device was opened acts on its
// parent's objects; QPs left holding WRs when the last process holding them
// ends are judged as destroyed then; an exec starts objects of its own.
func TestForkAndExit(t *testing.T) {
	at := func(s *stream, ms, pid int, kind string, kv ...string) {
		fmt.Fprintf(&s.b, "%s t=%d pid=%d tid=%d", kind, int64(ms)*1_000_000+5_000_000_000, pid, pid)
		for _, x := range kv {
			s.b.WriteString(" " + x)
		}
		s.b.WriteString("\n")
	}
	s := rcPair() // pid 100: qpn 17 and 18 on one CQ
	for i := 1; i <= 4; i++ {
		s.at(10, "recv", "qp=0x31", fmt.Sprintf("wr=0x%x", i))
	}
	for i := 1; i <= 3; i++ {
		s.at(10, "recv", "qp=0x32", fmt.Sprintf("wr=0x%x", 10+i))
	}
	at(s, 20, 200, "fork", "ppid=100")
	at(s, 21, 200, "qpd", "qp=0x31", "begin=1")
	at(s, 22, 200, "qpd", "qp=0x31", "ret=0")
	at(s, 23, 200, "exit")
	s.at(30, "send", "qp=0x31", "wr=0x9", "op=0", "sig=1") // the parent's post to a QP its child destroyed
	s.at(50, "exit")
	// pid 300 forks 301, which execs a program that opens a device of its own
	at(s, 60, 300, "open", "ctx=0x10", "dev=rxe0")
	at(s, 60, 300, "cq", "ctx=0x10", "cq=0x20", "cqe=16", "ex=0")
	at(s, 60, 300, "qp", "ctx=0x10", "qp=0x31", "qpn=40", "type=2", "scq=0x20", "rcq=0x20", "srq=0x0", "sig_all=0", "ex=0")
	at(s, 60, 300, "recv", "qp=0x31", "wr=0x1")
	at(s, 61, 301, "fork", "ppid=300")
	at(s, 62, 301, "start")
	at(s, 63, 301, "open", "ctx=0x10", "dev=rxe0")
	at(s, 65, 300, "exit")
	at(s, 70, 301, "exit")
	rep := Analyze(s.records(t), Options{})
	want := []string{
		"destroyed-with-outstanding pid 200 qpn 17 recv 4 at 22.0 ms: qpn 17 destroyed with 4 WR(s) outstanding on its recv queue (first wr_id 0x1), it never entered ERROR",
		"destroyed-with-outstanding pid 100 qpn 18 recv 3 at 50.0 ms: qpn 18 was never destroyed: pid 100 exited with 3 WR(s) outstanding on its recv queue (first wr_id 0xb), it never entered ERROR; the kernel destroys the QP",
		// 301's exec closed its copy of the uverbs file: 300's exit destroys the QP
		"destroyed-with-outstanding pid 300 qpn 40 recv 1 at 65.0 ms",
	}
	if len(rep.Findings) != len(want) {
		t.Fatalf("%d findings, want %d:\n%s", len(rep.Findings), len(want), text(t, rep))
	}
	for i, f := range rep.Findings {
		got := fmt.Sprintf("%s pid %d %s %s %d at %s: %s", f.Kind, f.PID, f.Object, f.Queue, f.Count, fmtDur(int64(f.At)), f.Evidence)
		if !strings.HasPrefix(got, want[i]) {
			t.Errorf("finding %d:\n%s\nwant it to begin\n%s", i, got, want[i])
		}
	}
	var procs []string
	for _, p := range rep.Processes {
		procs = append(procs, fmt.Sprintf("%d:%d:%d", p.PID, p.QPs, p.Posted))
	}
	if fmt.Sprint(procs) != "[100:2:7 200:0:0 300:1:1 301:0:0]" {
		t.Errorf("processes (pid:QPs:posted) %v", procs)
	}
	// killed: the evidence says so
	k := rcPair().at(10, "recv", "qp=0x32", "wr=0x1").at(40, "wc", "cq=0x20", "wr=0x77", "st=0", "op=0", "qpn=99")
	rep = Analyze(k.records(t), Options{})
	if len(rep.Findings) != 1 || !strings.Contains(rep.Findings[0].Evidence, "pid 100 ended without exiting normally") || rep.Findings[0].At != 40*time.Millisecond {
		t.Errorf("a process killed with WRs outstanding:\n%s", text(t, rep))
	}
}

// TestFindingTimes: each finding is stamped with the record that shows it.
func TestFindingTimes(t *testing.T) {
	for _, tc := range []struct {
		s    *stream
		kind Kind
		at   time.Duration
	}{
		{rcPair().traffic(10).at(4017, "ev", "ctx=0x10", "type=0", "cq=0x20").at(4018, "ack", "type=0", "cq=0x20").teardown(4100), CQOverrun, 4017 * time.Millisecond},
		{rcPair().traffic(10).at(4017, "pollerr", "cq=0x20", "ret=-1").teardown(4100), CQOverrun, 4017 * time.Millisecond},
		{srqPair().at(11, "ev", "ctx=0x10", "type=16", "qp=0x32", "qpn=18").at(20, "exit"), EventNotAcked, 11 * time.Millisecond},
	} {
		rep := Analyze(tc.s.records(t), Options{LastWQE: func(string) (LastWQE, bool) { return LastWQE{Raises: true}, true }})
		if len(rep.Findings) != 1 || rep.Findings[0].Kind != tc.kind || rep.Findings[0].At != tc.at {
			t.Errorf("want one %s at %v:\n%s", tc.kind, tc.at, text(t, rep))
		}
	}
}

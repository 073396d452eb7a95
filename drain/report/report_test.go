package report_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/ibv"
)

// A Log's steps come back from Report.Steps as they went in: every field a
// kind names, times before the start too, IDs and numbers of any size (a
// tagged drain WR ID, a pointer-like one, the largest), errors in order,
// and steps put before others with Insert.
func TestLogComesBackWhole(t *testing.T) {
	const tag = 0xd7a1 << 48
	errStall, errOut := errors.New("stalled"), errors.New("failed")
	steps := []report.Step{
		{At: 0, Kind: report.StepState, From: ibv.QPSRTS, To: ibv.QPSErr},
		{At: -time.Second, Kind: report.StepLastWQEStated, Count: 1},
		{At: 1, Kind: report.StepEvent, Event: ibv.EventQPLastWQEReached},
		{At: 2, Kind: report.StepFlushed, Queue: report.QueueRecv},
		{At: 3, Kind: report.StepErrorWC, Queue: report.QueueSend, Status: ibv.WCRemAccessErr, WRID: 42},
		{At: 3, Kind: report.StepErrorWC, Queue: report.QueueRecv, Status: ibv.WCRemAccessErr, WRID: ^uint64(0)},
		{At: 3, Kind: report.StepErrorWC, Queue: report.QueueRecv, Status: ibv.WCLocLenErr, WRID: 0x7ffc_1234_5678},
		{At: 4, Kind: report.StepDrainPosted, WRID: tag | 7, Carrier: 0xffffff, Count: 4096},
		{At: 5, Kind: report.StepDrainDone, WRID: tag | 7, Carrier: 9, Status: ibv.WCWRFlushErr},
		{At: 5, Kind: report.StepDrainPosted, WRID: tag | 1<<47, Carrier: 5, Count: 1},
		{At: 5, Kind: report.StepDrainDone, WRID: tag | 1<<47, Carrier: 5},
		{At: 6, Kind: report.StepRecvDrainPosted, WRID: tag | 8},
		{At: 7, Kind: report.StepRecvDrainDone, WRID: tag | 8, Status: ibv.WCSuccess},
		{At: 8, Kind: report.StepStall, Err: errStall},
		{At: 9, Kind: report.StepPostRetry, WRID: tag | 9},
		{At: 10, Kind: report.StepStall, Err: errOut},
		{At: 11, Kind: report.StepCQEmpty},
		{At: 12, Kind: report.StepCountNotTrusted},
		{At: 13, Kind: report.StepSoleQPStated},
		{At: time.Hour, Kind: report.StepOutcome, Outcome: report.Failed, Err: errOut},
		{At: time.Hour, Kind: report.StepOutcome, Outcome: report.Safe},
	}
	for split := range len(steps) + 1 {
		// The steps from split on appended first, those before it put in
		// front of them: a move to ERROR's transitions logged apart.
		var l, first report.Log
		for i := range steps[split:] {
			l.Append(&steps[split+i])
		}
		for i := range steps[:split] {
			first.Append(&steps[i])
		}
		l.Insert(first)
		rep := report.Report{Log: l}
		if got := rep.Steps(); !reflect.DeepEqual(got, steps) {
			t.Fatalf("split at %d: steps:\n got %v\nwant %v", split, got, steps)
		}
	}
	if got := (&report.Report{}).Steps(); got != nil {
		t.Errorf("an empty log's steps: %v, want nil", got)
	}
}

// A log shared by a report is not changed by what its drain logs next,
// within its room or past it, or by an Insert.
func TestLogSharedStaysPut(t *testing.T) {
	l := report.MakeLog(make([]byte, 0, 64))
	l.Append(&report.Step{Kind: report.StepEvent, Event: ibv.EventQPLastWQEReached})
	rep := report.Report{Log: l}
	want := rep.Steps()
	// The room has space for what Insert puts in front: done in place, it
	// would move the report's bytes.
	var first report.Log
	first.Append(&report.Step{Kind: report.StepState, From: ibv.QPSRTS, To: ibv.QPSErr})
	l.Insert(first)
	for range 20 {
		l.Append(&report.Step{Kind: report.StepStall, Err: errors.New("x")})
	}
	if got := rep.Steps(); !reflect.DeepEqual(got, want) {
		t.Errorf("steps %v, want %v", got, want)
	}
}

// A report's steps print one a line, and marshal to JSON decoded.
func TestLogPrintsAndMarshals(t *testing.T) {
	var l report.Log
	l.Append(&report.Step{At: time.Millisecond, Kind: report.StepState, From: ibv.QPSRTS, To: ibv.QPSErr})
	l.Append(&report.Step{At: 2 * time.Millisecond, Kind: report.StepOutcome, Outcome: report.Safe})
	rep := report.Report{QPNum: 7, Log: l, Outcome: report.Safe}
	if s := rep.String(); !strings.HasPrefix(s, "qpn 7 (no SRQ): safe after 2ms\n  +1ms        state RTS -> ERR\n  +2ms        safe\n") {
		t.Errorf("String:\n%s", s)
	}
	j, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(j), `"Log":[{"At":1000000,`) {
		t.Errorf("JSON %s: want the steps decoded under Log", j)
	}
}

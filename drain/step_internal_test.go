package drain

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/clock"
	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/ibv"
)

// A report's steps are logged by the handle, dated from its start, and
// come back from its snapshot as they went in (report.TestLogComesBackWhole
// checks the packing), and the report's other fields are the handle's,
// every one of them.
func TestSnapshotIsTheHandles(t *testing.T) {
	epoch := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
	r := newReaper(nil, Options{Clock: clock.NewVirtual(epoch)})
	errStall, errOut := errors.New("stalled"), errors.New("failed")
	steps := []report.Step{
		{At: 0, Kind: report.StepState, From: ibv.QPSRTS, To: ibv.QPSErr},
		{At: -time.Second, Kind: report.StepLastWQEStated, Count: 1},
		{At: 5, Kind: report.StepDrainDone, WRID: WRIDTag | 7, Carrier: 9, Status: ibv.WCWRFlushErr},
		{At: 8, Kind: report.StepStall, Err: errStall},
		{At: time.Hour, Kind: report.StepOutcome, Outcome: report.Failed, Err: errOut},
	}
	h := &Handle{r: r, qpn: 5, srq: true, outcome: report.Failed, report: progress{
		recv:      proof{by: report.ProofBarrier, carrier: 9, wrid: WRIDTag | 7, stated: true},
		send:      proof{missing: report.MissingSendDrainWR},
		batch:     3,
		recvsBack: 4,
		start:     time.Second,
		flushed:   [3]flushCount{report.QueueSend: {flushed: 2, other: 1 << 31, first: 1, last: 2}},
	}}
	h.ext().err, h.ext().stall, h.ext().sendsBack = errOut, errStall, 3
	for _, s := range steps {
		h.step(epoch.Add(time.Second+s.At), &s) // At is from the handle's start
	}
	rep := h.snapshot()
	if got := rep.Steps(); !reflect.DeepEqual(got, steps) {
		t.Errorf("steps:\n got %v\nwant %v", got, steps)
	}
	want := report.Report{QPNum: 5, SRQ: true, Start: epoch.Add(time.Second), Log: rep.Log,
		Flushed: [3]report.Flushed{report.QueueSend: {Flushed: 2, Other: 1 << 31, First: 1, Last: 2}},
		Recv:    report.QueueProof{By: report.ProofBarrier, Carrier: 9, WRID: WRIDTag | 7, Stated: true, Count: 4},
		Send:    report.QueueProof{Missing: report.MissingSendDrainWR, Count: 3},
		Batch:   3, Stall: errStall, Outcome: report.Failed, Err: errOut}
	if !reflect.DeepEqual(*rep, want) {
		t.Errorf("report %+v: not the handle's", rep)
	}
	// Every field of the snapshot is set, so that a field added to Report
	// that snapshot does not fill fails here.
	rv := reflect.ValueOf(*rep)
	for i := range rv.NumField() {
		if rv.Field(i).IsZero() {
			t.Errorf("Report.%s is not filled by snapshot", rv.Type().Field(i).Name)
		}
	}
}

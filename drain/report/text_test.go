package report_test

import (
	"strings"
	"testing"

	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/internal/testing/texttest"
)

// Each enum marshals to JSON as its String, and an outcome comes back from
// its text; a word UnmarshalText does not know is refused with an error
// that names it and every valid one.
func TestEnumText(t *testing.T) {
	texttest.MarshalsAsString(t,
		report.QueueSend, report.QueueRecv, report.QueueUnknown,
		report.Safe, report.DestroyedAfterEmptyCQ, report.Outcome(200), report.ProofRecvDrainWR, report.ProofNone,
		report.MissingLastWQE, report.MissingNothing)
	for _, o := range []report.Outcome{report.Pending, report.Safe, report.DestroyedAfterEmptyCQ, report.Quarantined, report.Failed} {
		b, _ := o.MarshalText()
		if back := report.Outcome(200); back.UnmarshalText(b) != nil || back != o {
			t.Errorf("%v read back as %v", o, back)
		}
	}
	var o report.Outcome
	err := o.UnmarshalText([]byte("fine"))
	if err == nil {
		t.Fatal("UnmarshalText(fine) = nil, want an error")
	}
	for _, want := range []string{"fine", "pending", "safe", "destroyed after empty CQ", "quarantined", "failed"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

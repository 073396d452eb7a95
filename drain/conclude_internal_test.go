package drain

import (
	"errors"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/drain/report"
)

// conclude is the one place that sets an outcome, and it refuses Safe to a
// report without a proof for each queue, whatever its caller decided.
func TestConcludeRefusesSafeWithoutProof(t *testing.T) {
	r := newReaper(nil, Options{})
	for _, tc := range []struct {
		name string
		rep  progress
	}{
		{"no proof", progress{}},
		{"send only", progress{send: proof{by: report.ProofNoSends}}},
		{"receive only", progress{recv: proof{by: report.ProofRecvCount}}},
	} {
		h := &Handle{r: r, report: tc.rep}
		r.conclude(h, report.Safe, nil, time.Now())
		if rep := h.snapshot(); rep.Outcome != report.Failed || !errors.Is(rep.Err, ErrDrainNotFlushed) {
			t.Errorf("%s: outcome %s, %v; want failed, ErrDrainNotFlushed", tc.name, rep.Outcome, rep.Err)
		}
	}
	h := &Handle{r: r, report: progress{recv: proof{by: report.ProofRecvCount}, send: proof{by: report.ProofNoSends}}}
	r.conclude(h, report.Safe, nil, time.Now())
	if h.outcome != report.Safe {
		t.Errorf("both queues proven: outcome %s, want safe", h.outcome)
	}
}

package drain

import (
	"errors"
	"testing"
	"time"
)

// conclude is the one place that sets an outcome, and it refuses Safe to a
// report without a proof for each queue, whatever its caller decided.
func TestConcludeRefusesSafeWithoutProof(t *testing.T) {
	r := NewReaper(nil, Options{})
	for _, tc := range []struct {
		name string
		rep  progress
	}{
		{"no proof", progress{}},
		{"send only", progress{Send: QueueProof{By: ProofNoSends}}},
		{"receive only", progress{Recv: QueueProof{By: ProofRecvCount}}},
	} {
		h := &Handle{r: r, report: tc.rep}
		r.conclude(h, Safe, nil, time.Now())
		if h.report.Outcome != Failed || !errors.Is(h.report.Err, ErrDrainNotFlushed) {
			t.Errorf("%s: outcome %s, %v; want failed, ErrDrainNotFlushed", tc.name, h.report.Outcome, h.report.Err)
		}
	}
	h := &Handle{r: r, report: progress{Recv: QueueProof{By: ProofRecvCount}, Send: QueueProof{By: ProofNoSends}}}
	r.conclude(h, Safe, nil, time.Now())
	if h.report.Outcome != Safe {
		t.Errorf("both queues proven: outcome %s, want safe", h.report.Outcome)
	}
}

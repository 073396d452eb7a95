package drain

import (
	"time"

	"github.com/qpdrain/qpdrain/drain/report"
)

// proven takes the proofs by pointer and reads only By of each: a copy of
// a proof just written field by field (a drain WR's completion writes
// them, then asks) is a wide load that waits for those stores to land.
func proven(recv, send *report.QueueProof) bool {
	return recv.By != report.ProofNone && send.By != report.ProofNone
}

// progress is a Report as its handle keeps it, field for field but the
// steps, which the handle keeps packed (appendStep) and a snapshot
// builds. What a drain WR's completion reads and writes of every QP comes
// first (the proofs, Batch, Outcome, Err), then what counting its flushes
// does (Start, Flushed): each pass over the handles touches a span, not
// all.
type progress struct {
	Recv, Send report.QueueProof
	Batch      int
	Outcome    report.Outcome
	Err        error
	Start      time.Time
	Flushed    [3]report.Flushed
	QPNum      uint32
	SRQ        bool
	Stall      error
}

// Proven is Report.Proven.
func (p *progress) Proven() bool { return proven(&p.Recv, &p.Send) }

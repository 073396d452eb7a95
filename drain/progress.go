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

// progress is what a handle keeps of its Report but the steps, which it
// keeps packed (appendStep), the QP's number and SRQ, which are the
// handle's, and Err and Stall, which only a drain that did not end Safe
// has (handleExt): Handle.snapshot builds the Report. What a drain WR's
// completion reads and writes of every QP comes first (the proofs, Batch,
// Outcome), then what counting its flushes does (start, Flushed): each
// pass over the handles touches a span, not all.
type progress struct {
	Recv, Send report.QueueProof
	Batch      uint32 // a batch is at most the QPs of one reaper
	Outcome    report.Outcome
	start      time.Duration // Report.Start, from the reaper's epoch, which steps are dated from too
	Flushed    [3]report.Flushed
}

// Proven is Report.Proven.
func (p *progress) Proven() bool { return proven(&p.Recv, &p.Send) }

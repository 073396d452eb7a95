package drain

import (
	"time"

	"github.com/qpdrain/qpdrain/drain/report"
)

// proven takes the proofs by pointer and reads only by of each: a copy of
// a proof just written field by field (a drain WR's completion writes
// them, then asks) is a wide load that waits for those stores to land.
func proven(recv, send *proof) bool {
	return recv.by != report.ProofNone && send.by != report.ProofNone
}

// progress is what a handle keeps of its Report but the steps, which it
// keeps packed (report.Log), the QP's number, SRQ and outcome, which are
// the handle's, and Err and
// Stall, which only a drain that did not end Safe has (handleExt):
// Handle.snapshot builds the Report. Each field is kept in the bytes it
// needs, as every pass over the handles reads it. What a drain WR's
// completion reads and writes of every QP comes first (the proofs, batch),
// then what counting its flushes does (start, flushed): each
// pass over the handles touches a span, not all.
type progress struct {
	recv, send proof
	batch      uint32 // a batch is at most the QPs of one reaper
	// recvsBack counts the receives back of a QP counting them
	// (AddOptions.CountRecvs): Recv.Count. A QP holds fewer than 2^32
	// WRs (queue sizes are 32-bit).
	recvsBack uint32
	start     time.Duration // Report.Start, from the reaper's epoch, which steps are dated from too
	flushed   [3]flushCount
}

// The counters of the queues a caller may count (Handle.counter).
const (
	countRecv = iota
	countSend
	numCounters
)

// counter is the counter of completions of queue q, ok false for a queue
// no count is kept of.
func counter(q report.Queue) (c int, ok bool) {
	switch q {
	case report.QueueRecv:
		return countRecv, true
	case report.QueueSend:
		return countSend, true
	}
	return 0, false
}

// countProof is the proof a counter's count gives its queue, and
// countMissing the sentinel of one that did not all come back.
var (
	countProof   = [numCounters]report.Proof{report.ProofRecvCount, report.ProofSendCount}
	countMissing = [numCounters]error{ErrRecvsMissing, ErrSendsMissing}
	countWhat    = [numCounters]string{"receives", "sends"}
)

// counted is the proof of the queue counter c counts.
func (p *progress) counted(c int) *proof {
	if c == countRecv {
		return &p.recv
	}
	return &p.send
}

// proven is Report.Proven.
func (p *progress) proven() bool { return proven(&p.recv, &p.send) }

// proof is a report.QueueProof but its Count (Handle.counter), in 16
// bytes where it takes 24.
type proof struct {
	wrid    uint64
	carrier uint32
	by      report.Proof
	missing report.Missing
	stated  bool
}

// queueProof is the report.QueueProof p stands for, with count.
func (p *proof) queueProof(count int) report.QueueProof {
	return report.QueueProof{By: p.by, Missing: p.missing, Stated: p.stated, Carrier: p.carrier, WRID: p.wrid, Count: count}
}

// flushCount is a report.Flushed with its counts in 32 bits, 24 bytes where
// it takes 32: a QP completes at most the WRs it holds, fewer than 2^32
// (queue sizes are 32-bit), and the completions an earlier QP with its
// number left in the CQ, fewer than the CQ holds.
type flushCount struct {
	first, last    time.Duration
	flushed, other uint32
}

// counts is the report.Flushed f stands for.
func (f *flushCount) counts() report.Flushed {
	return report.Flushed{Flushed: int(f.flushed), Other: int(f.other), First: f.first, Last: f.last}
}

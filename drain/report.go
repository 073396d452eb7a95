package drain

import (
	"fmt"
	"strings"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
)

// Outcome is how a QP's drain ended.
type Outcome uint8

// Outcomes.
const (
	// Pending: the drain has not ended.
	Pending Outcome = iota
	// Safe: the drain WR's completion was polled (and, for an SRQ QP, Last
	// WQE Reached was seen first): the QP may be destroyed.
	Safe
	// DestroyedAfterEmptyCQ: a step stalled, and under DestroyWhenEmpty the
	// CQ was then proven empty: the QP may be destroyed.
	DestroyedAfterEmptyCQ
	// Quarantined: a step stalled and the reaper keeps the QP.
	Quarantined
	// Failed: the drain could not go on (ERROR refused, drain WR refused,
	// CQ error, quarantine full, shutdown); the caller owns the QP.
	Failed
)

var outcomeNames = [...]string{"pending", "safe", "destroyed after empty CQ", "quarantined", "failed"}

// String names the outcome.
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// SafeToDestroy reports whether the QP may be destroyed now.
func (o Outcome) SafeToDestroy() bool { return o == Safe || o == DestroyedAfterEmptyCQ }

// StepKind is the kind of one thing a drain saw or did.
type StepKind uint8

// Step kinds.
const (
	// StepState: the QP's state as found, or a transition (From -> To).
	StepState StepKind = iota
	// StepEvent: an async event for the QP (Event).
	StepEvent
	// StepFlushed: the QP's first flushed completion on a queue (Queue);
	// Report.Flushed has the final counts.
	StepFlushed
	// StepErrorWC: a completion of the QP with an error other than a flush
	// (Status, WRID).
	StepErrorWC
	// StepDrainPosted: the drain WR (WRID) was posted on the send queue of
	// QP Carrier, for a batch of Count QPs.
	StepDrainPosted
	// StepDrainDone: the drain WR's completion (WRID, Status) was polled.
	StepDrainDone
	// StepRecvDrainPosted: a receive drain WR (WRID) was posted on a
	// non-SRQ QP's receive queue.
	StepRecvDrainPosted
	// StepRecvDrainDone: the receive drain WR's completion was polled.
	StepRecvDrainDone
	// StepStall: a step ran out of time (Err names it).
	StepStall
	// StepCQEmpty: a poll found the CQ empty after a stall.
	StepCQEmpty
	// StepOutcome: the drain ended (Outcome, Err).
	StepOutcome
)

// Step is one entry of a Report. Only the fields its Kind names are set.
type Step struct {
	At      time.Time
	WRID    uint64
	Count   int
	Err     error
	From    ibv.QPState
	To      ibv.QPState
	Event   ibv.EventType
	Status  ibv.WCStatus
	Carrier uint32
	Kind    StepKind
	Queue   Queue
	Outcome Outcome
}

// String formats the step without its time.
func (s Step) String() string {
	switch s.Kind {
	case StepState:
		if s.From == s.To {
			return fmt.Sprintf("state %s", s.From)
		}
		return fmt.Sprintf("state %s -> %s", s.From, s.To)
	case StepEvent:
		return fmt.Sprintf("event %s", s.Event)
	case StepFlushed:
		return fmt.Sprintf("first flushed completion on %s queue", s.Queue)
	case StepErrorWC:
		return fmt.Sprintf("completion wr_id=%#x status=%s", s.WRID, s.Status)
	case StepDrainPosted:
		return fmt.Sprintf("drain WR %#x posted on qpn %#x for a batch of %d", s.WRID, s.Carrier, s.Count)
	case StepDrainDone:
		return fmt.Sprintf("drain WR %#x completed status=%s", s.WRID, s.Status)
	case StepRecvDrainPosted:
		return fmt.Sprintf("receive drain WR %#x posted", s.WRID)
	case StepRecvDrainDone:
		return fmt.Sprintf("receive drain WR %#x completed status=%s", s.WRID, s.Status)
	case StepStall:
		return fmt.Sprintf("stalled: %v", s.Err)
	case StepCQEmpty:
		return "cq polled empty"
	case StepOutcome:
		if s.Err != nil {
			return fmt.Sprintf("%s: %v", s.Outcome, s.Err)
		}
		return s.Outcome.String()
	}
	return fmt.Sprintf("StepKind(%d)", uint8(s.Kind))
}

// Flushed counts the completions polled for one queue of the QP while it
// drained.
type Flushed struct {
	Flushed     int // status WR_FLUSH_ERR
	Other       int // any other status, success included
	First, Last time.Time
}

// Report is what one QP's drain saw, in order, with times.
type Report struct {
	QPNum uint32
	// SRQ says the QP receives from an SRQ (so Last WQE Reached was
	// awaited).
	SRQ   bool
	Start time.Time
	// Steps in the order they were seen.
	Steps []Step
	// Flushed counts completions per queue, indexed by Queue.
	Flushed [3]Flushed
	// Batch is how many QPs the last drain WR posted for this QP covered.
	Batch int
	// Stall is the step that ran out of time, if any (one of the sentinel
	// errors), also under DestroyWhenEmpty where the drain still ended well.
	Stall   error
	Outcome Outcome
	// Err is what Wait returned: nil when the QP is safe to destroy.
	Err error
}

// Duration is the time from the start of the drain to its outcome (or to
// its last step while pending).
func (r *Report) Duration() time.Duration {
	if len(r.Steps) == 0 {
		return 0
	}
	return r.Steps[len(r.Steps)-1].At.Sub(r.Start)
}

// String formats the report, one step a line, times relative to the start.
func (r *Report) String() string {
	var b strings.Builder
	srq := "no SRQ"
	if r.SRQ {
		srq = "SRQ"
	}
	fmt.Fprintf(&b, "qpn %#x (%s): %s after %v\n", r.QPNum, srq, r.Outcome, r.Duration())
	for _, s := range r.Steps {
		fmt.Fprintf(&b, "  +%-10v %s\n", s.At.Sub(r.Start), s)
	}
	for q, f := range r.Flushed {
		if f.Flushed+f.Other == 0 {
			continue
		}
		fmt.Fprintf(&b, "  %s queue: %d flushed, %d other, between +%v and +%v\n",
			Queue(q), f.Flushed, f.Other, f.First.Sub(r.Start), f.Last.Sub(r.Start))
	}
	return b.String()
}

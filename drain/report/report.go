package report

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
	// Safe: every queue of the QP is proven finished (Report.Recv and
	// Report.Send say how): the QP may be destroyed. No other path leads
	// to it.
	Safe
	// DestroyedAfterEmptyCQ: a step stalled, and under DestroyWhenEmpty the
	// CQ was then polled empty: the policy lets the QP be destroyed
	// although at least one queue is unproven (its QueueProof says which
	// and what was missing).
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
	return enumName(o, outcomeNames[:], "Outcome")
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
	// StepDrainDone: the completion (WRID, Status) of a drain WR posted on
	// QP Carrier, this QP's own or a barrier it shares, was polled.
	StepDrainDone
	// StepRecvDrainPosted: a receive drain WR (WRID) was posted on a
	// non-SRQ QP's receive queue.
	StepRecvDrainPosted
	// StepRecvDrainDone: the receive drain WR's completion was polled.
	StepRecvDrainDone
	// StepStall: a step ran out of time (Err names it).
	StepStall
	// StepCQEmpty: a poll found the CQ empty after a stall, or, for a QP
	// counting its receives, after Add: the CQ is past every completion
	// an earlier QP with its number left in it.
	StepCQEmpty
	// StepOutcome: the drain ended (Outcome, Err).
	StepOutcome
	// StepPostRetry: the drain WR (WRID) found the send queue full; it is
	// posted again after the next poll, which may free a slot (a barrier
	// perhaps on another QP).
	StepPostRetry
	// StepLastWQEStated: the caller stated that Last WQE Reached came
	// before Add (AddOptions.LastWQESeen), or the reaper's event history
	// had it (Count 1).
	StepLastWQEStated
	// StepCountNotTrusted: a completion with the QP's number came before
	// the CQ was proven past those of earlier QPs with that number (or no
	// proof came within DrainTimeout), so the caller's counts
	// (AddOptions.CountRecvs, CountSends) cannot be told from theirs:
	// drain WRs prove the counted queues instead.
	StepCountNotTrusted
	// StepSoleQPStated: the caller stated that no QP but this one ever
	// completed into the CQ (AddOptions.SoleQP), so every completion with
	// its number is its own and its counts start at once.
	StepSoleQPStated
)

// Step is one entry of a Report. Only the fields its Kind names are set.
type Step struct {
	// At is when the step was seen, from Report.Start, as Flushed's
	// times are: a step before Add (StepLastWQEStated from the event
	// history) is negative.
	At      time.Duration
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
		return fmt.Sprintf("drain WR %#x posted on qpn %d for a batch of %d", s.WRID, s.Carrier, s.Count)
	case StepDrainDone:
		if s.Carrier != 0 {
			return fmt.Sprintf("drain WR %#x on qpn %d completed status=%s", s.WRID, s.Carrier, s.Status)
		}
		return fmt.Sprintf("drain WR %#x completed status=%s", s.WRID, s.Status)
	case StepRecvDrainPosted:
		return fmt.Sprintf("receive drain WR %#x posted", s.WRID)
	case StepRecvDrainDone:
		return fmt.Sprintf("receive drain WR %#x completed status=%s", s.WRID, s.Status)
	case StepStall:
		return fmt.Sprintf("stalled: %v", s.Err)
	case StepCQEmpty:
		return "cq polled empty"
	case StepPostRetry:
		return fmt.Sprintf("drain WR %#x: send queue full, retrying after a poll", s.WRID)
	case StepLastWQEStated:
		if s.Count != 0 {
			return "event QP_LAST_WQE_REACHED before Add (event history)"
		}
		return "event QP_LAST_WQE_REACHED before Add (stated by the caller)"
	case StepCountNotTrusted:
		return "count not trusted (a completion with this QP number came before the CQ was past earlier QPs'): drain WRs instead"
	case StepSoleQPStated:
		return "the only QP ever on its CQ (stated by the caller): counts start at once"
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
	Flushed int // status WR_FLUSH_ERR
	Other   int // any other status, success included
	// First and Last are when the first and the last were polled, from
	// Report.Start.
	First, Last time.Duration
}

// Proof is what proved one queue of a QP finished: no completion of it can
// still arrive and, for the SRQ side, the QP holds no WQE of the SRQ. The
// specification orders completions within a work queue, not across work
// queues sharing a CQ, so each queue needs its own.
type Proof uint8

// Proofs.
const (
	// ProofNone: nothing proved the queue finished; QueueProof.Missing
	// says what was lacking.
	ProofNone Proof = iota
	// ProofBarrier, the SRQ side: Last WQE Reached, then the completion
	// of a drain WR posted after it on the reaper's CQ (WRID, on QP
	// Carrier, which may be another QP). o11-5.2.5 puts the CQE of the
	// last SRQ WQE the QP took before the event, and the drain WR's CQE
	// after it on the same CQ, so polling the latter means the former
	// was polled.
	ProofBarrier
	// ProofRecvDrainWR, an own receive queue: the receive drain WR (WRID)
	// posted behind its receives completed (ib_drain_rq).
	ProofRecvDrainWR
	// ProofRecvCount, an own receive queue: the Count receives the caller
	// said were outstanding (AddOptions.CountRecvs) all came back.
	ProofRecvCount
	// ProofSendDrainWR, the send queue: a drain WR (WRID) posted on this
	// QP's own send queue completed (ib_drain_sq).
	ProofSendDrainWR
	// ProofNoSends, the send queue: the caller stated it had no send
	// outstanding (AddOptions.NoSends).
	ProofNoSends
	// ProofSendCount, the send queue: the Count sends the caller said
	// would still complete (AddOptions.CountSends) all came back.
	ProofSendCount
)

var proofNames = [...]string{"none", "Last WQE Reached and a barrier drain WR", "receive drain WR",
	"receives counted back", "drain WR on its own send queue", "no sends outstanding (stated by the caller)",
	"sends counted back"}

// String names the proof.
func (p Proof) String() string {
	return enumName(p, proofNames[:], "Proof")
}

// Missing says what an unproven queue still lacked when its drain ended.
type Missing uint8

// What can be missing.
const (
	// MissingNothing: the queue is proven, or the drain has not ended.
	MissingNothing Missing = iota
	// MissingLastWQE: no Last WQE Reached (SRQ side).
	MissingLastWQE
	// MissingBarrier: Last WQE Reached, but no drain WR posted after it
	// completed (SRQ side).
	MissingBarrier
	// MissingRecvDrainWR: the receive drain WR was not posted or never
	// completed.
	MissingRecvDrainWR
	// MissingRecvs: fewer of the counted receives came back.
	MissingRecvs
	// MissingSendDrainWR: the send drain WR was not posted or never
	// completed.
	MissingSendDrainWR
	// MissingSends: fewer of the counted sends came back.
	MissingSends
	// MissingCountExceeded: more completions of the queue came back than
	// the caller counted, so the count proves nothing.
	MissingCountExceeded
)

var missingNames = [...]string{"nothing", "no Last WQE Reached", "no barrier completion after Last WQE Reached",
	"no receive drain WR completion", "counted receives not all back", "no drain WR completion",
	"counted sends not all back", "more completions back than counted"}

// String says what was missing.
func (m Missing) String() string {
	return enumName(m, missingNames[:], "Missing")
}

// QueueProof is the evidence for one queue of a QP.
type QueueProof struct {
	// By is what proved the queue finished, ProofNone if nothing did.
	By Proof
	// Missing, once the drain ended unproven, says what was lacking.
	Missing Missing
	// Stated: for ProofBarrier, Last WQE Reached was stated by the caller
	// or found in the event history rather than seen after Add; for
	// ProofRecvCount and ProofSendCount, the caller stated the QP the only
	// one ever on its CQ (AddOptions.SoleQP), so the count began without a
	// poll proving the CQ past earlier QPs with its number.
	Stated bool
	// Carrier is the QP whose send queue carried the drain WR (ProofBarrier,
	// ProofSendDrainWR) or this QP (ProofRecvDrainWR).
	Carrier uint32
	// WRID is the drain WR whose completion proved the queue.
	WRID uint64
	// Count is, for ProofRecvCount and MissingRecvs, how many of the
	// counted receives came back; for ProofSendCount and MissingSends, how
	// many of the counted sends.
	Count int
}

// String says what proved the queue, or what was missing.
func (p QueueProof) String() string {
	switch p.By {
	case ProofNone:
		if p.Missing == MissingNothing {
			return "not proven yet"
		}
		if p.Missing == MissingRecvs || p.Missing == MissingSends || p.Missing == MissingCountExceeded {
			return fmt.Sprintf("unproven: %s (%d back)", p.Missing, p.Count)
		}
		return "unproven: " + p.Missing.String()
	case ProofBarrier, ProofSendDrainWR:
		how := p.By.String()
		if p.Stated {
			how = "Last WQE Reached (before Add) and a barrier drain WR"
		}
		return fmt.Sprintf("%s %#x on qpn %d", how, p.WRID, p.Carrier)
	case ProofRecvDrainWR:
		return fmt.Sprintf("%s %#x", p.By, p.WRID)
	case ProofRecvCount, ProofSendCount:
		if p.Stated {
			return fmt.Sprintf("%d %s (the only QP on its CQ, stated by the caller)", p.Count, p.By)
		}
		return fmt.Sprintf("%d %s", p.Count, p.By)
	}
	return p.By.String()
}

// Report is what one QP's drain saw, in order, with times.
type Report struct {
	QPNum uint32
	// SRQ says the QP receives from an SRQ (so Last WQE Reached was
	// awaited).
	SRQ   bool
	Start time.Time
	// Log is the steps, in the order they were seen, as the drain
	// recorded them; Steps decodes them.
	Log Log
	// Flushed counts completions per queue, indexed by Queue.
	Flushed [3]Flushed
	// Recv is the proof for the receive side: the SRQ side of an
	// SRQ-attached QP, its own receive queue otherwise.
	Recv QueueProof
	// Send is the proof for the send queue.
	Send QueueProof
	// Batch is how many QPs the drain WR completion that ended this QP's
	// wait released, this one included (0 when no drain WR did).
	Batch int
	// Stall is the step that ran out of time, if any (one of the sentinel
	// errors), also under DestroyWhenEmpty where the drain still ended well.
	Stall   error
	Outcome Outcome
	// Err is what Wait returned: nil when the QP is safe to destroy.
	Err error
}

// Proven reports whether every queue of the QP has a proof. A Safe
// outcome implies it.
func (r *Report) Proven() bool { return r.Recv.By != ProofNone && r.Send.By != ProofNone }

// Steps returns the steps in the order they were seen, decoded from Log
// at each call.
func (r *Report) Steps() []Step { return r.Log.steps() }

// Duration is the time from the start of the drain to its outcome (or to
// its last step while pending).
func (r *Report) Duration() time.Duration {
	return duration(r.Steps())
}

// duration is the time of the last of steps, 0 if there is none.
func duration(steps []Step) time.Duration {
	if len(steps) == 0 {
		return 0
	}
	return steps[len(steps)-1].At
}

// String formats the report, one step a line, times relative to the start.
func (r *Report) String() string {
	var b strings.Builder
	srq := "no SRQ"
	if r.SRQ {
		srq = "SRQ"
	}
	steps := r.Steps()
	fmt.Fprintf(&b, "qpn %d (%s): %s after %v\n", r.QPNum, srq, r.Outcome, duration(steps))
	for _, s := range steps {
		fmt.Fprintf(&b, "  +%-10v %s\n", s.At, s)
	}
	for q, f := range r.Flushed {
		if f.Flushed+f.Other == 0 {
			continue
		}
		fmt.Fprintf(&b, "  %s queue: %d flushed, %d other, between +%v and +%v\n",
			Queue(q), f.Flushed, f.Other, f.First, f.Last)
	}
	recv := "receive queue"
	if r.SRQ {
		recv = "SRQ side"
	}
	fmt.Fprintf(&b, "  %s: %s\n  send queue: %s\n", recv, r.Recv, r.Send)
	return b.String()
}

// enumName is names[v], or "typ(v)" for a value past the names.
func enumName[T ~uint8](v T, names []string, typ string) string {
	if int(v) < len(names) {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", typ, uint8(v))
}

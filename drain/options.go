package drain

import (
	"time"

	"github.com/sirupsen/logrus"

	"github.com/qpdrain/qpdrain/ibv"
)

// Policy says what the reaper does with a QP whose drain stalled: no Last
// WQE Reached in time, or a drain WR never completed.
type Policy uint8

// Policies.
const (
	// Quarantine keeps the QP: it is not declared safe to destroy, the
	// reaper holds it in its quarantine list (Reaper.Quarantined), counts it
	// and reports it, and Wait returns an error wrapping ErrQuarantined and
	// the stalled step's sentinel. At most Options.MaxQuarantine QPs are
	// held; past that, a stalled QP fails with ErrQuarantineFull. This is
	// the default: it never hangs and never destroys a QP that may still
	// own SRQ WQEs, and the leak it accepts is bounded and visible.
	Quarantine Policy = iota
	// DestroyWhenEmpty declares a stalled QP safe to destroy once the CQ has
	// been proven empty after the stall: a poll that found no completion
	// (Reaper.CQEmpty, or an empty Reaper.Poll). A QP without Last WQE
	// Reached still gets the drain WR barrier first. Wait returns nil; the
	// report's Outcome is DestroyedAfterEmptyCQ and Stall names the step.
	// This is the kernel's choice in __ib_drain_srq (wait, then poll the CQ
	// empty) and IPoIB-CM's at device stop; it trades the quarantine's
	// bounded leak for the risk the IBTA warns of (WQE leakage on a QP that
	// still held SRQ WQEs).
	DestroyWhenEmpty
)

// String names the policy.
func (p Policy) String() string {
	switch p {
	case Quarantine:
		return "quarantine"
	case DestroyWhenEmpty:
		return "destroy-when-empty"
	}
	return "Policy(?)"
}

// Queue says which work queue of a QP a completion belongs to. A flushed
// completion carries no valid opcode, so only the caller, through its own
// wr_id scheme, can tell; see Options.Queue.
type Queue uint8

// Queues.
const (
	QueueUnknown Queue = iota
	QueueSend
	QueueRecv
)

// String names the queue ("send", "recv", "unknown").
func (q Queue) String() string {
	switch q {
	case QueueSend:
		return "send"
	case QueueRecv:
		return "recv"
	}
	return "unknown"
}

// QueueByIDPrefix returns an Options.Queue for a caller that tags each
// wr_id with its queue in the bits above the low bits: a completion whose
// wr_id, low bits cleared, equals recvPrefix is a receive's, sendPrefix a
// send's, anything else QueueUnknown.
func QueueByIDPrefix(low uint, recvPrefix, sendPrefix uint64) func(ibv.WC) Queue {
	mask := ^(uint64(1)<<low - 1)
	return func(wc ibv.WC) Queue {
		switch wc.ID & mask {
		case recvPrefix:
			return QueueRecv
		case sendPrefix:
			return QueueSend
		}
		return QueueUnknown
	}
}

// Default bounds. The kernel waits 60 s for Last WQE Reached; IPoIB-CM waits
// 5 s for its drains at device stop. A healthy provider answers in
// microseconds to milliseconds, so 5 s separates "slow" from "never".
const (
	DefaultLastWQETimeout = 5 * time.Second
	DefaultDrainTimeout   = 5 * time.Second
	DefaultMaxQuarantine  = 64
)

// Options configure a Reaper. The zero value is usable.
type Options struct {
	// Policy for stalled drains; the default is Quarantine.
	Policy Policy
	// MaxQuarantine bounds the quarantine (default DefaultMaxQuarantine).
	MaxQuarantine int
	// LastWQETimeout bounds the wait for Last WQE Reached on an
	// SRQ-attached QP (default DefaultLastWQETimeout).
	LastWQETimeout time.Duration
	// DrainTimeout bounds the wait for a drain WR's completion (default
	// DefaultDrainTimeout).
	DrainTimeout time.Duration
	// MaxBatch caps how many QPs one drain WR releases; 0 means no cap (all
	// QPs on the flush list, as IPoIB-CM does). 1 gives every QP its own
	// drain WR posted on its own send queue, as ib_drain_qp does.
	MaxBatch int
	// RecvDrain also posts a receive drain WR on every QP without an SRQ,
	// as ib_drain_rq does, and holds the QP until it completes too. The
	// specification orders a QP's flushes per queue, not between its
	// queues, so only this proves that every receive of such a QP was
	// flushed before it is released. It needs the provider to flush a
	// receive posted in ERROR, which rxe before Linux 6.12 never does and
	// rxe 6.12 reliably does only once a send is posted on the QP after it
	// (docs/PROVIDERS.md; soft Quirks.RecvInErrorFlushDeferred). With such
	// a provider only the QP carrying a batch's send drain WR is released;
	// set MaxBatch to 1 so that every QP carries its own. Off by default:
	// the send drain WR alone is the barrier, which every provider seen so
	// far honours.
	RecvDrain bool
	// Queue tells which queue a completion of a drained QP belongs to, for
	// the report's per-queue flush counts. Nil counts them as QueueUnknown.
	Queue func(wc ibv.WC) Queue

	// Channel makes Run event-driven: the reaper's CQ must have been
	// created on this completion channel, and no other CQ may use it. Nil
	// makes Run poll.
	Channel ibv.CompChannel
	// Events makes Run read the device's async events itself and hand them
	// to HandleEvent. Only for callers that give the reaper the device's
	// event stream; others call HandleEvent from their own event loop.
	Events ibv.Context
	// OnWC receives, in Poll and Run, every completion that is not the
	// reaper's. Nil drops them (they are counted in Stats.ForeignWCs).
	OnWC func(ibv.WC)
	// OnEvent receives, in Run, every async event the reaper does not claim.
	OnEvent func(ibv.AsyncEvent)

	// Log receives a debug record of each stall and outcome; nil (the
	// default) logs nothing.
	Log logrus.FieldLogger
}

func (o Options) withDefaults() Options {
	if o.MaxQuarantine <= 0 {
		o.MaxQuarantine = DefaultMaxQuarantine
	}
	if o.LastWQETimeout <= 0 {
		o.LastWQETimeout = DefaultLastWQETimeout
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	return o
}

// AddOptions describe one QP handed to Reaper.Add.
type AddOptions struct {
	// LastWQESeen says the caller already saw this QP's Last WQE Reached
	// (for example before handing the QP over), so the reaper must not
	// wait for it.
	LastWQESeen bool
}

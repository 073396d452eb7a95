package drain

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/qpdrain/qpdrain/clock"
	"github.com/qpdrain/qpdrain/drain/report"
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
	// DestroyWhenEmpty lets a stalled QP be destroyed once the CQ has been
	// polled empty after the stall: a poll that found no completion
	// (Reaper.CQEmpty, or an empty Reaper.Poll). A QP without Last WQE
	// Reached still gets its drain WRs first. Wait returns nil; the
	// report's Outcome is DestroyedAfterEmptyCQ, not Safe, Stall names the
	// step and each unproven queue what it lacked. The wait for that poll
	// is bounded by Options.DrainTimeout too: on a CQ that other QPs'
	// traffic keeps busy none may come, and then the drain fails
	// (ErrCQNotEmpty) and the QP is handed back, unproven.
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

// QueueByIDPrefix returns an Options.Queue for a caller that tags each
// wr_id with its queue in the bits above the low bits: a completion whose
// wr_id, low bits cleared, equals recvPrefix is a receive's, sendPrefix a
// send's, anything else QueueUnknown.
func QueueByIDPrefix(low uint, recvPrefix, sendPrefix uint64) func(ibv.WC) report.Queue {
	mask := ^(uint64(1)<<low - 1)
	return func(wc ibv.WC) report.Queue {
		switch wc.ID & mask {
		case recvPrefix:
			return report.QueueRecv
		case sendPrefix:
			return report.QueueSend
		}
		return report.QueueUnknown
	}
}

// Default bounds. The kernel waits 60 s for Last WQE Reached; IPoIB-CM waits
// 5 s for its drains at device stop. A healthy provider answers in
// microseconds to milliseconds, so 5 s separates "slow" from "never".
const (
	DefaultLastWQETimeout = 5 * time.Second
	DefaultDrainTimeout   = 5 * time.Second
	DefaultMaxQuarantine  = 64
	// DefaultHeadroom is IPoIB-CM's one spare CQ slot: one drain WR
	// outstanding at a time.
	DefaultHeadroom = 1
	// DefaultEventHistory is how many Last WQE Reached events of QPs not
	// yet added a reaper remembers.
	DefaultEventHistory = 1024
)

// EventSource is what Run reads async events from: an ibv.Context is
// one, and so is anything that hands on a device's events.
type EventSource interface {
	// NextAsyncEvent waits for the next async event, as
	// ibv.Context.NextAsyncEvent does; it returns ctx's error once ctx
	// ends.
	NextAsyncEvent(ctx context.Context) (ibv.AsyncEvent, error)
}

// Options configure a Reaper. The zero value is usable.
type Options struct {
	// Policy for stalled drains; the default is Quarantine.
	Policy Policy
	// MaxQuarantine bounds the quarantine (default DefaultMaxQuarantine).
	MaxQuarantine int
	// LastWQETimeout bounds the wait for Last WQE Reached on an
	// SRQ-attached QP (default DefaultLastWQETimeout).
	LastWQETimeout time.Duration
	// DrainTimeout bounds, for each QP, the time from the moment it is
	// ready for its drain WRs (in ERROR, and past Last WQE Reached when it
	// has an SRQ) until every one of its queues is proven finished
	// (default DefaultDrainTimeout). The time spent waiting for headroom
	// counts, so the QPs of one reaper time out together, not one after
	// another. Under DestroyWhenEmpty it also bounds a stalled QP's wait
	// for an empty poll, from the moment that wait begins: the stall, or,
	// for a QP that stalled for want of Last WQE Reached, the completion
	// of the drain WRs it still gets (ErrCQNotEmpty).
	DrainTimeout time.Duration
	// Headroom is the number of drain WRs, send and receive, the reaper
	// may have outstanding on its CQ at once: the CQ slots the caller
	// reserved for them (default DefaultHeadroom). A drain WR counts until
	// its completion is polled, or until its QP, handed back to the caller
	// (Failed, DestroyedAfterEmptyCQ, or returned by Shutdown), has been
	// destroyed through its handle (Handle.Destroy) and a poll begun after
	// that found the CQ empty (see the package documentation's Headroom);
	// those a reaper shut down on the same CQ left count too (NewReaper).
	// A quarantined QP is kept, so its drain WR counts until it completes:
	// with a provider that never completes one, Headroom such QPs hold the
	// whole headroom and later drains stall with ErrNoHeadroom.
	Headroom int
	// MaxBatch caps how many QPs one drain WR's completion releases; 0
	// means no cap. 1 gives every QP its own drain WR posted on its own
	// send queue, as ib_drain_qp does, even a QP whose only open queue is
	// its SRQ side.
	MaxBatch int
	// Queue tells which queue a completion of a drained QP belongs to. It
	// feeds the report's per-queue counts and AddOptions.CountRecvs and
	// CountSends, which need it. Nil counts every completion as
	// QueueUnknown.
	Queue func(wc ibv.WC) report.Queue
	// ViaRTS takes a QP found in RTR through RTS before ERROR: some
	// Mellanox firmware completes WRs posted in ERROR only on a QP that
	// was in RTS (ipoib_cm.c; qpdrain check's flush-before-rts probe).
	ViaRTS bool
	// EventHistory bounds how many Last WQE Reached events of QPs not
	// being drained HandleEvent remembers, so that Add of such a QP, found
	// in ERROR, need not wait for an event that came first (default
	// DefaultEventHistory; negative: none). The oldest is dropped first.
	// An event serves only the QP object and the error episode it was
	// raised in (ibv.AsyncEvent.QPResets), however late it is handed over.
	EventHistory int
	// Clock runs every deadline, stall timer and report timestamp of the
	// reaper (default clock.Real). On a simulated clock (a clock.Virtual, or
	// the soft device's own, soft.Fabric) a stall times out when the clock
	// passes its deadline, not when the wall clock does.
	Clock clock.Clock

	// Log receives a debug record of each stall and of each outcome but
	// Safe, with the QP number as "lqpn"; nil (the default) logs nothing.
	Log *slog.Logger
}

// Feed is how Run feeds a reaper whose CQ the caller owns: where its
// completions and events come from and where those that are not the
// reaper's go. It is apart from Options, which say what a drain is, so
// that a caller feeding the reaper itself (HandleWC, HandleEvent, CQEmpty)
// has nothing to unset.
type Feed struct {
	// Channel makes Run event-driven: the reaper's CQ must have been
	// created on this completion channel, and no other CQ may use it. Nil
	// makes Run poll.
	Channel ibv.CompChannel
	// Events makes Run (and so DrainAll) read the device's async
	// events itself and hand them to HandleEvent. Only for callers that
	// give the reaper the device's event stream; others call HandleEvent
	// from their own event loop.
	Events EventSource
	// OnWC receives, in Run, every completion that is not the reaper's.
	// Nil drops them (they are counted in Stats.ForeignWCs).
	OnWC func(ibv.WC)
	// OnEvent receives, in Run, every async event the reaper does not claim.
	OnEvent func(ibv.AsyncEvent)
}

// CQEntries is the depth of a CQ that holds the completions of wrs WRs
// of the caller's and the drain WRs a reaper with these options may have
// outstanding: wrs plus Headroom (DefaultHeadroom when unset), the room
// NewReaper requires.
func (o Options) CQEntries(wrs int) int { return wrs + o.withDefaults().Headroom }

// check says what NewReaper refuses of o with cq.
func (o Options) check(cq ibv.CQ) error {
	bad := func(what string, v any) error {
		return fmt.Errorf("invalid Options.%s %v: %w", what, v, ibv.ErrInvalidArgument)
	}
	switch {
	case cq == nil:
		return fmt.Errorf("no CQ: %w", ibv.ErrInvalidArgument)
	case !identifiable(cq):
		return fmt.Errorf("the CQ, a %T, cannot be compared, and a reaper tells CQs apart by identity: %w", cq, ErrUnsupportedQP)
	case o.Policy > DestroyWhenEmpty:
		return bad("Policy", o.Policy)
	case o.MaxQuarantine < 0:
		return bad("MaxQuarantine", o.MaxQuarantine)
	case o.LastWQETimeout < 0:
		return bad("LastWQETimeout", o.LastWQETimeout)
	case o.DrainTimeout < 0:
		return bad("DrainTimeout", o.DrainTimeout)
	case o.Headroom < 0:
		return bad("Headroom", o.Headroom)
	case o.MaxBatch < 0:
		return bad("MaxBatch", o.MaxBatch)
	}
	if n, h := cq.CQE(), o.withDefaults().Headroom; h > n {
		return fmt.Errorf("Options.Headroom %d: the CQ holds %d entries: %w", h, n, ibv.ErrInvalidArgument)
	}
	return nil
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
	if o.Headroom <= 0 {
		o.Headroom = DefaultHeadroom
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.EventHistory == 0 {
		o.EventHistory = DefaultEventHistory
	}
	return o
}

// AddOptions are what the caller states about one QP handed to Reaper.Add.
// Each statement replaces a proof the reaper would otherwise need, so it
// must be true: the report records it as the caller's (StepLastWQEStated,
// ProofNoSends, ProofRecvCount, ProofSendCount, StepSoleQPStated).
type AddOptions struct {
	// LastWQESeen says the caller already saw this QP's Last WQE Reached
	// (for example before handing the QP over), so the reaper must not
	// wait for it. The SRQ side still needs a barrier drain WR posted
	// after Add.
	LastWQESeen bool
	// NoSends says the QP has no send WR whose completion the caller has
	// not polled, so its send queue needs no drain WR. An SRQ-attached QP
	// with NoSends has only its SRQ side open and shares a barrier drain
	// WR with the others (IPoIB-CM's receive QPs).
	NoSends bool
	// CountRecvs says Recvs is the number of receives posted on the QP's
	// own receive queue whose completions the caller has not polled: the
	// receive queue is proven finished once that many of the QP's
	// completions that Options.Queue calls QueueRecv have come back, as
	// IPoIB-CM's non-SRQ mode counts them. Without it a QP with its own
	// receive queue gets a receive drain WR, as ib_drain_rq does. Ignored
	// for an SRQ-attached QP.
	//
	// A count, of receives or sends (CountSends), counts completions not
	// yet polled: one polled before Add is not counted, so the count must
	// be taken when no poller can take the QP's completions before Add
	// (for example before the QP is moved to ERROR, which Add then does,
	// or, for a QP the CM moved there, before the caller's poll loop runs
	// again). A count must be exact: fewer back by DrainTimeout is a
	// stall (ErrRecvsMissing, ErrSendsMissing) that Options.Policy
	// decides; one more back while the drain is pending fails it
	// (ErrCountExceeded), but one that comes after the count was met may
	// come after the QP was declared safe, so a count too low is a false
	// safe the reaper cannot always see.
	// Completions go by QP number, and an earlier QP with the number may
	// have left some in the CQ (rxe does): with a count above 0 and no
	// SoleQP, Add leaves the QP as it is until a poll begun after Add
	// finds the CQ empty, then moves it to ERROR and counts; a completion
	// with its number before then makes the counts untrusted, and drain
	// WRs prove the counted queues instead. A QP already in ERROR has its
	// flushes in the CQ by then, so without SoleQP its counts are never
	// trusted.
	CountRecvs bool
	Recvs      int
	// CountSends says Sends is the number of completions the QP's send
	// queue still owes the caller: the send queue is proven finished once
	// that many of the QP's completions that Options.Queue calls
	// QueueSend have come back, with no send drain WR, which a provider
	// that never completes a send posted in ERROR (siw on a user QP) needs.
	// A send owes a completion when it is signaled (or the QP was created
	// with sq_sig_all) and its completion was not polled, and when it is
	// unsignaled and will complete in error: a WR that completes in error
	// generates a completion, signaled or not (IBTA Vol. 1 11.4.1.1, the
	// Signaled Completion modifier; siw_sq_flush completes every WQE, and
	// siw_qp_tx.c completes a successful one only if signaled). So an
	// unsignaled send counts only once it is known not to have completed
	// successfully, which a caller cannot know while the QP was in RTS: a
	// QP with an unsignaled send posted after the last send whose
	// successful completion the caller polled cannot be counted, and gets
	// a drain WR (no CountSends). Sends 0 is NoSends.
	CountSends bool
	Sends      int
	// SoleQP says no QP but this one has ever completed into the
	// reaper's CQ: a CQ created for this QP, as rping and applications
	// with a CQ per RDMA CM connection make them. Every completion in the
	// CQ with the QP's number is then its own, so its counts (CountRecvs,
	// CountSends) start at once, without the wait for an empty poll, and
	// hold for a QP already in ERROR with its flushes in the CQ: after
	// rdma_disconnect, or the peer's. The report records the statement
	// (StepSoleQPStated, QueueProof.Stated). The reaper checks what it
	// can (ErrNotSoleQP): it refuses a QP stated alone once it has had
	// another QP or seen another QP's completion, and any other QP after
	// it, and a completion of another QP fails the stated QP's drain if it
	// counts and has not ended. An earlier QP with the same number it
	// cannot tell, so a false statement can make a count pass on that
	// QP's completions: never state it for a CQ that another QP, even a
	// destroyed one, completed into.
	SoleQP bool
	// StateKnown says State is the QP's state now, as the caller who moved
	// it there knows: Add then queries nothing and starts from State (a QP
	// stated in ERROR is not modified at all). The caller answers for it:
	// a QP stated in ERROR that is not there is never flushed, and its
	// drain stalls at its deadlines. Without it Add queries the state.
	StateKnown bool
	State      ibv.QPState
}

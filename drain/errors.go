package drain

import "errors"

// Sentinel errors, one per step that can stall or fail. Test for them with
// errors.Is; the wrapped message names the QP and what was waited for.
var (
	// ErrModifyToError: the QP could not be moved to ERROR.
	ErrModifyToError = errors.New("qp could not be moved to ERROR")
	// ErrNoLastWQE: an SRQ-attached QP in ERROR raised no Last WQE Reached
	// within Options.LastWQETimeout.
	ErrNoLastWQE = errors.New("no Last WQE Reached")
	// ErrPostDrain: the drain WR could not be posted: the provider refused
	// it, or its queue stayed full (ibv.ErrQueueFull) through every poll
	// within Options.DrainTimeout.
	ErrPostDrain = errors.New("drain WR could not be posted")
	// ErrDrainNotFlushed: a drain WR was posted but its completion was not
	// polled within Options.DrainTimeout.
	ErrDrainNotFlushed = errors.New("drain WR never completed")
	// ErrNoHeadroom: the QP's drain WR could not be posted within
	// Options.DrainTimeout because the drain WRs already outstanding held
	// the whole Options.Headroom.
	ErrNoHeadroom = errors.New("no headroom for a drain WR")
	// ErrRecvsMissing: fewer of the receives the caller counted
	// (AddOptions.CountRecvs) came back than it said were outstanding,
	// within Options.DrainTimeout.
	ErrRecvsMissing = errors.New("counted receives did not all come back")
	// ErrSendsMissing: fewer of the sends the caller counted
	// (AddOptions.CountSends) came back than it said would, within
	// Options.DrainTimeout.
	ErrSendsMissing = errors.New("counted sends did not all come back")
	// ErrCountExceeded: more completions of a queue the caller counted
	// came back than it said would (AddOptions.CountRecvs, CountSends):
	// the count was wrong, so the proof it gave or would have given
	// proves nothing, and the QP is handed back unproven.
	ErrCountExceeded = errors.New("more completions than counted")
	// ErrNotSoleQP: a QP was stated the only one ever on the reaper's CQ
	// (AddOptions.SoleQP), and another QP is on it: added to the reaper,
	// or seen in a completion. Add refuses the QP that contradicts the
	// statement; a completion that does fails the stated QP's drain, if
	// it counts and has not ended, since its counts may have taken that
	// other QP's completions.
	ErrNotSoleQP = errors.New("not the only QP on the CQ")
	// ErrCQError: the CQ the QP completes into went into error
	// (EventCQErr); nothing more can be learned from it.
	ErrCQError = errors.New("cq went into error")
	// ErrQuarantined: a step stalled and the policy kept the QP in the
	// reaper's quarantine instead of declaring it safe to destroy.
	ErrQuarantined = errors.New("qp quarantined")
	// ErrQuarantineFull: a step stalled, the policy is quarantine and the
	// quarantine already holds Options.MaxQuarantine QPs. The QP is handed
	// back to the caller, not safe to destroy.
	ErrQuarantineFull = errors.New("quarantine full")
	// ErrCQNotEmpty: a poll that finds the CQ empty did not come in time.
	// Under DestroyWhenEmpty a stalled QP waits for one begun after its
	// stall, at most Options.DrainTimeout: when none comes (a CQ that
	// other QPs' traffic keeps busy), the drain fails and the QP is handed
	// back, unproven. From Wait whose context ended: a QP counting its
	// receives or sends (AddOptions.CountRecvs, CountSends), or a stalled
	// one, still waits for one.
	ErrCQNotEmpty = errors.New("cq not proven empty")
	// ErrShutdown: the reaper shut down before the QP's drain finished.
	ErrShutdown = errors.New("reaper shut down")
	// ErrUnsupportedQP: the QP cannot be drained by this package (not RC or
	// UC, or its send and receive CQs are not the reaper's CQ).
	ErrUnsupportedQP = errors.New("qp cannot be drained by this reaper")
)

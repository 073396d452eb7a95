package ipoibcm

import (
	"errors"
	"fmt"
	"time"
)

// RejectReason is the reason code of a CM REJ (enum ib_cm_rej_reason).
type RejectReason uint8

// The reasons ipoib_cm.c's passive side rejects with.
const (
	// RejNoQP (IB_CM_REJ_NO_QP, 1): without an SRQ, max_nonsrq_conn_qp
	// connections already exist (ipoib_cm_nonsrq_init_rx).
	RejNoQP RejectReason = 1
	// RejConsumerDefined (IB_CM_REJ_CONSUMER_DEFINED, 28): the REQ handler
	// failed, for example because the device would create no more QPs;
	// the CM rejects with this reason when a handler returns an error.
	RejConsumerDefined RejectReason = 28
)

// String names the reason as ib_cm.h does, without the prefix.
func (r RejectReason) String() string {
	switch r {
	case RejNoQP:
		return "NO_QP"
	case RejConsumerDefined:
		return "CONSUMER_DEFINED"
	}
	return fmt.Sprintf("RejectReason(%d)", uint8(r))
}

// ErrRejected: an incoming connection was rejected; errors.As finds a
// *RejectError with the reason.
var ErrRejected = errors.New("connection rejected")

// ErrStopped: the Manager has been stopped.
var ErrStopped = errors.New("manager stopped")

// RejectError is the error of a rejected connection.
type RejectError struct {
	Reason RejectReason
	Err    error // the cause, when the reason is a failure
}

func (e *RejectError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("connection rejected (%s): %v", e.Reason, e.Err)
	}
	return fmt.Sprintf("connection rejected (%s)", e.Reason)
}

// Is makes errors.Is(err, ErrRejected) hold.
func (e *RejectError) Is(target error) bool { return target == ErrRejected }

// Unwrap returns the cause.
func (e *RejectError) Unwrap() error { return e.Err }

// EventKind says what happened to a connection.
type EventKind uint8

// Event kinds, in the order a connection's life usually has them.
const (
	EventAccepted    EventKind = iota // REQ accepted, QP in RTS, on passive_ids
	EventRejected                     // REQ rejected (Event.Reason)
	EventDisconnect                   // DREQ or REJ received: QP to ERROR
	EventStale                        // the stale task found it idle: QP to ERROR, rx_error_list
	EventStop                         // device stop: QP to ERROR, rx_error_list
	EventLastWQE                      // Last WQE Reached: rx_flush_list
	EventDrainPosted                  // a drain WR was posted on this QP (Kernel) or the QP was handed to the reaper (Bounded)
	EventFlushed                      // without an SRQ: the last posted receive came back flushed
	EventDrained                      // its drain completed: rx_reap_list
	EventQuarantined                  // Bounded: its drain stalled and the quarantine keeps it
	EventGivenUp                      // Bounded: its drain stalled, then the CQ was found empty: rx_reap_list unproven
	EventForced                       // device stop gave up waiting ("RX drain timing out"): reaped unproven
	EventReaped                       // QP destroyed
)

var eventNames = [...]string{"accepted", "rejected", "disconnect", "stale", "stop", "last-wqe-reached", "drain-posted", "flushed", "drained", "quarantined", "given-up", "forced", "reaped"}

// String names the kind.
func (k EventKind) String() string {
	if int(k) < len(eventNames) {
		return eventNames[k]
	}
	return "EventKind(?)"
}

// Event is one transition, for Config.Trace.
type Event struct {
	At     time.Time
	Kind   EventKind
	QPNum  uint32 // 0 for a rejection before a QP existed
	List   ListID // the list the connection is on afterwards
	State  State
	Reason RejectReason // EventRejected
	// Since is, for EventReaped, how long ago the QP entered ERROR.
	Since time.Duration
}

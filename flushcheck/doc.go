// Package flushcheck probes how an RDMA device behaves on the error path
// that drains depend on: whether a QP in ERROR flushes what it holds and
// what is posted to it, whether an SRQ-attached QP raises Last WQE Reached
// exactly once, whether the drain package's drain WR comes back, and
// whether a responder error raises its async event. It speaks only the ibv
// API, so the same probes run on the soft device (with or without its
// provider quirks) and on rdma-core devices.
//
// Each Probe checks one rule of the specification (REFERENCE.md §1, §3,
// §5). It creates its own objects on the given ibv.Context (RC QPs
// connected to each other over one port of that device, as rc_pingpong's
// loopback does; RoCE ports use a RoCE v2 GID), runs bounded by its
// context and by Options.Timeout, closes every object it created and
// returns a Result: Pass, Deviation (the device does not do what the rule
// says: a finding about the device, not a failure of the check) or Error
// (the probe could not run to a verdict: a verb failed or the context
// ended).
//
// A missing completion or event is judged after Options.Timeout; a repeated
// event after a further Options.Quiet. Before posting to a QP it has moved
// to ERROR a probe lets the device settle for Options.Quiet/5, so that the
// post does not race the provider's own flush of the QP (rxe on Linux 6.12
// flushes a receive posted in that window, and later ones only when
// something else is posted). A receive posted in ERROR that does not
// complete is given a send posted behind it, which tells a deferred flush
// from none. The probes read the device's async
// event stream while they run and ignore events of objects that are not
// theirs, so run them on a context no one else reads events from, one
// probe at a time.
//
// The probes, in the order Run runs them:
//
//	flush-outstanding       sends and receives outstanding when the QP enters ERROR flush in order
//	send-in-error           a send posted in ERROR is flushed (IBM eHCA did not)
//	recv-in-error           a receive posted in ERROR is flushed (C10-42; rxe on Linux 6.1 never does)
//	flush-before-rts        a send posted in ERROR is flushed on a QP that never reached RTS
//	last-wqe-reached        an SRQ QP in ERROR raises Last WQE Reached exactly once, on itself only
//	drain-wr                drain.QP's drain WR completes and the QP is safe to destroy
//	responder-access-error  an access violation raises QP_ACCESS_ERR on the responder (rxe does not)
//
// A provider bug usually shows in more than one probe when the probes
// depend on the same behaviour: a device that never completes a send posted
// in ERROR fails send-in-error, flush-before-rts and drain-wr, because the
// drain WR is such a send.
package flushcheck

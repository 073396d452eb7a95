// Package drain tears down RDMA queue pairs the way the InfiniBand
// specification asks (IBTA §10.3.1, o11-5.2.5) and IPoIB connected mode
// does it: ERROR, Last WQE Reached, drain WR, destroy. It speaks only the
// ibv API, so it runs unchanged on the soft device and on rdma-core
// devices.
//
// # The steps, for one QP
//
//  1. Move the QP to ERROR unless it is there already. Every outstanding WR
//     then completes with WR_FLUSH_ERR (failure: ErrModifyToError).
//  2. If the QP receives from an SRQ, wait for its Last WQE Reached event:
//     it says the QP will take no more WQEs from the SRQ and that the
//     completion of the last one it took has been generated. A repeated
//     event is counted and ignored. A QP that has already had the event
//     before it was handed over says so (AddOptions.LastWQESeen); otherwise
//     the wait ends after Options.LastWQETimeout (ErrNoLastWQE) and the
//     policy applies. A QP with its own receive queue never gets the event
//     and does not wait for it; with Options.RecvDrain a receive drain WR
//     is posted behind its receives instead, as ib_drain_rq does.
//  3. Post one drain WR, a signaled zero-length SEND, on the send queue.
//     In ERROR it completes with WR_FLUSH_ERR behind every completion the
//     QP generated before, on the same CQ: a barrier.
//  4. Wait until the drain WR's completion is polled (ErrDrainNotFlushed
//     after Options.DrainTimeout). The QP may now be destroyed.
//
// The drain needs room: one more WR in the send queue and one more
// completion in the CQ for each outstanding drain WR (one per Reaper), and,
// with Options.RecvDrain, one more receive WR and one more completion per
// QP without an SRQ. Every QP handed to a Reaper must use the Reaper's CQ as both its send
// and receive CQ (IPoIB-CM gives its receive QPs the receive CQ as send CQ
// for this reason). The caller must not post to a QP being drained.
//
// # Many QPs on one CQ
//
// A Reaper batches, as ipoib_cm.c does: QPs waiting for Last WQE Reached
// sit on the error list; once it is seen they move to the flush list;
// whenever no drain WR is outstanding, one is posted on the first QP of the
// flush list and the whole flush list (up to Options.MaxBatch QPs) moves to
// the drain list behind it; when that WR's completion is polled every QP of
// the batch is safe to destroy and the next drain starts. The cost of the
// barrier is paid per batch, not per QP. The barrier orders the receive
// side of every QP in the batch (its last receive completion was generated
// before Last WQE Reached, hence before the drain WR was posted) and the
// send queue of the QP that carries it. Providers generate a QP's send
// flushes when it enters ERROR, but the specification does not order them
// against another QP's WR; a caller that needs that guarantee for QPs that
// still have sends outstanding sets MaxBatch to 1, which gives each QP its
// own drain WR on its own send queue, like ib_drain_qp.
//
// # Integrating with a poll loop
//
// The Reaper never steals completions. The caller keeps polling its CQ and
// hands every completion to HandleWC, which returns true only for drain
// WRs (IDs in the reserved range WRIDTag/WRIDMask, see IsDrainWRID); the
// caller processes everything else as before, flushed completions
// included. Likewise every async event goes to HandleEvent, which claims
// the events of QPs being drained and a CQ error on its CQ. When a poll
// finds the CQ empty the caller calls CQEmpty, which lets stall timeouts
// fire without a waiter and proves the CQ empty for DestroyWhenEmpty:
//
//	for {
//		n, _ := cq.Poll(wcs)
//		if n == 0 {
//			reaper.CQEmpty()
//		}
//		for _, wc := range wcs[:n] {
//			if !reaper.HandleWC(wc) {
//				handle(wc)
//			}
//		}
//	}
//
// Add starts a QP's drain; the Handle's Done channel closes, and Wait
// returns, when the drain has an outcome. A caller that owns the CQ lets
// the Reaper poll it instead: Poll once, or Run until its context ends,
// event-driven through a completion channel (Options.Channel) or by
// polling, and reading the device's async events (Options.Events).
// QP does all of it for one QP.
//
// # Bounds and the policy for providers that never flush
//
// Every wait takes a context.Context, and every step has a timeout, so a
// drain always ends. When a step stalls, Options.Policy decides:
//
//   - Quarantine (the default) keeps the QP: not destroyed, listed by
//     Quarantined, counted in Stats, its report and error saying which step
//     stalled (ErrQuarantined wrapping ErrNoLastWQE or ErrDrainNotFlushed).
//     The quarantine holds at most Options.MaxQuarantine QPs; past that a
//     stalled drain fails with ErrQuarantineFull and the caller gets the QP
//     back. Nothing hangs, nothing is destroyed that may still own SRQ
//     WQEs, and the leak is bounded and visible. This is the answer to the
//     IBM eHCA case, where a send posted in ERROR never completed and
//     IPoIB-CM's drain list, and every QP behind it, never emptied.
//   - DestroyWhenEmpty declares the QP safe once a poll after the stall
//     found the CQ empty; a QP without Last WQE Reached still gets the
//     drain WR first. This is what the kernel's __ib_drain_srq does after
//     its 60 s wait, and what IPoIB-CM does at device stop.
//
// A CQ error (EventCQErr) fails every pending drain with ErrCQError: the
// CQ can prove nothing any more. Each drain has a Report: the state it
// found, the events, the first flushed completion and the counts per queue,
// the drain WRs and their completions, stalls and the outcome, in order,
// with times.
//
// Logging goes to Options.Log (a logrus.FieldLogger) at debug level, for
// stalls and outcomes other than Safe; by default nothing is logged.
package drain

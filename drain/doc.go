// Package drain tears down RDMA queue pairs the way the InfiniBand
// specification asks (IBTA §10.3.1, o11-5.2.5) and IPoIB connected mode
// does it, and declares a QP safe to destroy only with a proof for each of
// its queues. It speaks only the ibv API, so it runs unchanged on the soft
// device and on rdma-core devices. What a drain saw and proved is a
// [report.Report].
//
// # Two ways to use it
//
// A caller that owns the CQ and only wants its QPs drained makes one call,
// [DrainAll]: it polls the CQ, reads the device's events ([Feed]), and
// returns a report per QP and an error that is nil exactly when every QP
// may be destroyed (the DrainAll example has the whole setup).
//
// A caller with a poll loop of its own, or QPs to drain over time, keeps a
// [Reaper] for its CQ ([NewReaper]) and adds QPs to it ([Reaper.Add],
// [Reaper.AddAll]); each gets a [Handle], whose Done channel closes when
// the drain has an outcome. The reaper is fed in one of two ways:
//
//   - by the caller's loop, which hands every completion to
//     [Reaper.HandleWC] (true only for the reaper's own drain WRs: the
//     caller keeps every other completion, flushed ones included), every
//     async event to [Reaper.HandleEvent], and calls [Reaper.CQEmpty] when a
//     poll finds nothing, from one goroutine, between its polls (the
//     Reaper example);
//   - or by [Reaper.Run], for a caller that lets the reaper poll the CQ, as
//     the [Feed] says.
//
// A QP handed back to the caller (any outcome but Quarantined, and every
// QP [Reaper.Shutdown] returns) is destroyed through its handle,
// [Handle.Destroy], at any time and from any goroutine: the reaper counts
// its drain WRs against the CQ's room until then (see Headroom).
//
// # Safe means proven
//
// The specification orders the completions of one work queue, not those of
// different work queues sharing a CQ, so each queue of a QP needs a proof
// of its own that no completion of it can still arrive
// ([report.QueueProof]): for the SRQ side of an SRQ-attached QP, Last WQE
// Reached and then the completion of a drain WR posted after it on the
// reaper's CQ, on any QP (a barrier); for an own receive queue, a receive
// drain WR behind its receives (ib_drain_rq) or the caller's count of
// receives back ([AddOptions].CountRecvs); for the send queue, a drain WR
// on it (ib_drain_sq), the caller's count of sends back
// ([AddOptions].CountSends) or its statement that nothing is outstanding
// ([AddOptions].NoSends). Counts are for providers on which a drain WR
// never completes in ERROR (siw completes neither a receive nor a send
// posted on a user QP there; rxe before Linux 6.12, no receive). Outcome Safe is given only with both;
// the code that sets outcomes refuses it otherwise. QPs whose only open
// queue is their SRQ side (IPoIB-CM's receive QPs) share barriers, up to
// [Options].MaxBatch; a QP carries one at a time.
//
// # Identity: one QP, one error episode, one reaper
//
// Events and completions count for a drain only if they come from the QP,
// the error episode and, for drain WRs, the reaper being drained:
//
//   - An event must carry the very QP value given to Add (compared with
//     ==; Add refuses a QP that cannot be compared, [ErrUnsupportedQP]),
//     raised in the QP's current error episode: a QP leaves ERROR only for
//     RESET, so [ibv.QP.Resets] numbers its episodes and every QP event
//     carries the count it was raised under (ibv.AsyncEvent.QPResets). A
//     late event of an earlier episode of a reused QP proves nothing. A Last
//     WQE Reached remembered from before Add ([Options].EventHistory)
//     serves only that QP object and episode, and only a QP found in ERROR.
//   - A completion carries only a QP number, and a destroyed QP's may stay
//     in the CQ after a new QP got its number (rxe leaves them). They are
//     all there before the new QP exists, so a poll begun after its Add
//     that finds the CQ empty is past them: a QP counting its receives or
//     sends waits for that poll before it is moved to ERROR, and a
//     completion with its number meanwhile makes the counts untrusted
//     (drain WRs prove the queues instead). A QP already in ERROR, as
//     rdma_disconnect and the peer's disconnect leave it, has its own
//     flushes in the CQ before Add, so that rule never trusts its counts.
//     For it the caller states that no other QP ever completed into the
//     CQ ([AddOptions].SoleQP: a CQ per connection, as rping makes them):
//     then no earlier QP with its number can have left a completion there,
//     every completion with its number is its own, and the counts start
//     at once. The report records the statement (report.StepSoleQPStated,
//     report.QueueProof.Stated). The reaper cannot infer it: it sees a
//     completion only when it is polled, so an earlier QP's completions
//     still in the CQ are unknown to it until they come, and a count may
//     have taken them by then. It checks what it can: another QP added,
//     or a completion with another number, contradicts the statement
//     ([ErrNotSoleQP]); an earlier QP with the same number does not show.
//   - A drain WR is matched by its ID, unique among all the reapers of the
//     process ([WRIDTag]; callers must not use that range, [IsDrainWRID]),
//     and by the number of the QP it was posted on. A drain WR of a QP
//     handed back proves nothing when it completes.
//
// # The steps, for one QP
//
//  1. Move the QP to ERROR unless it is there already (through RTS first
//     for a QP in RTR with [Options].ViaRTS). Every outstanding WR
//     then completes with WR_FLUSH_ERR ([ErrModifyToError]). A caller that
//     moved it itself says so ([AddOptions].StateKnown).
//  2. If the QP receives from an SRQ, wait for its Last WQE Reached, at
//     most [Options].LastWQETimeout ([ErrNoLastWQE]).
//  3. Post the drain WRs its queues need, a receive drain WR first, then a
//     signaled zero-length SEND; a QP with only its SRQ side open waits
//     for a barrier. At most [Options].Headroom drain WRs are outstanding
//     at once ([ErrNoHeadroom]); a full queue is retried after the next
//     poll ([ErrPostDrain] once it stays full).
//  4. Wait until every queue is proven, at most [Options].DrainTimeout
//     from step 3 on ([ErrDrainNotFlushed], [ErrRecvsMissing]).
//  5. Under DestroyWhenEmpty, a QP whose step 2, 3 or 4 stalled waits for a
//     poll begun after the stall that finds the CQ empty, at most
//     DrainTimeout ([ErrCQNotEmpty]).
//
// The timeouts of different QPs run together: N QPs whose drain WRs never
// complete all stall after about one DrainTimeout.
//
// # Headroom
//
// The drain needs room, which the caller reserves: [Options].Headroom slots
// in the CQ for drain WRs ([Options.CQEntries]), one slot in each QP's
// send queue, and one in the receive queue of each QP with its own receive
// queue and no count. Every QP must use the reaper's CQ as both its send
// and receive CQ, and the caller must not post to a QP being drained.
//
// A drain WR takes a CQ slot from the moment its completion is generated
// until it is polled. A QP not destroyed may generate it at any time, so
// its drain WR counts against the headroom until its completion is
// polled. A destroyed QP generates nothing after the destroy, and what it
// generated before is in the CQ then, so a poll begun strictly after
// [Handle.Destroy] that finds the CQ empty is past it. So at every moment
//
//	drain completions in the CQ + those still to come <= drain WRs counted <= Headroom
//
// whatever goroutine destroys a handed-back QP, and whenever: IPoIB-CM's
// ipoib_cm_rx_reap destroys QPs from a work queue while NAPI polls the CQ
// (drivers/infiniband/ulp/ipoib/ipoib_cm.c). A QP destroyed any other way
// keeps its drain WRs counted until they complete, which may be never: the
// headroom shrinks, the CQ cannot overflow. A quarantined QP is kept, so
// its drain WRs count until they complete. The sum holds across a reaper
// that replaces a shut-down one on its CQ: the new one counts what the old
// one left ([NewReaper]).
//
// # Bounds and the policy for providers that never flush
//
// Every wait is bounded, so a drain always ends. When a step stalls,
// [Options].Policy decides:
//
//   - [Quarantine] (the default) keeps the QP, listed by
//     [Reaper.Quarantined], counted in [Stats], its error wrapping
//     [ErrQuarantined] and the step's sentinel; at most
//     [Options].MaxQuarantine, then [ErrQuarantineFull]. Nothing hangs and
//     nothing that may still own SRQ WQEs is destroyed: the answer to the
//     IBM eHCA case, where a send posted in ERROR never completed and
//     IPoIB-CM's drain list, and every QP behind it, never emptied.
//   - [DestroyWhenEmpty] lets the QP be destroyed, unproven, once a poll
//     after the stall found the CQ empty, as the kernel's __ib_drain_srq
//     does after its 60 s wait (outcome DestroyedAfterEmptyCQ).
//
// A CQ error (EventCQErr) fails every pending drain with [ErrCQError].
// docs/PROVIDERS.md in the repository says what each provider needs (rxe
// 6.12 needs Headroom 2 for a receive drain WR; rxe 6.1 never flushes
// one, so there only a count proves an own receive queue).
//
// # Time
//
// Every deadline, stall timer and report timestamp runs on [Options].Clock:
// the wall clock by default, or a simulated one ([clock.Virtual], or a soft
// device's fabric, so that the device's timers and the reaper's are one
// time), on which a stall fires exactly when the clock passes its deadline
// and a wait moves the clock to it at once: feed the reaper before waiting.
// On a simulated clock a poll frees a destroyed QP's headroom only when it
// began strictly after the destroy, so once the clock has moved.
//
// Logging goes to [Options].Log, at debug level, for stalls and outcomes
// other than Safe; by default nothing is logged.
package drain

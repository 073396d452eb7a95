// Package drain tears down RDMA queue pairs the way the InfiniBand
// specification asks (IBTA §10.3.1, o11-5.2.5) and IPoIB connected mode
// does it, and declares a QP safe to destroy only with a proof for each of
// its queues. It speaks only the ibv API, so it runs unchanged on the soft
// device and on rdma-core devices.
//
// # Safe means proven
//
// The specification orders the completions of one work queue, not those
// of different work queues sharing a CQ: a provider may generate one QP's
// flushes after another QP's drain WR, or a QP's receive flushes after its
// own send drain WR. So each queue of a QP needs its own proof that no
// completion of it can still arrive, and a Report carries them (Report.Recv,
// Report.Send, each a QueueProof):
//
//   - The SRQ side of an SRQ-attached QP: Last WQE Reached (seen by
//     HandleEvent; stated with AddOptions.LastWQESeen; or remembered from
//     before Add, Options.EventHistory), then the completion of a drain WR
//     posted after it on the reaper's CQ, on any QP (ProofBarrier). The
//     event comes after the CQE of the last SRQ WQE the QP took was
//     generated; the drain WR's CQE is generated after the event; the CQ
//     hands out its CQEs in order, so once the latter is polled so was the
//     former.
//   - An own receive queue: the completion of a receive drain WR posted
//     behind its receives, as ib_drain_rq does (ProofRecvDrainWR), or the
//     caller's count of outstanding receives (AddOptions.CountRecvs) all
//     come back, as IPoIB-CM's non-SRQ mode counts them (ProofRecvCount).
//   - The send queue: the completion of a drain WR on that QP's own send
//     queue, as ib_drain_sq does (ProofSendDrainWR), or the caller's
//     statement that it has no sends outstanding (AddOptions.NoSends,
//     ProofNoSends).
//
// Outcome Safe is given only when both queues have a proof; the code that
// sets outcomes refuses it otherwise, so a safe report without proof
// cannot be produced. Where no proof can come (a provider that never
// completes a drain WR, never raises Last WQE Reached, or never flushes a
// receive posted in ERROR), the drain stalls, the policy decides, and the
// QueueProof of each unproven queue says what was missing (Missing).
//
// QPs whose only open queue is their SRQ side (SRQ-attached, NoSends:
// IPoIB-CM's receive QPs) share barriers: one drain WR, posted on one of
// them, releases every such QP that became ready before it was posted (up
// to Options.MaxBatch, its carrier among them), and any other drain WR
// serves as well. A QP carries one barrier at a time, in the send slot
// reserved for the reaper (see Headroom): a barrier due while others are
// outstanding goes on a QP that carries none, or waits for a completion to
// free one. Every other QP gets its own drain WRs, because only they prove
// its queues.
//
// # Identity: one QP, one error episode, one reaper
//
// Events and completions count for a drain only if they come from the QP
// being drained, in the error episode being drained, and, for drain WRs,
// from this reaper. "The QP" is a value compared with ==: a QP's SendCQ and
// RecvCQ must return the reaper's very CQ value, an event must carry the
// very QP value given to Add, and Add refuses (ErrUnsupportedQP) a QP or
// CQ value that cannot be compared. The rules:
//
//   - An event must carry that very QP object: a QP of another device with
//     the same number, or a destroyed QP whose number was reused, is not
//     it. And it must come from the error episode being drained: a QP
//     leaves ERROR only for RESET, so ibv.QP.Resets numbers its episodes
//     and every QP event carries the count it was raised under
//     (ibv.AsyncEvent.QPResets). A Last WQE Reached of an earlier episode
//     of a reused QP, or a provider's repeat of it, handed over only after
//     the QP was reset and added again (an event loop that lags), proves
//     nothing. A remembered Last WQE Reached (Options.EventHistory) serves
//     only the QP object and the episode it was raised in, and only a QP
//     that Add finds in ERROR (or that AddOptions.StateKnown states is
//     there).
//   - A completion carries only a QP number, which names one live QP at a
//     time, but a destroyed QP's completions may stay in the CQ (rxe leaves
//     them; mlx5 removes a kernel QP's, __mlx5_ib_cq_clean in
//     destroy_qp_common) and be polled after a new QP
//     got its number. They are all in the CQ before the new QP is created,
//     so a poll begun after its Add that finds the CQ empty is past them.
//     The counts of a report and of AddOptions.CountRecvs go by number, so
//     a QP counting its receives waits for that poll before Add moves it to
//     ERROR, and counts nothing meanwhile; a completion with its number in
//     that wait (an old QP's or its own: they cannot be told apart), or no
//     such poll within DrainTimeout, makes the count untrusted, and a
//     receive drain WR proves the receive queue instead
//     (StepCountNotTrusted). Add refuses a QP whose number names another QP
//     still being drained; a quarantined QP's number may be reused (its
//     owner destroyed it), and the new QP is a new drain.
//   - A drain WR is matched by its ID, unique among all the reapers of the
//     process (WRIDTag), so a reaper that replaces another on one CQ never
//     takes the other's late completions for its own, and its completion
//     counts only if it carries the number of the QP the WR was posted on.
//     The drain WR of a QP given up on (handed back to the caller, who may
//     destroy it) proves nothing when it completes: it releases no QP.
//
// # The steps, for one QP
//
//  1. Move the QP to ERROR unless it is there already (through RTS first
//     for a QP in RTR with Options.ViaRTS: some Mellanox firmware completes
//     WRs posted in ERROR only on a QP that was in RTS). Every outstanding
//     WR then completes with WR_FLUSH_ERR (failure: ErrModifyToError). A
//     QP counting its receives is moved once a poll begun after Add found
//     the CQ empty (see Identity).
//  2. If the QP receives from an SRQ, wait for its Last WQE Reached (a
//     repeat is counted and ignored), at most Options.LastWQETimeout
//     (ErrNoLastWQE; the error says so when no event at all was delivered).
//  3. Post the drain WRs its queues need, a receive drain WR first, then a
//     signaled zero-length SEND on its send queue; a QP with only its SRQ
//     side open waits for a barrier instead. At most Options.Headroom drain
//     WRs are outstanding on the CQ at once (ErrNoHeadroom if none frees in
//     time); a send queue found full, a barrier's carrier's too, is retried
//     after the next poll, since providers return send slots when
//     completions are polled.
//  4. Wait until every queue is proven, at most Options.DrainTimeout from
//     step 3 on (ErrDrainNotFlushed, ErrRecvsMissing). The QP may now be
//     destroyed, through its handle (Handle.Destroy).
//  5. Under DestroyWhenEmpty, a QP whose step 2, 3 or 4 stalled (after its
//     drain WRs, if step 2 did) waits for a poll begun after the stall
//     that finds the CQ empty, and may then be destroyed, unproven: at
//     most Options.DrainTimeout from the start of that wait
//     (ErrCQNotEmpty).
//
// The timeouts of different QPs run together: N QPs whose drain WRs never
// complete all stall after about one DrainTimeout, the later ones waiting
// for the headroom the first ones hold.
//
// # Headroom
//
// The drain needs room, which the caller reserves: Options.Headroom slots
// in the CQ for drain WRs (default 1, the IPoIB-CM spare slot), one slot in
// each QP's send queue (its own drain WR's, or the one barrier it carries),
// and one in the receive queue of each QP with its
// own receive queue and no count. A drain WR counts against the headroom
// from its post until its completion is polled. A QP handed back to the
// caller (failed, released by DestroyWhenEmpty, returned by Shutdown) is
// destroyed through its handle (Handle.Destroy), and its drain WRs still
// outstanding count until their completions are polled or a poll begun
// strictly after the destroy finds the CQ empty. A quarantined QP is kept,
// so its drain WRs count until they complete.
//
// The CQ arithmetic, for a caller that destroys the QPs handed back
// whenever it likes: at once from its poll loop, or later from a worker
// while the loop goes on polling, as IPoIB-CM's ipoib_cm_rx_reap destroys
// QPs from a work queue while NAPI polls the CQ
// (drivers/infiniband/ulp/ipoib/ipoib_cm.c). A drain WR takes a CQ slot
// from the moment its completion is generated until it is polled. A QP
// not destroyed may generate it at any time, so its drain WR is counted
// until its completion is polled. A destroyed QP generates nothing after
// its destroy, and the completions it generated before are in the CQ
// then, so a poll begun after the destroy that finds the CQ empty is past
// them: from then its drain WR can neither sit in the CQ nor come. So
// at every moment
//
//	drain completions in the CQ + those still to come <= drain WRs counted <= Headroom
//
// whenever the caller destroys the QPs handed back through their handles,
// at whatever time and from whatever goroutine. A poll that began at the
// very instant of the destroy (a VirtualClock that did not move) may have
// begun before it, and frees nothing. A QP destroyed any other way keeps
// its drain WRs counted until their completions, which may never come: the
// headroom shrinks, the CQ cannot overflow.
//
// The sum holds across a reaper that replaces another on its CQ too:
// Shutdown leaves the drain WRs it still counts in a process-wide ledger,
// per CQ value (compared with ==), and NewReaper on that CQ adopts those no
// other reaper has, counting them against its own headroom until they
// complete, or their QP is destroyed through the handle the old reaper
// handed back (Destroy finds them in whichever reaper has them) and a poll
// begun after that, or after the adoption for one destroyed before it,
// finds the CQ empty. (A successor with a smaller Headroom may adopt more
// than it: it posts nothing until the count is below its own.) A ledger
// rather than a predecessor handed to NewReaper: the caller that replaces
// a reaper need not know it does, nor keep the old one. What is left on a
// CQ no reaper is made on again stays in the ledger, a few words per drain
// WR, at most Headroom per Shutdown.
//
// Every QP handed to a Reaper must use the Reaper's CQ as both its send
// and receive CQ (IPoIB-CM gives its receive QPs the receive CQ as send CQ
// for this reason). The caller must not post to a QP being drained. On rxe
// 6.12, which flushes a receive posted in ERROR only once a later send
// reaches the QP, a receive drain WR needs Headroom 2 so that the send
// drain WR follows it at once; rxe 6.1 never flushes it, so there only a
// count proves an own receive queue (docs/PROVIDERS.md), and the QP should
// be handed over before it enters ERROR and while no receive completes:
// an untrusted count falls back to the receive drain WR, which stalls
// there.
//
// # Integrating with a poll loop
//
// The Reaper never steals completions. The caller keeps polling its CQ and
// hands every completion to HandleWC, which returns true only for drain
// WRs (IDs in the reserved range WRIDTag/WRIDMask, see IsDrainWRID); the
// caller processes everything else as before, flushed completions
// included. Likewise every async event goes to HandleEvent, which claims
// the events of QPs being drained and a CQ error on its CQ, and remembers
// the Last WQE Reached of QPs not added yet. When a poll finds the CQ empty
// the caller calls CQEmpty, which lets stall timeouts fire without a
// waiter and proves the CQ empty for DestroyWhenEmpty, the headroom and
// counted receives. Nothing tells the reaper when that poll began, so it
// counts as begun at the loop's previous HandleWC or CQEmpty: the loop
// makes these calls from one goroutine, between its polls, as here:
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
// returns, when the drain has an outcome; Reaper.AddAll adds a set in one
// pass, and Reaper.DrainAll adds a set and waits for all of them. A caller
// that moved its QPs to ERROR itself says so (AddOptions.StateKnown), and
// Add queries and modifies nothing. A caller that owns the CQ lets the Reaper poll it
// instead: Poll once, or Run until its context ends, fed as its Feed
// says: event-driven through a completion channel (Feed.Channel) or by
// polling, reading the device's async events (Feed.Events), and handing
// what is not the reaper's to Feed.OnWC and Feed.OnEvent. Options say what
// a drain is (timeouts, policy, headroom), a Feed how a reaper is fed, so
// a caller that feeds it itself has nothing to unset. The package
// functions DrainAll and QP do all of it for a set of QPs, or one.
//
// # Bounds and the policy for providers that never flush
//
// Every wait takes a context.Context, and every step has a timeout, so a
// drain always ends. When a step stalls, Options.Policy decides:
//
//   - Quarantine (the default) keeps the QP: not destroyed, listed by
//     Quarantined, counted in Stats, its report and error saying which step
//     stalled (ErrQuarantined wrapping the step's sentinel). The quarantine
//     holds at most Options.MaxQuarantine QPs; past that a stalled drain
//     fails with ErrQuarantineFull and the caller gets the QP back. Nothing
//     hangs, nothing is destroyed that may still own SRQ WQEs, and the leak
//     is bounded and visible. This is the answer to the IBM eHCA case,
//     where a send posted in ERROR never completed and IPoIB-CM's drain
//     list, and every QP behind it, never emptied.
//   - DestroyWhenEmpty lets the QP be destroyed once a poll after the
//     stall found the CQ empty (outcome DestroyedAfterEmptyCQ, not Safe:
//     its unproven queues say what was missing); a QP without Last WQE
//     Reached still gets its drain WRs first. This is what the kernel's
//     __ib_drain_srq does after its 60 s wait, and what IPoIB-CM does at
//     device stop. On a CQ that other QPs' traffic keeps busy no poll may
//     find it empty: when none has within DrainTimeout (step 5), the
//     drain fails with ErrCQNotEmpty and the QP, unproven, is the
//     caller's again, as for any failure.
//
// # Time
//
// Every deadline, stall timer and report timestamp runs on Options.Clock:
// clock.Real by default, or a simulated clock that stands still until
// moved (clock.Virtual, or a soft device's fabric, soft.Fabric, so that
// the device's timers and the reaper's run on one time), so hours of
// simulated churn take no real time and a stall fires exactly when the
// clock passes its deadline. Wait, and Run on a completion channel, wait
// for the next deadline with Clock.Sleep; a simulated clock's Sleep
// advances it at once, so on one the caller feeds the reaper (polls the
// CQ, hands over events) before it waits. Only Run's back-off between
// empty polls without a channel is real time: it paces the CPU. What the
// reaper orders by time orders by the clock: on a simulated clock a poll
// frees the headroom of a destroyed QP's drain WRs (see Headroom) only
// when it began strictly after the destroy, so once the clock has moved.
//
// A CQ error (EventCQErr) fails every pending drain with ErrCQError: the
// CQ can prove nothing any more. Each drain has a Report: the state it
// found, the events, the first flushed completion and the counts per queue,
// the drain WRs and their completions, stalls, the proof per queue and the
// outcome, in order, with times.
//
// Logging goes to Options.Log (a log/slog Logger) at debug level, for
// stalls and outcomes other than Safe, each with its QP's "lqpn"; by
// default nothing is logged.
package drain

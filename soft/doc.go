// Package soft is a software RDMA device in pure Go. It implements every
// ibv interface (Context, PD, MR, CompChannel, CQ, SRQ, QP) for RC queue
// pairs with the semantics of the IBTA specification (vol. 1 §10.3.1, o11-5.2.5,
// Table 58), so that drain, flushcheck and
// the CLI can be tested without hardware, including every failure path a
// real provider can produce (see Quirks).
//
// # Devices and fabrics
//
// Open creates a device. Devices on one Fabric reach each other: a QP
// addresses its peer by the peer device's LID (QPAttr.AH.DLID) or GID (a
// global route to Device.GID) and QP number, exactly as on InfiniBand.
// Connect and QP.ToRTS bring QPs to RTS with valid attributes.
//
// One mutex per fabric guards every device on it. Each verb runs to
// completion under it, so the device is safe for concurrent callers, and
// the same sequence of calls gives the same completions and events in the
// same order, in either schedule (see Adversarial schedules). No goroutine
// is started.
//
// # Work queue slots
//
// A WR holds a slot of its queue from its post until its completion is
// polled, as on hardware, where the provider learns that a slot is free
// from the consumer's poll: an unsignaled send's slot frees when the
// completion of a later signaled send of the same queue (or of a later WR
// that failed or was flushed) is polled. Posting to a queue whose
// Cap.MaxSendWR or Cap.MaxRecvWR slots are all held fails with
// ErrQueueFull, whatever the device has executed. An SRQ's slot frees when
// the completion of its WQE is polled; the WQEs a QP took ahead and drops
// at RESET or destroy give their slots back (their completions never
// come).
//
// # Transport
//
// SEND, SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM, RDMA_READ,
// ATOMIC_CMP_AND_SWP and ATOMIC_FETCH_AND_ADD move real bytes between
// registered memory. With auto-progress on (the default) a send WR executes
// inside PostSend: requester checks, the responder's work and completion,
// then the requester's completion (only for signaled WRs, or every WR with
// SigAll; errors always complete). With Fabric.SetAutoProgress(false) sends
// stay outstanding until Fabric.Progress executes them in post order.
//
// A message that finds no receive WQE at the responder (an RNR NAK) waits
// at the head of its send queue. With rnr_retry 7 (infinite) it is retried
// when a receive is posted; with a finite rnr_retry the requester retries
// it after the responder's min_rnr_timer (IBTA Table 45), rnr_retry times,
// and the NAK of the last retry fails it with RNR_RETRY_EXC_ERR: a receive
// posted before then lets the message through at the next retry. A request
// to a QP that does not exist, is not in RTR/RTS/SQD, or is not connected
// back to the requester is never answered: the requester waits its local
// ACK timeout (4.096 µs * 2^timeout) for each of 1 + retry_cnt attempts
// and then fails it with RETRY_EXC_ERR; timeout 0 waits forever. Both
// requester errors move the requester to ERROR without an async event.
//
// Local errors (bad lkey, access, bounds) give LOC_PROT_ERR,
// an atomic whose local buffer is not 8 bytes LOC_LEN_ERR.
//
// # Time
//
// Those timers run on the fabric's clock (Fabric.Now). It is virtual by
// default, so tests never sleep: Fabric.Advance moves it, and when a
// fabric with timers pending has seen only waiting calls (polls that find
// nothing, NextAsyncEvent, WaitCQ) for a millisecond of real time, every
// caller is waiting, and the clock jumps to the next timer, as simulation
// testers do; a caller waiting in real time is never stranded. A caller
// that moves the clock itself turns the jumps off (Fabric.SetClockJumps),
// so that its run does not depend on how fast it ran.
// Fabric.SetRealTime(true) makes it follow real time, for demos.
//
// A QP moved from RTS to SQD starts no more sends, but a send already in
// flight (waiting for a receive or a retry timer) goes on and completes
// normally; SQ_DRAINED (with EnSQDAsyncNotify) comes once none is in
// flight.
//
// MRs may be any []byte. MR.Addr is the address of the buffer's first byte
// and SGE.Addr is Addr()+offset; the device turns addresses into offsets
// and never back into pointers. Memory windows are not implemented.
//
// Inline data (IBV_SEND_INLINE) works as on rxe: a QP asks for up to
// Limits.MaxInlineData bytes in Cap.MaxInlineData (more fails with EINVAL,
// ErrInvalidArgument) and is granted exactly that, which Query reports. An
// inline SEND, SEND_WITH_IMM, RDMA_WRITE or RDMA_WRITE_WITH_IMM has its
// data copied at post time, so the buffer may be reused as soon as PostSend
// returns, and no lkey is checked; one longer than the QP's MaxInlineData,
// or an inline RDMA READ or atomic, fails the post with ErrInvalidArgument
// (a *ibv.PostError naming the WR; ibv_post_send(3) allows inline data only
// for sends and RDMA writes, while rxe posts an inline READ or atomic and
// fails it with LOC_PROT_ERR, docs/PROVIDERS.md). Unlike a real device, which reads any
// memory of the process, the soft device reads inline data only from
// buffers registered on it (any MR, any PD): an inline SGE outside every
// MR fails the post with ErrInvalidArgument.
//
// # Errors and flushing
//
// A QP in ERROR completes every outstanding WR in order with WR_FLUSH_ERR
// (the send queue, then receive WQEs taken from the SRQ, then its own
// receive queue); the WR that failed first completes with its own status.
// WRs posted in ERROR complete with WR_FLUSH_ERR, sends and receives alike
// (C10-42, C10-97.2.1, and the eHCA thread): at once in the orderly
// schedule, over later calls in the adversarial one. On every completion whose
// status is not SUCCESS only ID, Status, QPNum and VendorErr are set (the
// rest is zero, as ibv_poll_cq(3) says only they are valid); VendorErr is
// always 0.
//
// Responder errors (IBTA Table 58, class C): the responder QP moves to
// ERROR and flushes, the requester's WR completes with the NAK's status and
// the requester moves to ERROR too:
//
//	condition at the responder                 requester status   responder event
//	bad rkey, rkey without the access, bounds  REM_ACCESS_ERR     QP_ACCESS_ERR
//	QP not enabled for the RDMA/atomic access  REM_INV_REQ_ERR    QP_REQ_ERR
//	misaligned atomic                          REM_INV_REQ_ERR    QP_ACCESS_ERR
//	more RDMA READ/atomic than max_dest_rd     REM_INV_REQ_ERR    QP_ACCESS_ERR
//	SEND longer than the receive buffer        REM_INV_REQ_ERR    QP_ACCESS_ERR (the receive: LOC_LEN_ERR)
//	unsupported opcode (SEND_WITH_INV)         REM_INV_REQ_ERR    QP_REQ_ERR
//	receive WQE with a bad lkey                REM_OP_ERR         none (the receive: LOC_PROT_ERR)
//
// The requester statuses are those rxe's responder NAKs produce
// (drivers/infiniband/sw/rxe/rxe_resp.c); the events are ibv_get_async_event(3)'s
// (rxe before Linux 7.3 raises none: see Quirks.NoResponderErrorEvent). "Outstanding" RDMA READ
// and atomic requests are modelled as the requester pipelining the READ and
// atomic WRs queued behind the one executing, up to its own max_rd_atomic:
// posting k of them at once to a responder whose max_dest_rd_atomic is
// below min(k, max_rd_atomic) is the violation.
//
// # SRQ
//
// Receive WQEs of an SRQ are shared by its QPs. With Config.SRQPrefetch = k,
// an SRQ-attached QP in RTR or later holds up to k WQEs taken ahead from the
// SRQ (traced as TraceSRQTake): the soft device's model of WQEs "taken but
// not yet completed". Without prefetch a message takes its WQE from the SRQ
// when it arrives. A QP entering ERROR flushes the WQEs it took and leaves
// the rest of the SRQ to its siblings; then, taking no more, it raises
// QP_LAST_WQE_REACHED exactly once (o11-5.2.5), also when it took none.
// Only SRQ-attached QPs raise it. RESET re-arms it for the next ERROR. An
// SRQ-attached QP moved to RESET or closed before ERROR drops the WQEs it
// took without completing them: the "WQE leakage" IBTA §10.3.1 warns of.
//
// The SRQ limit, armed by a non-zero SRQLimit, raises SRQ_LIMIT_REACHED
// once when a take leaves fewer WQEs than the limit, and disarms.
// Device.InjectSRQError puts an SRQ in error: SRQ_ERR, then each attached QP
// past RESET moves to ERROR with QP_FATAL, flushes and raises Last WQE
// Reached (Table 58, class A).
//
// # CQ overflow
//
// A CQ holds exactly the number of completions it was created with. A
// completion that finds it full overflows it: CQ_ERR, that completion and
// all later ones are lost, and every QP completing into the CQ moves to
// ERROR with its own QP_FATAL (as an SRQ error does, IBTA vol. 1 Table 58 class A; what real
// providers do is for the checks to observe).
//
// # Async events
//
// Context.NextAsyncEvent returns each event exactly once, in the order
// raised, and a returned event counts as acknowledged: destroying its
// object never waits for it. Events of a closed QP are still delivered.
//
// # Destroy rules
//
// Closing a device with PDs, CQs or channels open, a PD with MRs, QPs or
// SRQs, a CQ with QPs, an SRQ with QPs, or a channel with CQs fails with
// ErrBusy. Close is idempotent; other methods on a closed object return
// ErrClosed. Closing a QP drops its queues without completions.
//
// # State machine
//
// Modify follows the RC column of ib_modify_qp_is_ok: RESET->INIT needs
// PKEY_INDEX|PORT|ACCESS_FLAGS, INIT->RTR needs AV|PATH_MTU|DEST_QPN|RQ_PSN|
// MAX_DEST_RD_ATOMIC|MIN_RNR_TIMER, RTR->RTS needs TIMEOUT|RETRY_CNT|
// RNR_RETRY|SQ_PSN|MAX_QP_RD_ATOMIC, RTS<->SQD, and any state goes to ERR
// or RESET with STATE alone. A transition not in the table, a missing
// required attribute or an attribute not allowed fails with an error
// wrapping ibv.ErrInvalidArgument (EINVAL, as from libibverbs) and changes
// nothing. RESET empties every queue without completions and discards the
// QP's completions still in its CQs, as libmlx4 and libmlx5 do
// (mlx4_modify_qp and mlx5_modify_qp clean both CQs on a move to RESET, and
// so does hns), while rxe does not (rxe_qp_reset empties the queues and
// leaves the CQs alone); a QP is reusable after ERR -> RESET. Sends may
// be posted in RTS, SQD (they wait) and ERR; receives in any state but
// RESET (on an iWARP device, not in SQD either). RC QPs never enter SQE.
//
// # Adversarial schedules
//
// The IBTA specification leaves many choices to the device, and a test
// device for error paths must be able to make each of them the hostile
// way. Config.Schedule with a non-zero Seed makes every choice below
// pseudo-randomly from the seed (mixed with the device's name, so two
// devices of one seed differ); the same seed and the same calls give the
// same trace. The zero Schedule is orderly, the behaviour the rest of this
// documentation describes, and stays the default.
//
//   - Flush timing: entering ERROR, and a WR posted in ERROR, generate no
//     completion by themselves; each later call into the device (a poll, a
//     post, a modify, Progress, a wait in NextAsyncEvent or WaitCQ)
//     generates 0 to 2 of the pending flush completions. The specification
//     requires the flush (C10-42, C10-97.2.1) but sets no time for it, and
//     hns generates its flushes from a work item after the modify returns
//     (init_flush_work, drivers/infiniband/hw/hns/hns_roce_qp.c).
//   - Flush interleaving: each completion comes from a work queue chosen at
//     random among those with flushes pending, so the send and receive
//     queues of a QP, and the queues of QPs sharing a CQ, interleave in any
//     way. Within one work queue the completions stay in order: the
//     specification orders the completions of a work queue, never those
//     of different work queues.
//   - Event delays: an async event (Last WQE Reached, QP_FATAL, CQ_ERR,
//     SRQ_ERR, SRQ_LIMIT_REACHED, SQ_DRAINED, the responder error events)
//     becomes deliverable 0 to 6 device calls after its condition, in the
//     order raised. Events and completions are separate channels with no
//     order between them except the one o11-5.2.5 states: Last WQE Reached
//     follows the CQE of the last WQE the QP took from its SRQ, so the
//     device raises it only once that flush completion has been generated.
//   - Responder and requester order: the responder's receive completion of
//     a SEND (or RDMA WRITE with immediate) and the requester's completion
//     of the same message land in their CQs in either order: they belong to
//     different work queues, which nothing orders.
//   - QP numbers: the first QP number of each device is 17 plus 0 to 15, so
//     devices hand out overlapping numbers from different starts, and three
//     times in four a new QP gets the number of a destroyed one, as
//     hardware reuses numbers. ibv_create_qp(3) promises only a number
//     unique among live QPs, so a number alone never identifies a QP over
//     time; async events name the QP object, which is never reused.
//
// A caller that finds nothing (a Poll returning no completion, a wait in
// NextAsyncEvent or WaitCQ) runs the device's deferred work forward until
// it finds something or none is left, as a real device keeps working while
// its consumer waits, and deferring work wakes the waiters: the schedule
// never strands a caller.
//
// # iWARP
//
// Config.Transport ibv.TransportIWARP gives the device the rules of the
// kernel's iWARP provider siw (drivers/infiniband/sw/siw), each from its
// source as read in torvalds/linux (siw_qp.c at commit 1260ed777985,
// after siw moved to the crc32c library; siw_verbs.c at 03c601927b67; the
// checks below are the same in the versions before, with
// siw_qp_enable_crc, such as Debian's 6.1):
//
//   - Info reports node type RNIC and transport iWARP (siw_get_port_immutable:
//     RDMA_CORE_PORT_IWARP), which rcsetup.NeedsCM reads.
//   - A QP reaches RTS only through the connection manager (QP.ModifyByCM,
//     which package softcm calls): siw_verbs_modify_qp takes only the state
//     and access flags of ibv_modify_qp, maps RESET and INIT to its IDLE
//     (ib_qp_state_to_siw_qp_state), and siw_qp_nextstate_from_idle refuses
//     RTS without the connection's socket (SIW_QP_ATTR_LLP_HANDLE), which
//     only the iWARP CM passes: Modify to RTS fails with
//     ibv.ErrInvalidArgument (siw's -EINVAL). Modify to RTR succeeds and
//     changes nothing: siw_qp_nextstate_from_idle has no transition to RTR.
//   - No Last WQE Reached: siw raises IB_EVENT_QP_LAST_WQE_REACHED nowhere
//     (its events are SQ_DRAINED from siw_sq_flush, SRQ_LIMIT_REACHED,
//     CQ_ERR, QP_FATAL and the access and request errors), so Open sets
//     Quirks.NoLastWQEReached.
//
// Not modelled (flushcheck's probes do not reach it on iWARP): a SEND that
// finds no receive terminates the connection on siw (siw_proc_send:
// DDP_ECODE_UT_INVALID_MSN_NOBUF, RFC 5041's "Invalid MSN - no buffer
// available") where the soft device still waits on an RNR; SQD is siw's
// CLOSING, which closes the connection (here it only refuses receives,
// as siw_post_receive does past RTS short of ERROR; package softcm's
// Disconnect moves an iWARP QP there, as rdma_disconnect does); and
// siw_query_qp fills no qp_state before "RDMA/siw: Set qp_state in
// siw_query_qp" (December 2023; Debian 6.1 lacks it), so ibv_query_qp's state
// there is not the QP's (the soft device reports its state).
//
// # Quirks
//
// Quirks reproduce real providers' deviations, each off by default:
//
//   - SendInErrorNotFlushed: a send posted in ERROR never completes; it
//     stays queued until RESET. IBM eHCA on the ofa-general thread "Quetions
//     about IPOIB handle last WQE event", where
//     IPoIB-CM's drain WR never came back and QPs leaked.
//   - NoLastWQEReached: Last WQE Reached is never raised. cxgb4 until its
//     January 2025 fix (commit 079231902768), which made ib_drain_qp wait
//     60 s per QP.
//   - LastWQEReachedTwice: the event is raised twice per ERROR; drain must
//     tolerate repeats. rxe on Linux 6.12 raises it again when a send is
//     posted on the QP in ERROR (TestSRQLastWQEReached, docs/PROVIDERS.md);
//     the quirk raises the repeat at once, without waiting for a post. The
//     eHCA thread asked whether a QP that also reports a catastrophic error
//     might do the same.
//   - RecvInErrorFlushDeferred: a receive posted in ERROR is flushed only
//     when something else happens on the QP (its next post or Modify), as
//     providers that flush from a deferred worker do (hns, init_flush_work;
//     rxe on Linux 6.12 once a send follows, docs/PROVIDERS.md).
//   - DrainNeedsRTS: WRs posted in ERROR are flushed only if the QP was in
//     RTS before ERROR; otherwise they stay queued until RESET. Mellanox
//     firmware, per the comment in ipoib_cm.c that moves RX QPs to RTS for
//     this reason (drivers/infiniband/ulp/ipoib/ipoib_cm.c).
//   - RecvInErrorNotFlushed: a receive posted in ERROR never completes; it
//     stays queued until RESET. rxe on Linux 6.1 (docs/PROVIDERS.md).
//   - NoResponderErrorEvent: a responder error moves the responder to ERROR
//     and flushes it, but raises neither QP_ACCESS_ERR nor QP_REQ_ERR. rxe
//     on Linux 6.1 and 6.12 (docs/PROVIDERS.md).
//   - LastWQEReachedAgain: an SRQ QP in ERROR that has raised Last WQE
//     Reached raises it again on each later modify to ERROR and each send
//     posted to it (never before the first, which waits for the flushes
//     of the WQEs it took). rxe on Linux 6.12 (flushcheck's
//     last-wqe-repeat, docs/PROVIDERS.md).
//   - FlushDeferred: a QP moved to ERROR by Modify generates its flushes,
//     and Last WQE Reached, only when its CQ is next polled or the QP is
//     next posted to or modified. hns moves a QP to ERROR through a
//     mailbox and flushes from a workqueue (init_flush_work and
//     flush_work_handle in drivers/infiniband/hw/hns), so a flush can
//     reach a shared CQ after another QP's later completion
//     (flushcheck's flush-order).
//   - CQOverrunKeepsQPs: a full CQ raises CQ_ERR for every completion it
//     loses, takes completions again once polled, and moves no QP to ERROR
//     (no QP_FATAL). rxe on Linux 6.1 and 6.12: rxe_cq_post in
//     drivers/infiniband/sw/rxe/rxe_cq.c logs "queue full" and raises
//     IB_EVENT_CQ_ERR (flushcheck's cq-overrun, docs/PROVIDERS.md).
//   - SQDrainedEarly: a QP moved from RTS to SQD while its head send is in
//     flight and due for a retry (an RNR NAK, or no ACK with a non-zero
//     timeout) raises SQ_DRAINED at once, and that send, with those behind
//     it, does not start again until the QP is back in RTS, whatever the
//     peer posts. rxe on Linux 6.1 and 6.12 (flushcheck's sqd,
//     docs/PROVIDERS.md), in drivers/infiniband/sw/rxe/rxe_req.c: the
//     retry (rnr_nak_timer, armed by rxe_completer for every RNR NAK, also
//     with rnr_retry 7) runs req_retry, which rewinds the send to
//     wqe_state_posted at the queue's consumer index; req_next_wqe's SQD
//     drain check (inline on req.state QP_STATE_DRAIN in 6.1,
//     req_check_sq_drain_done on attr.sq_draining in 6.12) takes that for
//     drained and raises IB_EVENT_SQ_DRAINED, and req_next_wqe starts no
//     WQE that is not wqe_state_processing in SQD. rxe raises it at that
//     retry, soon after the modify (+5.5 ms on 6.1, +30 ms on 6.12 in the
//     VM); the quirk raises it at the modify.
package soft

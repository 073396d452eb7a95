// Package ipoibcm is the receive (passive) side of IPoIB connected mode,
// drivers/infiniband/ulp/ipoib/ipoib_cm.c, on the ibv API: the connection
// lifecycle that tears RC QPs down through ERROR, Last WQE Reached and a
// drain WR, with the kernel's lists as data. Kernel IPoIB runs only on
// InfiniBand ports; this model runs wherever the ibv API does, on the soft
// device and on rxe.
//
// # Lifecycle
//
// A Manager owns one CQ, the send and receive CQ of every RX QP (so that
// the drain WR completes behind the QP's receives), one SRQ unless
// Config.NoSRQ, and a receive ring. Accept (ipoib_cm_req_handler) creates
// an RC QP, takes it to RTS and puts the connection at the head of
// passive_ids; without an SRQ it posts the connection's own ring, and past
// Config.MaxNonSRQConn connections it rejects with RejNoQP. Completions
// refresh a connection's time stamp and LRU position (at most every
// Config.UpdateTime). Disconnect (a DREQ or REJ) moves the QP to ERROR. The
// stale task runs every Config.Delay while passive_ids is not empty and
// moves connections idle longer than Config.Timeout to rx_error_list with
// their QP in ERROR. With an SRQ, Last WQE Reached moves a connection to
// rx_flush_list and the drain policy takes it to rx_reap_list; without
// one, the last of its receives coming back flushed does. Service destroys
// what is on rx_reap_list. Stop (ipoib_cm_dev_stop) moves everything to
// ERROR, waits up to Config.StopTimeout for the drains, destroys what is
// left and then the Manager's own objects.
//
// # Policies
//
// Kernel is ipoib_cm_start_rx_drain as it is: one drain WR outstanding,
// no timeout, so a provider that never completes it leaks every QP behind
// it. Bounded hands the QPs to a drain.Reaper whose every wait ends; see
// Policy and Config.Drain.
//
// # Time and concurrency
//
// Every timer runs on Config.Clock: clock.Real on devices, a simulated
// clock (clock.Virtual, or the soft device's fabric, whose timers then run
// on the same time) in simulation, where hours of churn take no real time. The Bounded
// policy's reaper runs on the same clock (drain.Options.Clock). The Manager starts
// no goroutine; the caller calls Service after anything that may have
// produced completions or events and at NextDeadline. Snapshot shows each
// list; Config.Trace sees every transition. All methods are safe for
// concurrent use. Connection churn driven by seeded peers is package
// ipoibcm/churn.
package ipoibcm

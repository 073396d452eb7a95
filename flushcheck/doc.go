// Package flushcheck probes how an RDMA device behaves on the error path
// that drains depend on, and says how to drain it. It speaks only the ibv
// API, so the same probes run on the soft device (with or without its
// provider quirks) and on rdma-core devices.
//
// Each Probe checks one rule, cited by its source: the IBTA specification
// (vol. 1), a libibverbs man page or a kernel source file. It creates its
// own objects on the given ibv.Context (RC QPs connected to each other over
// one port of that device, as rc_pingpong's loopback does; RoCE ports use a
// RoCE v2 GID), runs bounded by its context and by Options.Timeout, closes
// every object it created and returns a Result: Pass, Deviation (the device
// does not do what the rule says: a finding about the device, not a failure
// of the check), Error (the probe could not run to a verdict: a verb
// failed or the context ended) or Hung (below).
//
// A verbs call stuck in the kernel cannot be cancelled: on rxe of Linux
// 5.10, destroy-outstanding's ibv_destroy_qp never returned, and
// reset-reuse and sqd soft-locked a CPU inside the calling process. So each
// probe runs in a goroutine of its own and records every verbs call it
// makes before making it ("ibv_destroy_qp on QP 17"); once a call has not
// returned within Options.CallTimeout (30 s by default), or the probe has
// not returned that long after its context ended, the check stops waiting
// and the probe is Hung, naming the call and how long it was blocked. Run
// then runs no further probe, since the device may be wedged: those after
// it are NotRun. The hung probe's goroutine and objects stay behind until
// the call returns, if ever, so the device cannot be closed meanwhile.
//
// Options.Run and Options.Skip select probes by name, as go test's -run and
// -skip do; Run reports the others Skipped, so that its results always
// list every probe.
//
// Every wait of a probe runs on Options.Clock: the wall clock by default,
// as a hardware device needs, or the device's own clock. A soft device's
// fabric (soft.Fabric) is one: the probes then let its time pass in small
// steps, its retry and RNR timers firing at their times, so a wait for
// what the device never does takes no real time, and a program's test can
// run the whole check on a soft device, with the defaults, in well under a
// second:
//
//	dev, err := soft.Open(soft.Config{Quirks: soft.Quirks{NoLastWQEReached: true}})
//	if err != nil {
//		t.Fatal(err)
//	}
//	defer dev.Close()
//	results := flushcheck.Run(ctx, dev, flushcheck.Options{Clock: dev.Fabric()})
//	for _, r := range results {
//		t.Logf("%s: %s: %s", r.Name, r.Outcome, r.Observed)
//	}
//
// Options.CallTimeout and Result.Duration stay wall time: a hung verbs
// call is one that does not return in real time.
//
// A missing completion or event is judged after Options.Timeout (at least
// MinTimeout), a send a retry series must fail after the series and one
// Timeout per retry timer (2 s at the least: a loaded host fires each
// timer late), with the series as the QP's attributes report it; a repeated event after a further Options.Quiet.
// Where an earlier answer says the device has already acted, the wait is
// Options.Quiet: the responder's access-error event once the requester has
// its completion, a receive posted in ERROR once a send posted behind it
// is flushed, and sqd's sends one RNR NAK timer and Quiet after the peer
// posts receives. Before
// posting to a QP it has moved to ERROR a probe lets the device settle for
// Options.Quiet/5, so that the post does not race the provider's own flush
// of the QP (rxe on Linux 6.12 flushes a receive posted in that window, and
// later ones only when something else is posted). A receive posted in
// ERROR that does not complete is given a send posted behind it, which
// tells a deferred flush from none. The probes read the device's async
// event stream while they run and ignore events of objects that are not
// theirs, so run them on a context no one else reads events from, one
// probe at a time.
//
// The probes, in the order Run returns them (it runs last those that
// watch a quiet period on any device: last-wqe-reached, last-wqe-repeat,
// cq-overrun, destroy-outstanding, reset-reuse and sqd):
//
//	flush-outstanding       sends and receives outstanding when the QP enters ERROR flush in order
//	send-in-error           a send posted in ERROR is flushed (IBM eHCA did not)
//	recv-in-error           a receive posted in ERROR is flushed (C10-42; rxe on Linux 6.1 never does)
//	flush-before-rts        a send posted in ERROR is flushed on a QP that never reached RTS
//	last-wqe-reached        an SRQ QP in ERROR raises Last WQE Reached exactly once, on itself only
//	last-wqe-repeat         ... and not again after a second modify to ERROR, a send posted, a receive posted to the SRQ
//	drain-wr                drain.DrainAll's drain WR completes and the QP is safe to destroy
//	responder-access-error  an access violation raises QP_ACCESS_ERR on the responder (rxe before 7.3 does not)
//	cq-overrun              more completions than the CQ holds raise CQ_ERR; QP state, events and losses observed
//	peer-gone               a send no one answers fails RETRY_EXC_ERR after its retry budget, the rest flushed
//	rnr-exhausted           a finite rnr_retry without a receive fails RNR_RETRY_EXC_ERR after its budget, the rest flushed
//	destroy-outstanding     a QP destroyed with WRs outstanding completes none of them; destroy with unread events returns
//	reset-reuse             ERR -> RESET leaves no completion of the QP's old life, and the QP works again
//	flush-order             one QP's flushes come before another QP's later completion on a shared CQ
//	sqd                     SQ_DRAINED comes only once no message is in progress
//
// A provider bug usually shows in more than one probe when the probes
// depend on the same behaviour: a device that never completes a send posted
// in ERROR fails send-in-error, flush-before-rts, drain-wr and flush-order,
// because the drain WR and flush-order's barrier are such sends.
//
// Settings turns the results into the drain.Options the device needs
// (receive drain WR or not, batch size, the policy for stalls, the
// timeouts) and the practices drain.Options has no field for (the RTS
// workaround, CQ headroom, not reusing QPs), each with a one-line reason,
// so that a program can run the check once at start-up and drain
// accordingly:
//
//	results := flushcheck.Run(ctx, dev, flushcheck.Options{})
//	opts, _ := flushcheck.Settings(results)
//	reaper, err := drain.NewReaper(cq, opts)
package flushcheck

package flushcheck

import (
	"fmt"
	"strings"

	"github.com/qpdrain/qpdrain/drain"
)

// Setting is one choice of how to drain the device, with the finding it
// follows from.
type Setting struct {
	// Name is the drain.Options field ("MaxBatch") or, for a practice
	// the caller follows itself, what it is about ("receive drain WR").
	Name string
	// Value is the choice, as it would be written ("true", "1").
	Value string
	// Reason says in one line which probe found what.
	Reason string
}

// Recommendation is how to drain a device, from a check's results.
type Recommendation struct {
	// Options are the drain.Options to drain the device with.
	Options drain.Options
	// CountRecvs says a receive drain WR does not complete on this device
	// by itself, so each QP with its own receive queue must be added with
	// AddOptions.CountRecvs and the number of its receives not yet polled,
	// or its drain stalls.
	CountRecvs bool
	// CountSends says a send drain WR does not complete on this device,
	// so each QP must be added with AddOptions.CountSends and the number
	// of completions its send queue still owes (its signaled sends not yet
	// polled), or its drain stalls. A QP already in ERROR when it is added
	// (after rdma_disconnect) needs AddOptions.SoleQP for its counts to be
	// trusted.
	CountSends bool
	// Settings are the choices, each with its reason, in the order printed.
	Settings []Setting
}

// Settings turns a check's results into the drain options that drain
// this device without a stall and without calling a QP safe too early,
// and says why, one Setting per choice. A probe that did not run to a
// verdict (or is missing from results) leaves its setting at the choice
// that is safe on every device, and its reason says so.
func Settings(results []Result) Recommendation {
	by := make(map[string]Result, len(results))
	for _, r := range results {
		by[r.Name] = r
	}
	var out []Setting
	add := func(name, value, format string, args ...any) {
		out = append(out, Setting{Name: name, Value: value, Reason: fmt.Sprintf(format, args...)})
	}
	// known reports whether probe ran to a verdict, and whether it passed.
	known := func(probe string) (ran, passed bool) {
		r, ok := by[probe]
		return ok && r.Outcome.verdict(), ok && r.Outcome == Pass
	}
	unknown := func(probe string) string { return probe + " did not run to a verdict" }
	var o drain.Options
	countRecvs := true

	drainRan, drainOK := known(ProbeDrainWR)
	drainNot := "drain-wr: the drain WR posted in ERROR never completed here" // what drain-wr found if it ran and failed
	if !drainRan {
		drainNot = unknown(ProbeDrainWR)
	}
	switch ran, ok := known(ProbeRecvInError); {
	case ok && !drainOK:
		add("receive drain WR", "no: CountRecvs", "recv-in-error: a receive posted in ERROR is flushed, but %s, so the barrier drain WR of each QP on an SRQ, a send, keeps its slot of Options.Headroom for as long as the QP lives and a receive drain WR may find none left: add each QP with its own receive queue with AddOptions.CountRecvs and its receives not yet polled", drainNot)
	case ok:
		countRecvs = false
		add("receive drain WR", "yes", "recv-in-error: a receive posted in ERROR is flushed, so the receive drain WR drain posts on a QP's own receive queue proves it finished, as ib_drain_rq does")
	case ran:
		add("receive drain WR", "no: CountRecvs", "recv-in-error: a receive posted in ERROR is not flushed by itself here, so a receive drain WR would stall: add each QP with its own receive queue with AddOptions.CountRecvs and its receives not yet polled")
	default:
		add("receive drain WR", "no: CountRecvs", "%s: add each QP with its own receive queue with AddOptions.CountRecvs and its receives not yet polled", unknown(ProbeRecvInError))
	}

	countSends := !drainOK
	switch {
	case drainOK:
		add("send drain WR", "yes", "drain-wr: the drain WR posted in ERROR completed behind the QP's flushes, so it proves the send queue finished, as ib_drain_sq does")
	case drainRan:
		add("send drain WR", "no: CountSends", "%s, so it would stall: add each QP with AddOptions.CountSends and the completions its send queue still owes (with SoleQP when the CM already moved it to ERROR)", drainNot)
	default:
		add("send drain WR", "no: CountSends", "%s: add each QP with AddOptions.CountSends and the completions its send queue still owes (with SoleQP when the CM already moved it to ERROR)", unknown(ProbeDrainWR))
	}

	switch ran, ok := known(ProbeFlushOrder); {
	case ok:
		add("MaxBatch", "0", "flush-order: one QP's flushes came before another QP's later completion in every round, so one drain WR may release a batch of SRQ QPs past Last WQE Reached; QPs with sends outstanding still need their own (the specification orders completions per work queue only)")
	case ran:
		o.MaxBatch = 1
		add("MaxBatch", "1", "flush-order: a QP's flushes reached the CQ after another QP's later completion, so a drain WR proves only its own QP: one per QP, as ib_drain_qp")
	default:
		o.MaxBatch = 1
		add("MaxBatch", "1", "%s: one drain WR per QP, which needs no order across QPs", unknown(ProbeFlushOrder))
	}

	_, sendOK := known(ProbeSendInError)
	lwRan, lwOK := known(ProbeLastWQEReached)
	switch {
	case !drainOK || !sendOK:
		o.Policy = drain.Quarantine
		add("Policy", drain.Quarantine.String(), "drain-wr, send-in-error: the drain WR (a send posted in ERROR) %s, so only the caller's counts prove a QP finished, and nothing an SRQ QP's SRQ side: keep stalled QPs, bounded by MaxQuarantine", notProven(by, ProbeDrainWR, ProbeSendInError))
	case lwRan && !lwOK:
		o.Policy = drain.DestroyWhenEmpty
		add("Policy", drain.DestroyWhenEmpty.String(), "last-wqe-reached: %s; an SRQ QP waits LastWQETimeout, then is released behind its drain WR once the CQ is empty, as __ib_drain_srq does", firstClause(by[ProbeLastWQEReached].Observed))
	case !lwRan:
		o.Policy = drain.Quarantine
		add("Policy", drain.Quarantine.String(), "%s: a QP whose Last WQE Reached does not come is kept, not destroyed", unknown(ProbeLastWQEReached))
	default:
		o.Policy = drain.Quarantine
		add("Policy", drain.Quarantine.String(), "last-wqe-reached, drain-wr: both come here, so a stall is a real fault: keep the QP rather than risk WQE leakage")
	}
	o.LastWQETimeout = drain.DefaultLastWQETimeout
	o.DrainTimeout = drain.DefaultDrainTimeout
	add("LastWQETimeout", o.LastWQETimeout.String(), "%s", took(by, ProbeLastWQEReached, "Last WQE Reached"))
	add("DrainTimeout", o.DrainTimeout.String(), "%s", took(by, ProbeDrainWR, "the drain WR"))

	sendRan, _ := known(ProbeSendInError)
	switch ran, ok := known(ProbeFlushBeforeRTS); {
	case ok:
		add("ViaRTS", "false", "flush-before-rts: a send posted in ERROR is flushed also on a QP that never reached RTS")
	case ran && sendRan && !sendOK:
		// RTS first would not get the drain WR flushed, and an iWARP QP
		// cannot be moved to RTS by hand at all (siw refuses it).
		add("ViaRTS", "false", "flush-before-rts, send-in-error: a send posted in ERROR is not flushed even on a QP that reached RTS, so taking a QP through RTS first changes nothing (Policy)")
	default:
		o.ViaRTS = true
		why := unknown(ProbeFlushBeforeRTS)
		if ran {
			why = "flush-before-rts: a send posted in ERROR is not flushed on a QP that never reached RTS"
		}
		add("ViaRTS", "true", "%s: take a QP found in RTR through RTS before ERROR, as ipoib_cm.c does for such firmware", why)
	}
	if ran, ok := known(ProbeLastWQERepeat); ran && !ok && lwOK {
		var again []string
		for _, c := range strings.Split(by[ProbeLastWQERepeat].Observed, "; ") {
			if strings.HasPrefix(c, "again ") {
				again = append(again, c)
			}
		}
		add("repeated Last WQE Reached", "tolerated", "last-wqe-repeat: raised %s; drain counts repeats and ignores them", strings.Join(again, ", "))
	}
	if r, ok := by[ProbeCQOverrun]; ok && r.Outcome.verdict() {
		what := "raises CQ_ERR, which fails every drain pending on the CQ (drain.ErrCQError)"
		if r.Outcome == Deviation {
			what = "raises no CQ_ERR, so a lost drain completion looks like a stall"
		}
		o.Headroom = drain.DefaultHeadroom
		add("Headroom", fmt.Sprint(o.Headroom), "cq-overrun: an overrun loses completions and %s: size the CQ for every WR plus Headroom entries for drain WRs", what)
	}
	if ran, ok := known(ProbeDestroyOutstanding); ran && !ok {
		add("destroy", "after a drain", "destroy-outstanding: completions of a destroyed QP still reached its CQ: drain before destroying, and match completions by QP object, not number")
	}
	if ran, ok := known(ProbeResetReuse); ran && !ok {
		add("reuse after RESET", "no", "reset-reuse: completions of a QP's old life appeared after RESET: destroy drained QPs instead of reusing them")
	}
	return Recommendation{Options: o, CountRecvs: countRecvs, CountSends: countSends, Settings: out}
}

// notProven names what the failing probes among names saw.
func notProven(by map[string]Result, names ...string) string {
	for _, n := range names {
		if r, ok := by[n]; ok && r.Outcome == Deviation {
			return "never completed here"
		}
	}
	return "is not proven to complete: " + strings.Join(names, " or ") + " did not run to a verdict"
}

// took is the reason of a timeout setting: the default, and how long the
// probe's own wait took when it passed.
func took(by map[string]Result, probe, what string) string {
	r, ok := by[probe]
	if !ok || r.Outcome != Pass {
		return fmt.Sprintf("%s: the default; %s was not seen to come in time here", probe, what)
	}
	return fmt.Sprintf("%s: the default, far above this device's (%s)", probe, firstClause(r.Observed))
}

// firstClause is an observation up to its first ";".
func firstClause(s string) string {
	if i := strings.Index(s, ";"); i >= 0 {
		return s[:i]
	}
	return s
}

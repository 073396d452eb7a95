package flushcheck

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/rcsetup"
)

// mayDeviate are the probes the test device may or may not fail, and what
// a deviation must say: rxe flushes each QP from its own tasks, so on 6.12
// one QP's flushes reached the CQ after another QP's later completion in
// 1 of 5 runs (never in 5 runs on 6.1; both allowed, docs/PROVIDERS.md).
//
// Through the RDMA CM rxe's QPs get min_rnr_timer 0 (655.36 ms, the CM sets
// none) instead of rcsetup's 12: sqd's send is not retried within the
// probe's quiet period, so SQ_DRAINED may or may not come early (on 6.12
// it passed through the CM and deviated by hand).
func mayDeviate(cm bool) map[string]string {
	if devtest.CurrentProvider() != devtest.ProviderRXE {
		return nil
	}
	m := map[string]string{"flush-order": "a barrier on one QP does not cover another's flushes here"}
	if cm {
		m["sqd"] = "SQ_DRAINED already raised while a send was in progress"
	}
	return m
}

// expectedDeviations maps each probe the test device is known to fail to
// what its observation must say; ok is false for a device the project has
// no record of.
func expectedDeviations(t *testing.T, dev ibv.Context) (want map[string]string, ok bool) {
	if devtest.SIW(t, dev) {
		// The same on 6.1, 6.12 and 7.3 (testdata/providers/siw-*.json,
		// docs/PROVIDERS.md): the kernel flushes a WR posted in ERROR only
		// for a kernel consumer (siw_sq_flush_wr; siw_post_receive refuses
		// a receive on a user QP outside RTS), so nothing posted in ERROR
		// completes, drain WRs included; siw raises no Last WQE Reached
		// (nowhere in drivers/infiniband/sw/siw); destroying a QP moves it
		// to ERROR first (siw_destroy_qp in siw_verbs.c), which flushes its
		// outstanding receives to the CQ (siw_rq_flush).
		return map[string]string{
			"send-in-error":       "never completed",
			"recv-in-error":       "never completed",
			"flush-before-rts":    "never completed",
			"last-wqe-reached":    "no Last WQE Reached",
			"last-wqe-repeat":     "no Last WQE Reached",
			"drain-wr":            "drain WR never completed",
			"destroy-outstanding": "after the destroy its CQ returned",
			"flush-order":         "the barrier never completed",
		}, true
	}
	switch devtest.CurrentProvider() {
	case devtest.ProviderSoft:
		if devtest.IWARP() {
			// siw's rules: no Last WQE Reached.
			return map[string]string{"last-wqe-reached": "no Last WQE Reached", "last-wqe-repeat": "no Last WQE Reached"}, true
		}
		return nil, true
	case devtest.ProviderRXE:
		// Each entry follows one of rxe's changes (devtest.RXESince says
		// where it starts and why; docs/PROVIDERS.md). On every kernel run:
		// SQ_DRAINED comes while a send waits on an RNR, and the send never
		// completes in SQD once the peer has receives.
		want := map[string]string{"sqd": "SQ_DRAINED already raised while a send was in progress"}
		// A receive posted in ERROR: 6.1 never completes it, not even once
		// a send is posted behind it. Later kernels flush it only when
		// something else is posted to the QP once it has settled in ERROR
		// (soft's RecvInErrorFlushDeferred); one posted at once, racing the
		// flush that entering ERROR starts, is flushed about half of the
		// time, so the probe lets the QP settle.
		want["recv-in-error"] = deferredFlush
		if devtest.RXELacks(devtest.RXERecvInErrorFlushed) {
			want["recv-in-error"] = "never completed"
		}
		switch {
		case devtest.RXELacks(devtest.RXELastWQEReached):
			want["last-wqe-reached"] = "no Last WQE Reached"
			want["last-wqe-repeat"] = "no Last WQE Reached"
		case devtest.RXEHas(devtest.RXELastWQERepeated):
			// again after a second modify to ERROR and after a send
			// posted in ERROR
			want["last-wqe-repeat"] = "again after a second modify to ERROR (1, "
		}
		if devtest.RXELacks(devtest.RXEResponderAccessEvent) {
			want["responder-access-error"] = "responder: no async event"
		}
		return want, true
	}
	return nil, false
}

// notApplicable are the probes that do not apply to the test device as it
// connects: on iWARP those whose rule it lacks, and reset-reuse (connected
// by hand) wherever the RDMA CM connects the pairs.
func notApplicable(cm bool) []string {
	switch {
	case devtest.IWARP():
		return []string{ProbePeerGone, ProbeRNRExhausted, ProbeResetReuse, ProbeSQD}
	case cm:
		return []string{ProbeResetReuse}
	}
	return nil
}

// TestDevice runs every probe on the test device (QPDRAIN_TEST_DEVICE) and
// checks the findings against what the project recorded for that device.
// Closing the device at the end fails the test if a probe left an object
// open.
func TestDevice(t *testing.T) {
	dev := devtest.Open(t)
	// A deviation costs a probe its whole timeout (twice for recv-in-error),
	// and rxe deviates three times on 6.1. Every answer seen on rxe under
	// qemu came within milliseconds, so 3 s still separates "slow" from
	// "never" by three orders of magnitude.
	o := Options{Timeout: 3 * time.Second}
	if devtest.CurrentProvider() == devtest.ProviderSoft {
		o = quick // the soft device answers at once
	}
	// The pairs connect as the test device connects: through the RDMA CM
	// on iWARP and with QPDRAIN_TEST_CM=1, by hand otherwise.
	o.Connector = devtest.Connector(t, dev)
	_, byHand := o.Connector.(rcsetup.Route)
	na := notApplicable(!byHand)
	results := Run(context.Background(), dev, on(dev, o))
	for _, r := range results {
		t.Logf("%s %-22s %-9s %8v  %s", dev.Name(), r.Name, r.Outcome, roundDur(r.Duration), r.Observed)
	}
	// Draining with the settings the findings imply neither stalls nor
	// calls a QP safe before its last completion.
	rec := Settings(results)
	for _, s := range rec.Settings {
		t.Logf("%s setting %-16s %-18s %s", dev.Name(), s.Name, s.Value, s.Reason)
	}
	// Where the drain WR never completes, nothing proves an SRQ QP's SRQ
	// side: those QPs end quarantined (TestSettingsPerQuirk's stalls).
	dw, _ := lookupResult(results, ProbeDrainWR)
	drainWithSettings(t, dev, rec, dw.Outcome == Deviation)
	got := deviating(t, results)
	want, known := expectedDeviations(t, dev)
	may := mayDeviate(!byHand)
	for name := range may {
		delete(want, name)
	}
	if !known {
		t.Logf("no recorded expectations for %s (%s): deviations %v", devtest.DeviceName(), devtest.CurrentProvider(), got)
		return
	}
	major, minor := devtest.KernelVersion()
	for _, r := range results {
		says, deviates := want[r.Name]
		switch {
		case slices.Contains(na, r.Name) != (r.Outcome == NotApplicable):
			t.Errorf("%s on %s: %s (%s), want not-applicable: %v", r.Name, devtest.DeviceName(), r.Outcome, r.Observed, slices.Contains(na, r.Name))
		case r.Outcome == NotApplicable:
		case deviates && r.Outcome != Deviation:
			t.Errorf("%s on %s (%s, Linux %d.%d): %s, want the recorded deviation (%q)", r.Name, devtest.DeviceName(), devtest.CurrentProvider(), major, minor, r.Outcome, says)
		case deviates && !strings.Contains(r.Observed, says):
			t.Errorf("%s on %s (Linux %d.%d) observed %q, want it to say %q", r.Name, devtest.DeviceName(), major, minor, r.Observed, says)
		case !deviates && r.Outcome == Deviation && may[r.Name] != "":
			if says := may[r.Name]; !strings.Contains(r.Observed, says) {
				t.Errorf("%s on %s (Linux %d.%d) observed %q, want it to say %q", r.Name, devtest.DeviceName(), major, minor, r.Observed, says)
			}
		case !deviates && r.Outcome != Pass && !allowed(t, r):
			t.Errorf("%s on %s (%s, Linux %d.%d): %s, want pass", r.Name, devtest.DeviceName(), devtest.CurrentProvider(), major, minor, r.Outcome)
		}
	}
}

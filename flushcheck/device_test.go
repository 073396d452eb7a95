package flushcheck

import (
	"context"
	"slices"
	"testing"

	"github.com/qpdrain/qpdrain/internal/devtest"
)

// rxeBefore612 reports whether the test device is rxe on a kernel older
// than 6.12; kernels between 6.1 and 6.12 are assumed to behave like 6.1
// (docs/PROVIDERS.md).
func rxeBefore612() bool {
	if devtest.CurrentProvider() != devtest.ProviderRXE {
		return false
	}
	major, minor := devtest.KernelVersion()
	return major < 6 || major == 6 && minor < 12
}

// expectedDeviations are the findings docs/PROVIDERS.md records for the
// test device, in probe order; ok is false for a device it knows nothing
// about.
func expectedDeviations() (names []string, ok bool) {
	switch devtest.CurrentProvider() {
	case devtest.ProviderSoft:
		return nil, true
	case devtest.ProviderRXE:
		if rxeBefore612() {
			// Linux 6.1: a receive posted in ERROR never completes, no Last
			// WQE Reached, no responder event.
			return []string{"recv-in-error", "last-wqe-reached", "responder-access-error"}, true
		}
		// Linux 6.12: only the responder event is missing.
		return []string{"responder-access-error"}, true
	}
	return nil, false
}

// TestDevice runs every probe on the test device (QPDRAIN_TEST_DEVICE) and
// checks the findings against docs/PROVIDERS.md. Closing the device at the
// end fails the test if a probe left an object open.
func TestDevice(t *testing.T) {
	dev := devtest.Open(t)
	results := Run(context.Background(), dev, Options{Timeout: devtest.Timeout})
	for _, r := range results {
		t.Logf("%s %-22s %-9s %8v  %s", dev.Name(), r.Name, r.Outcome, roundDur(r.Duration), r.Observed)
	}
	got := deviating(t, results)
	want, known := expectedDeviations()
	if !known {
		t.Logf("no recorded expectations for %s (%s): deviations %v", devtest.DeviceName(), devtest.CurrentProvider(), got)
		return
	}
	major, minor := devtest.KernelVersion()
	if !slices.Equal(got, want) {
		t.Errorf("deviations on %s (%s, Linux %d.%d): %v, want %v as docs/PROVIDERS.md records",
			devtest.DeviceName(), devtest.CurrentProvider(), major, minor, got, want)
	}
}

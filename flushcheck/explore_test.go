package flushcheck

import (
	"context"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/soft"
)

// TestExplore runs the probes' tests on the orderly schedule and
// QPDRAIN_SOFT_SEEDS adversarial ones (devtest.Explore); make soak runs it
// with many seeds.
func TestExplore(t *testing.T) {
	if devtest.CurrentProvider() != devtest.ProviderSoft {
		t.Skip("schedules are the soft device's; on", devtest.DeviceName(), "the bodies run as their own tests")
	}
	for _, b := range []struct {
		name string
		body func(*testing.T)
	}{
		{"Device", TestDevice},
		{"SoftPasses", TestSoftPasses},
		{"SoftQuirks", TestSoftQuirks},
		{"SoftPassesShortQuiet", softPassesShortQuiet},
	} {
		t.Run(b.name, func(t *testing.T) { devtest.Explore(t, b.body) })
	}
}

// softPassesShortQuiet is TestSoftPasses with 2 ms quiet periods, so that
// make soak gets through many seeds: what a probe watches for must not
// happen, and on the soft device a waiting probe's calls run the device's
// deferred work at once, so what could happen shows within them. The
// timeout only bounds waits for what must come, which on soft comes at
// once.
func softPassesShortQuiet(t *testing.T) {
	dev := openSoft(t, soft.Quirks{})
	wantPasses(t, Run(context.Background(), dev, on(dev, Options{Timeout: 2 * time.Second, Quiet: 2 * time.Millisecond})))
}

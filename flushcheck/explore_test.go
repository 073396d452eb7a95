package flushcheck

import (
	"testing"

	"github.com/qpdrain/qpdrain/internal/devtest"
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
	} {
		t.Run(b.name, func(t *testing.T) { devtest.Explore(t, b.body) })
	}
}

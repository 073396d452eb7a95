package drain_test

import (
	"testing"

	"github.com/qpdrain/qpdrain/internal/devtest"
)

// exploredBodies are the drain tests that also run under the soft device's
// adversarial schedules (TestExplore): the device-facing ones. Tests that
// wait out a stall on purpose cost their timeout per seed and stay out, and
// so does TestCQOverflow, which needs the orderly schedule.
var exploredBodies = []struct {
	name string
	body func(*testing.T)
}{
	{"DrainQPWithSRQ", TestDrainQPWithSRQ},
	{"DrainQPWithoutSRQ", TestDrainQPWithoutSRQ},
	{"DrainQPRecvDrain", TestDrainQPRecvDrain},
	{"DrainQPPastLastWQE", TestDrainQPPastLastWQE},
	{"ReaperBatches", TestReaperBatches},
	{"ReaperOneAtATime", TestReaperOneAtATime},
	{"RecvDrainThenSend", TestRecvDrainThenSend},
	{"ReaperRun", TestReaperRun},
	{"ModifyToErrorFails", TestModifyToErrorFails},
	{"CQErrorEvent", TestCQErrorEvent},
	{"AddRejects", TestAddRejects},
	{"ConcurrentDrains", TestConcurrentDrains},
	{"QuirkLastWQEReachedTwice", TestQuirkLastWQEReachedTwice},
	{"QuirkRecvInErrorFlushDeferred", TestQuirkRecvInErrorFlushDeferred},
	{"NoProofFromAnotherQueue", TestNoProofFromAnotherQueue},
	{"FullSendQueueRetried", TestFullSendQueueRetried},
	{"EventBeforeAdd", TestEventBeforeAdd},
	{"DrainAll", TestDrainAll},
	{"EventOfAnotherDevice", TestEventOfAnotherDevice},
}

// TestExplore runs the drain bodies on the orderly schedule and
// QPDRAIN_SOFT_SEEDS adversarial ones (devtest.Explore); make soak runs
// it with many seeds.
func TestExplore(t *testing.T) {
	if devtest.CurrentProvider() != devtest.ProviderSoft {
		t.Skip("schedules are the soft device's; on", devtest.DeviceName(), "the bodies run as their own tests")
	}
	for _, b := range exploredBodies {
		t.Run(b.name, func(t *testing.T) { devtest.Explore(t, b.body) })
	}
}

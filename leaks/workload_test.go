package leaks

import (
	"strings"
	"testing"

	"github.com/qpdrain/qpdrain/workload"
)

// TestFindingWorkloads: a finding names the workload of its owner, or of
// its holders when the creator is gone; a kernel finding has none.
func TestFindingWorkloads(t *testing.T) {
	pod := workload.Parse("/kubepods/besteffort/pod8f3a2c1d-5e6b-4a7c-9d0e-1f2a3b4c5d6e/4c8b2d1f0e9a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c")
	svc := workload.Parse("/system.slice/app.service")
	inPod := Process{PID: 100, Comm: "trainer", Workload: &pod}
	holder := Process{PID: 201, Comm: "child", Workload: &svc}
	r := Analyze(samples(3, func(int) []QP {
		return []QP{rc(17, "ERR", inPod), rc(18, "RTS", Process{}, Process{PID: 202, Comm: "unknown"}, holder), kern(2, "RC", "ERR", "ib_ipoib")}
	}), Options{})
	got := map[Reason]*workload.Workload{}
	for i := range r.Findings {
		f := &r.Findings[i]
		got[f.Reason] = f.Workload()
		if f.Reason == StuckInError && !strings.Contains(f.Evidence+f.Remedy, "pid 100 (trainer, pod 8f3a2c1d-5e6b-4a7c-9d0e-1f2a3b4c5d6e)") {
			t.Errorf("stuck-in-error does not name the pod: %s / %s", f.Evidence, f.Remedy)
		}
		if f.Reason == Orphaned && !strings.Contains(f.Evidence, "pid 201 (child, app.service)") {
			t.Errorf("orphaned does not name the holder's unit: %s", f.Evidence)
		}
	}
	if got[StuckInError] != &pod || got[Orphaned] != &svc || got[Kernel] != nil || len(got) != 3 {
		t.Errorf("finding workloads %v, want stuck-in-error the pod's, orphaned the holder's service, kernel none", got)
	}
	q := rc(18, "RTS", Process{}, holder)
	if q.Workload() != &svc {
		t.Errorf("orphan QP's workload %v, want its holder's", q.Workload())
	}
	// A live owner whose cgroup is unknown: its workload is unknown, not
	// a holder's.
	if q := rc(19, "RTS", Process{PID: 300, Comm: "app"}, holder); q.Workload() != nil {
		t.Errorf("QP of a live owner with no workload has workload %v, want none (not its holder's)", q.Workload())
	}
	// A kernel QP has none, whatever processes are listed with it.
	k := kern(1, "GSI", "RTS", "ib_core")
	k.Holders = []Process{holder}
	if k.Workload() != nil {
		t.Errorf("kernel QP has workload %v", k.Workload())
	}
}

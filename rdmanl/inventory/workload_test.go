package inventory

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/qpdrain/qpdrain/rdmanl"
	"github.com/qpdrain/qpdrain/workload"
)

// TestTakeWorkloads: owners and holders get the workload of their cgroup;
// a process without a readable cgroup file, and a kernel QP, get none.
func TestTakeWorkloads(t *testing.T) {
	const uv = "/dev/infiniband/uverbs0"
	const pod = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod8f3a2c1d_5e6b_4a7c_9d0e_1f2a3b4c5d6e.slice/" +
		"cri-containerd-4c8b2d1f0e9a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c.scope"
	proc := procTree(t,
		task{pid: 100, tgid: 100, comm: "trainer", fds: map[int]string{5: uv}},
		task{pid: 200, tgid: 200, comm: "child", fds: map[int]string{3: uv}},
		task{pid: 300, tgid: 300, comm: "hidden"},
	)
	for pid, body := range map[string]string{"100": "0::" + pod + "\n", "200": "0::/system.slice/app.service\n"} {
		if err := os.WriteFile(filepath.Join(proc, pid, "cgroup"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	src := &fakeSource{
		devs: []rdmanl.Device{{Index: 1, Name: "rxe0"}},
		qps: []rdmanl.QP{
			{Device: 1, DeviceName: "rxe0", LQPN: 1, KernName: "ib_core", Has: rdmanl.HasKernName},
			{Device: 1, DeviceName: "rxe0", LQPN: 17, PID: 100, Has: rdmanl.HasPID},
			{Device: 1, DeviceName: "rxe0", LQPN: 18, PID: 100, Has: rdmanl.HasPID},
			{Device: 1, DeviceName: "rxe0", LQPN: 19, PID: 300, Has: rdmanl.HasPID},
		},
	}
	snap, err := Take(context.Background(), src, Options{Proc: Proc{Root: proc}})
	if err != nil {
		t.Fatal(err)
	}
	inPod := workload.Parse(pod)
	for _, q := range snap.QPs {
		var got *workload.Workload
		if q.Owner != nil {
			got = q.Owner.Workload
		}
		switch q.LQPN {
		case 17, 18:
			if got == nil || *got != inPod || got.PodUID != "8f3a2c1d-5e6b-4a7c-9d0e-1f2a3b4c5d6e" {
				t.Errorf("QP %d: workload %+v, want %+v", q.LQPN, got, inPod)
			}
		case 1, 19:
			if got != nil {
				t.Errorf("QP %d: workload %+v, want none", q.LQPN, got)
			}
		}
		if q.LQPN != 1 && (len(q.Holders) != 2 || q.Holders[1].Workload == nil || q.Holders[1].Workload.Unit != "app.service") {
			t.Errorf("QP %d: holders %+v, want the child's app.service", q.LQPN, q.Holders)
		}
	}
}

package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/leaks"
	"github.com/qpdrain/qpdrain/rdmanl"
	"github.com/qpdrain/qpdrain/rdmanl/inventory"
	"github.com/qpdrain/qpdrain/workload"
)

const (
	testPodUID = "8f3a2c1d-5e6b-4a7c-9d0e-1f2a3b4c5d6e"
	testCID    = "4c8b2d1f0e9a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c"
	testPodCg  = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod8f3a2c1d_5e6b_4a7c_9d0e_1f2a3b4c5d6e.slice/cri-containerd-" + testCID + ".scope"
)

// workloadQPs are testQPs with workloads: 17's owner in a pod, 19's
// holder (its creator gone) in a service, 33's owner in a pod's zombie
// whose workload does not count.
func workloadQPs() []inventory.QP {
	qps := testQPs()
	pod := workload.Parse(testPodCg)
	svc := workload.Parse("/system.slice/app.service")
	qps[0].Owner.Workload = &pod
	qps[1].Holders[0].Workload = &svc
	qps[3].Owner.Workload = &pod
	qps[3].Owner.Zombie = true
	return qps
}

func TestQPWorkloadFilters(t *testing.T) {
	checkQPFilters(t, workloadQPs(), []qpFilterCase{
		{[]string{"pod", testPodUID}, []uint32{17}, ""},
		{[]string{"pod", strings.ReplaceAll(strings.ToUpper(testPodUID), "-", "_")}, []uint32{17}, ""},
		{[]string{"pod", "0000,1111"}, nil, ""},
		{[]string{"cgroup", "/kubepods.slice"}, []uint32{17}, ""},
		{[]string{"cgroup", "/kubepods.slice/"}, []uint32{17}, ""},
		{[]string{"cgroup", "/kubepods"}, nil, ""},
		{[]string{"cgroup", "/system.slice/app.service,/kubepods.slice"}, []uint32{17, 19}, ""},
		{[]string{"cgroup", "/"}, []uint32{17, 19}, ""},
		{[]string{"cgroup", "/system.slice", "link", "rxe0/1"}, nil, ""},
		{[]string{"cgroup", "system.slice"}, nil, "is not a cgroup path"},
		{[]string{"pod", "a,"}, nil, "empty word"},
	})
}

func TestQPWorkloadOutput(t *testing.T) {
	qps := workloadQPs()
	want := " owner 100/server via qp pod " + testPodUID + " container containerd://" + testCID + " holders 100/server\n"
	if got := string(appendQPLine(nil, &qps[0], true)); !strings.HasSuffix(got, want) {
		t.Errorf("-d line:\n got  %q\n want ...%q", got, want)
	}
	var b bytes.Buffer
	f, _ := inventory.ParseFilter([]string{"lqpn", "17"})
	if err := printQPs(&b, &inventory.Snapshot{QPs: qps}, &f, true, false); err != nil {
		t.Fatal(err)
	}
	wantJSON := `"owner":{"pid":100,"tid":105,"comm":"server","via":"qp","cgroup":{"path":"` + testPodCg + `","slice":"kubepods-besteffort-pod8f3a2c1d_5e6b_4a7c_9d0e_1f2a3b4c5d6e.slice",` +
		`"unit":"cri-containerd-` + testCID + `.scope","container_id":"` + testCID + `","runtime":"containerd","pod_uid":"` + testPodUID + `","qos_class":"BestEffort"}}`
	if !strings.Contains(b.String(), wantJSON) {
		t.Errorf("-j:\n got  %s\n want ...%s", b.String(), wantJSON)
	}
}

// TestLeaksNameWorkload: the leak analysis sees the snapshot's workloads,
// and a finding's text line names its pod and container.
func TestLeaksNameWorkload(t *testing.T) {
	qps := workloadQPs()
	snap := &inventory.Snapshot{Devices: []inventory.Device{{Device: rdmanl.Device{Index: 1, Name: "rxe0"}, Holders: qps[1].Holders},
		{Device: rdmanl.Device{Index: 2, Name: "mlx5_0"}}}, QPs: qps}
	s := leaks.FromSnapshot(snap, time.Unix(1, 0))
	var owner, orphan *leaks.QP
	for i := range s.Devices[0].QPs {
		switch q := &s.Devices[0].QPs[i]; q.LQPN {
		case 17:
			owner = q
		case 19:
			orphan = q
		}
	}
	if owner == nil || owner.Workload() != qps[0].Owner.Workload || orphan == nil || orphan.Workload() != qps[1].Holders[0].Workload {
		t.Fatalf("sample lost the workloads: %+v", s.Devices[0].QPs)
	}
	r := leaks.Analyze([]leaks.Sample{s, s, s}, leaks.Options{})
	var b strings.Builder
	if err := formatLeaks(&b, &r, time.Second, false); err != nil {
		t.Fatal(err)
	}
	want := "orphaned link rxe0 cgroup /system.slice/app.service qps 1 lqpn 19\n"
	if !strings.Contains(b.String(), want) {
		t.Errorf("leaks text lacks %q:\n%s", want, b.String())
	}
	pod := workload.Parse(testPodCg)
	r = leaks.Report{Samples: 3, Findings: []leaks.Finding{{Reason: leaks.StuckInError, Device: "rxe0",
		Owner: &leaks.Process{PID: 100, Comm: "trainer", Workload: &pod}, QPs: []leaks.QPRef{{LQPN: 17}}}}}
	b.Reset()
	if err := formatLeaks(&b, &r, time.Second, false); err != nil {
		t.Fatal(err)
	}
	want = "stuck-in-error link rxe0 pid 100 comm trainer pod " + testPodUID + " container containerd://" + testCID + " qps 1 lqpn 17\n"
	if !strings.Contains(b.String(), want) {
		t.Errorf("leaks text lacks %q:\n%s", want, b.String())
	}
}

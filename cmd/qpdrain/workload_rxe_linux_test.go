package main

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/internal/testing/cgrouptest"
	"github.com/qpdrain/qpdrain/internal/testing/promcheck"
	"github.com/qpdrain/qpdrain/leaks"
	"github.com/qpdrain/qpdrain/workload"
)

// TestWorkloadRxe puts a QP-holding helper (two of its QPs left in ERR)
// into a cgroup shaped as the kubelet's systemd driver and containerd name
// a BestEffort pod's container, on the guest's cgroup2, and checks that
// qpdrain qps -j, qpdrain leaks and the exporter's /metrics report its QPs
// with the pod UID and container id.
func TestWorkloadRxe(t *testing.T) {
	needRxe(t)
	const uid = "5b0c9a7e-3d2f-4e1a-8b6c-0d9e8f7a6b5c"
	const cid = "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d"
	root := cgrouptest.Root(t)
	stuck := startHelper(t, "stuck")
	pid := stuck.pid(t, "pid")
	esc := strings.ReplaceAll(uid, "-", "_")
	path := cgrouptest.Place(t, root, []string{"kubepods.slice", "kubepods-besteffort.slice"},
		[]string{"kubepods-besteffort-pod" + esc + ".slice", "cri-containerd-" + cid + ".scope"}, pid)
	qpns := parseQPNs(t, stuck.ready["qpns"])
	errQPNs := parseQPNs(t, stuck.ready["err"])
	want := workload.Workload{Path: path, Slice: "kubepods-besteffort-pod" + esc + ".slice", Unit: "cri-containerd-" + cid + ".scope",
		ContainerID: cid, Runtime: workload.Containerd, PodUID: uid, QoS: workload.BestEffort}

	var objs []qpJSON
	runJSON(t, exitClean, &objs, "qps", "-j", "pod", uid)
	var got []uint32
	for _, o := range objs {
		got = append(got, o.LQPN)
		if o.Owner == nil || o.Owner.PID != uint32(pid) || o.Owner.Workload == nil || *o.Owner.Workload != want {
			t.Errorf("QP %d: owner %+v, want pid %d in %+v", o.LQPN, o.Owner, pid, want)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, qpns) {
		t.Errorf("qps pod %s: QPs %v, want the helper's %v", uid, got, qpns)
	}
	if out, err := runQpdrain(t, "qps", "-d", "cgroup", "/kubepods.slice/kubepods-besteffort.slice"); err != nil ||
		strings.Count(out, " pod "+uid+" container containerd://"+cid+" ") != len(qpns) {
		t.Errorf("qps -d cgroup: %v, want %d lines naming the pod and container:\n%s", err, len(qpns), out)
	}

	var r leaksJSON
	out := runJSON(t, exitFindings, &r, "leaks", "-j", "--for", "2s", "--interval", "500ms")
	var stuckFinding *leaks.Finding
	for i := range r.Findings {
		if f := &r.Findings[i]; f.Reason == leaks.StuckInError && f.Owner != nil && f.Owner.PID == pid {
			stuckFinding = f
		}
	}
	if stuckFinding == nil || stuckFinding.Workload() == nil || *stuckFinding.Workload() != want || !slices.Equal(lqpns(stuckFinding.QPs), errQPNs) {
		t.Errorf("leaks: no stuck-in-error finding of pid %d in pod %s with QPs %v:\n%s", pid, uid, errQPNs, out)
	}
	text, _ := runQpdrain(t, "leaks", "--for", "1s", "--interval", "500ms")
	line := fmt.Sprintf(`(?m)^stuck-in-error link \S+ pid %d comm \S+ pod %s container containerd://%s qps %d lqpn `, pid, uid, cid, len(errQPNs))
	if !regexp.MustCompile(line).MatchString(text) {
		t.Errorf("leaks text does not name the pod and container:\n%s", text)
	}

	body := scrapeExporter(t, hostOptions{proc: "/proc", sys: "/sys", dev: "/dev", timeout: time.Minute})
	promcheck.Check(t, body)
	n := 0
	re := regexp.MustCompile(`(?m)^qpdrain_workload_qps\{cgroup="/kubepods.slice",device="\w+",pod_uid="` + uid + `",state="\w+"\} (\d+)$`)
	for _, m := range re.FindAllStringSubmatch(string(body), -1) {
		v, _ := strconv.Atoi(m[1])
		n += v
	}
	if n != len(qpns) {
		t.Errorf("qpdrain_workload_qps of pod %s sum to %d, want the helper's %d QPs:\n%s", uid, n, len(qpns), body)
	}
	if !regexp.MustCompile(`(?m)^qpdrain_workload_leak_qps\{cgroup="/kubepods.slice",device="\w+",pod_uid="` + uid + `",reason="stuck-in-error"\} ` +
		strconv.Itoa(len(errQPNs)) + `$`).Match(body) {
		t.Errorf("/metrics has no qpdrain_workload_leak_qps of pod %s with its %d stuck QPs:\n%s", uid, len(errQPNs), body)
	}
}

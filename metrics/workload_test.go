package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/internal/testing/promcheck"
	"github.com/qpdrain/qpdrain/leaks"
	"github.com/qpdrain/qpdrain/workload"
)

const (
	podA = "8f3a2c1d-5e6b-4a7c-9d0e-1f2a3b4c5d6e"
	podB = "0f1e2d3c-4b5a-4978-8796-a5b4c3d2e1f0"
)

// podHost is rxe0 with QPs of two pods (one leaking two in ERR), a
// service's, an orphan held by pod B's process, and the GSI QP.
func podHost(at time.Time) leaks.Sample {
	a := workload.Parse("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + strings.ReplaceAll(podA, "-", "_") + ".slice/" +
		"cri-containerd-4c8b2d1f0e9a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c.scope")
	b := workload.Parse("/kubepods/pod" + podB + "/1c8b2d1f0e9a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c")
	svc := workload.Parse("/system.slice/app.service")
	pa := leaks.Process{PID: 100, Comm: "trainer", Workload: &a}
	pb := leaks.Process{PID: 200, Comm: "server", Workload: &b}
	ps := leaks.Process{PID: 300, Comm: "app", Workload: &svc}
	return leaks.Sample{At: at, Devices: []leaks.Device{{Name: "rxe0", QPs: []leaks.QP{
		{Port: 1, LQPN: 1, Type: "GSI", State: "RTS", KernName: "ib_core"},
		{Port: 1, LQPN: 17, Type: "RC", State: "ERR", Owner: pa},
		{Port: 1, LQPN: 18, Type: "RC", State: "ERR", Owner: pa},
		{Port: 1, LQPN: 19, Type: "RC", State: "RTS", Owner: pa},
		{Port: 1, LQPN: 20, Type: "RC", State: "RTS", Owner: pb},
		{Port: 1, LQPN: 21, Type: "RC", State: "RTS", Owner: ps},
		{Port: 1, LQPN: 22, Type: "RC", State: "RTS", Holders: []leaks.Process{pb}},
	}}}}
}

func TestWorkloadMetrics(t *testing.T) {
	samples := []leaks.Sample{podHost(t0), podHost(t0.Add(time.Second)), podHost(t0.Add(2 * time.Second))}
	r := leaks.Analyze(samples, leaks.Options{})
	reg, err := Registry(&r, samples)
	if err != nil {
		t.Fatal(err)
	}
	text := scrape(t, reg)
	for _, want := range []string{
		`qpdrain_workload_qps{cgroup="/kubepods.slice",device="rxe0",pod_uid="` + podA + `",state="ERR"} 2`,
		`qpdrain_workload_qps{cgroup="/kubepods.slice",device="rxe0",pod_uid="` + podA + `",state="RTS"} 1`,
		// pod B's own QP and the orphan its process holds
		`qpdrain_workload_qps{cgroup="/kubepods",device="rxe0",pod_uid="` + podB + `",state="RTS"} 2`,
		`qpdrain_workload_qps{cgroup="/system.slice",device="rxe0",pod_uid="",state="RTS"} 1`,
		`qpdrain_workload_qps{cgroup="",device="rxe0",pod_uid="",state="RTS"} 1`,
		`qpdrain_workload_leak_findings{cgroup="/kubepods.slice",device="rxe0",pod_uid="` + podA + `",reason="stuck-in-error"} 1`,
		`qpdrain_workload_leak_qps{cgroup="/kubepods.slice",device="rxe0",pod_uid="` + podA + `",reason="stuck-in-error"} 2`,
		`qpdrain_workload_leak_qps{cgroup="/kubepods",device="rxe0",pod_uid="` + podB + `",reason="orphaned"} 1`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("metrics lack %s:\n%s", want, text)
		}
	}
	if n := strings.Count(text, "qpdrain_workload_leak_qps{"); n != 2 {
		t.Errorf("%d qpdrain_workload_leak_qps series, want one per leaking workload (2):\n%s", n, text)
	}
	for _, bad := range []string{"pid=", "container", "4c8b2d1f", "app.service"} {
		if strings.Contains(text, bad) {
			t.Errorf("metrics carry %q, an unbounded label value:\n%s", bad, text)
		}
	}
	promcheck.Check(t, []byte(text))
}

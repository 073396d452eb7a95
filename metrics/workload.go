package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/qpdrain/qpdrain/leaks"
	"github.com/qpdrain/qpdrain/workload"
)

// The per-workload metrics. A workload is labelled pod_uid (the
// Kubernetes pod UID, empty outside Kubernetes) and cgroup (the top-level
// cgroup: /kubepods.slice, /system.slice, /user.slice); both are empty for
// kernel QPs and for QPs whose processes' cgroups could not be read. So the
// series stay bounded by the live pods and the host's top-level cgroups:
// never a pid, a container or a full cgroup path. A series goes with the
// last QP of its workload.
var (
	workloadQPsDesc = prometheus.NewDesc("qpdrain_workload_qps",
		"QPs on the host by RDMA device, state and workload: the pod (pod_uid), else the top-level cgroup of the process that owns or holds them.",
		[]string{"device", "state", "pod_uid", "cgroup"}, nil)
	workloadFindingsDesc = prometheus.NewDesc("qpdrain_workload_leak_findings",
		"Leak findings by reason, device and workload (pod_uid, else top-level cgroup) over the sampling window.",
		[]string{"reason", "device", "pod_uid", "cgroup"}, nil)
	workloadFindingQPsDesc = prometheus.NewDesc("qpdrain_workload_leak_qps",
		"QPs named by leak findings, by reason, device and workload (pod_uid, else top-level cgroup).",
		[]string{"reason", "device", "pod_uid", "cgroup"}, nil)
)

// workloadLabels are a workload's pod_uid and cgroup labels.
type workloadLabels struct{ pod, cgroup string }

func labelsOf(w *workload.Workload) workloadLabels {
	if w == nil {
		return workloadLabels{}
	}
	return workloadLabels{w.PodUID, w.Top()}
}

// collectWorkloads sends the per-workload metrics of a report and the
// sample it ended with.
func collectWorkloads(ch chan<- prometheus.Metric, r *leaks.Report, last leaks.Sample) {
	type qpKey struct {
		device, state string
		workloadLabels
	}
	counts := map[qpKey]int{}
	var order []qpKey
	for _, d := range last.Devices {
		for i := range d.QPs {
			q := &d.QPs[i]
			k := qpKey{d.Name, q.State, labelsOf(q.Workload())}
			if counts[k] == 0 {
				order = append(order, k)
			}
			counts[k]++
		}
	}
	for _, k := range order {
		ch <- prometheus.MustNewConstMetric(workloadQPsDesc, prometheus.GaugeValue, float64(counts[k]), k.device, k.state, k.pod, k.cgroup)
	}
	type findingKey struct {
		reason, device string
		workloadLabels
	}
	type tally struct{ findings, qps int }
	tallies := map[findingKey]*tally{}
	var forder []findingKey
	for i := range r.Findings {
		f := &r.Findings[i]
		k := findingKey{string(f.Reason), f.Device, labelsOf(f.Workload())}
		t := tallies[k]
		if t == nil {
			t = &tally{}
			tallies[k] = t
			forder = append(forder, k)
		}
		t.findings++
		t.qps += len(f.QPs)
	}
	for _, k := range forder {
		t := tallies[k]
		ch <- prometheus.MustNewConstMetric(workloadFindingsDesc, prometheus.GaugeValue, float64(t.findings), k.reason, k.device, k.pod, k.cgroup)
		ch <- prometheus.MustNewConstMetric(workloadFindingQPsDesc, prometheus.GaugeValue, float64(t.qps), k.reason, k.device, k.pod, k.cgroup)
	}
}

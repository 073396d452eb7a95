// Package metrics exposes the host's QPs and the leak findings of package
// leaks as Prometheus metrics: for node_exporter's textfile collector
// (WriteTextfile, after a qpdrain leaks run) and for a scraped daemon
// (Exporter, a fresh read of the host per scrape).
//
// Labels stay low-cardinality: device, port, type, state and reason, and
// for the per-workload metrics the pod UID and the top-level cgroup
// (bounded by the live pods); never a pid, a container or a QP number,
// which change with every process and connection.
// A port of 0 stands for QPs the kernel reports without one (RESET).
package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/qpdrain/qpdrain/leaks"
)

// The metrics both the textfile and the exporter carry.
var (
	qpsDesc = prometheus.NewDesc("qpdrain_qps",
		"QPs on the host by RDMA device, port (0: none, as in RESET), type and state, as RDMA netlink reports them.",
		[]string{"device", "port", "type", "state"}, nil)
	maxQPDesc = prometheus.NewDesc("qpdrain_device_max_qp",
		"The device's max_qp (ibv_query_device); absent when it could not be read.",
		[]string{"device"}, nil)
	findingsDesc = prometheus.NewDesc("qpdrain_leak_findings",
		"Leak findings by reason and device over the sampling window (docs/LEAKS.md).",
		[]string{"reason", "device"}, nil)
	findingQPsDesc = prometheus.NewDesc("qpdrain_leak_qps",
		"QPs named by leak findings, by reason and device.",
		[]string{"reason", "device"}, nil)
	windowDesc = prometheus.NewDesc("qpdrain_leak_window_seconds",
		"The time the samples behind the findings span: a lower bound of every dwell they state.",
		nil, nil)
	samplesDesc = prometheus.NewDesc("qpdrain_leak_samples",
		"How many samples the findings are based on.",
		nil, nil)
)

// qpKey is one series of qpdrain_qps.
type qpKey struct {
	device, port, typ, state string
}

// collect sends the metrics of a report and the sample it ended with.
func collect(ch chan<- prometheus.Metric, r *leaks.Report, last leaks.Sample) {
	counts := map[qpKey]int{}
	var order []qpKey
	for _, d := range last.Devices {
		for i := range d.QPs {
			q := &d.QPs[i]
			k := qpKey{d.Name, strconv.FormatUint(uint64(q.Port), 10), q.Type, q.State}
			if counts[k] == 0 {
				order = append(order, k)
			}
			counts[k]++
		}
	}
	for _, k := range order {
		ch <- prometheus.MustNewConstMetric(qpsDesc, prometheus.GaugeValue, float64(counts[k]), k.device, k.port, k.typ, k.state)
	}
	for _, d := range r.Devices {
		if d.MaxQP > 0 {
			ch <- prometheus.MustNewConstMetric(maxQPDesc, prometheus.GaugeValue, float64(d.MaxQP), d.Name)
		}
		// Every reason of every device, zeros too, so that alerts and
		// dashboards see a series that is 0, not one that is missing.
		for _, reason := range leaks.Reasons() {
			n := 0
			for _, f := range r.Findings {
				if f.Reason == reason && f.Device == d.Name {
					n++
				}
			}
			ch <- prometheus.MustNewConstMetric(findingsDesc, prometheus.GaugeValue, float64(n), string(reason), d.Name)
			ch <- prometheus.MustNewConstMetric(findingQPsDesc, prometheus.GaugeValue, float64(r.QPCount(reason, d.Name)), string(reason), d.Name)
		}
	}
	collectWorkloads(ch, r, last)
	ch <- prometheus.MustNewConstMetric(windowDesc, prometheus.GaugeValue, r.Window().Seconds())
	ch <- prometheus.MustNewConstMetric(samplesDesc, prometheus.GaugeValue, float64(r.Samples))
}

func describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{qpsDesc, maxQPDesc, findingsDesc, findingQPsDesc, windowDesc, samplesDesc,
		workloadQPsDesc, workloadFindingsDesc, workloadFindingQPsDesc} {
		ch <- d
	}
}

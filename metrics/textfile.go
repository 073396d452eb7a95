package metrics

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/qpdrain/qpdrain/leaks"
)

var runDesc = prometheus.NewDesc("qpdrain_leaks_last_run_timestamp_seconds",
	"When the qpdrain leaks run that wrote this file ended (Unix time).", nil, nil)

// reportCollector is a finished qpdrain leaks run.
type reportCollector struct {
	r    *leaks.Report
	last leaks.Sample
}

func (c reportCollector) Describe(ch chan<- *prometheus.Desc) {
	describe(ch)
	ch <- runDesc
}

func (c reportCollector) Collect(ch chan<- prometheus.Metric) {
	collect(ch, c.r, c.last)
	ch <- prometheus.MustNewConstMetric(runDesc, prometheus.GaugeValue, float64(c.r.End.UnixNano())/float64(time.Second))
}

// Registry returns a registry holding the metrics of a finished run: the
// report and the samples it was made from (the QP counts are the last
// sample's).
func Registry(r *leaks.Report, samples []leaks.Sample) (*prometheus.Registry, error) {
	if len(samples) == 0 {
		return nil, errors.New("no samples to make metrics of")
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(reportCollector{r: r, last: samples[len(samples)-1]}); err != nil {
		return nil, fmt.Errorf("registering the leak metrics: %w", err)
	}
	return reg, nil
}

// WriteTextfile writes the metrics of a finished run to path in the
// Prometheus text format, atomically: a temporary file in path's directory
// renamed over path, so node_exporter's textfile collector never reads half
// a file. The temporary name does not end in .prom, so the collector
// ignores it.
func WriteTextfile(path string, r *leaks.Report, samples []leaks.Sample) error {
	reg, err := Registry(r, samples)
	if err != nil {
		return err
	}
	if err := prometheus.WriteToTextfile(path, reg); err != nil {
		return fmt.Errorf("writing metrics to %s: %w", path, err)
	}
	return nil
}

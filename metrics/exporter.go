package metrics

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/qpdrain/qpdrain/leaks"
)

// Defaults of ExporterOptions.
const (
	DefaultWindow        = 5 * time.Minute
	DefaultScrapeTimeout = 10 * time.Second
	// maxHistory bounds the samples an exporter keeps for its findings,
	// whatever the scrape rate: memory stays a few samples of the host.
	maxHistory = 16
)

var (
	scrapeDurationDesc = prometheus.NewDesc("qpdrain_scrape_duration_seconds",
		"How long this scrape's read of the host's QPs took.", nil, nil)
	scrapeErrorsDesc = prometheus.NewDesc("qpdrain_scrape_errors_total",
		"Scrapes whose read of the host's QPs failed.", nil, nil)
	scrapeSuccessDesc = prometheus.NewDesc("qpdrain_scrape_success",
		"1 when this scrape read the host's QPs, 0 when the read failed.", nil, nil)
)

// ExporterOptions configure an Exporter.
type ExporterOptions struct {
	// Window is how far back the samples behind the findings reach; the
	// samples are the exporter's earlier scrapes, at most 16 of them. 0
	// means DefaultWindow.
	Window time.Duration
	// ScrapeTimeout bounds each read of the host; 0 means
	// DefaultScrapeTimeout.
	ScrapeTimeout time.Duration
	// Analyze tunes the findings (near-limit threshold, max_qp).
	Analyze leaks.Options
	// Limits, when set, gives the devices' max_qp at each scrape in place
	// of Analyze.Limits (a device may appear after the exporter started).
	Limits func() map[string]leaks.Limit
	// Log receives a warning per failed scrape; nil discards.
	Log *slog.Logger
}

// Exporter is a prometheus.Collector that reads the host's QPs afresh on
// every scrape and reports findings over the scrapes of the last window.
// It is safe for concurrent scrapes, which it serialises.
type Exporter struct {
	sampler leaks.Sampler
	o       ExporterOptions

	mu      sync.Mutex
	history []leaks.Sample
	errors  uint64
}

// NewExporter returns an Exporter reading the host through s.
func NewExporter(s leaks.Sampler, o ExporterOptions) *Exporter {
	if o.Window <= 0 {
		o.Window = DefaultWindow
	}
	if o.ScrapeTimeout <= 0 {
		o.ScrapeTimeout = DefaultScrapeTimeout
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return &Exporter{sampler: s, o: o}
}

// Describe sends the descriptors of every metric the exporter can send.
func (e *Exporter) Describe(ch chan<- *prometheus.Desc) {
	describe(ch)
	for _, d := range []*prometheus.Desc{scrapeDurationDesc, scrapeErrorsDesc, scrapeSuccessDesc} {
		ch <- d
	}
}

// Collect reads the host once and sends its metrics. A failed read sends
// only the scrape metrics, with qpdrain_scrape_success 0.
func (e *Exporter) Collect(ch chan<- prometheus.Metric) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), e.o.ScrapeTimeout)
	defer cancel()
	start := time.Now()
	s, err := e.sampler.Sample(ctx)
	took := time.Since(start)
	ok := 1.0
	if err != nil {
		e.errors++
		ok = 0
		e.o.Log.LogAttrs(ctx, slog.LevelWarn, "scrape: reading the host's QPs failed", slog.Any("error", err))
	} else {
		e.history = append(e.history, s)
		e.trim(s.At)
		ao := e.o.Analyze
		if e.o.Limits != nil {
			ao.Limits = e.o.Limits()
		}
		r := leaks.Analyze(e.history, ao)
		collect(ch, &r, s)
	}
	ch <- prometheus.MustNewConstMetric(scrapeDurationDesc, prometheus.GaugeValue, took.Seconds())
	ch <- prometheus.MustNewConstMetric(scrapeErrorsDesc, prometheus.CounterValue, float64(e.errors))
	ch <- prometheus.MustNewConstMetric(scrapeSuccessDesc, prometheus.GaugeValue, ok)
}

// trim drops samples older than the window and the oldest past maxHistory.
func (e *Exporter) trim(now time.Time) {
	i := 0
	for i < len(e.history)-1 && (now.Sub(e.history[i].At) > e.o.Window || len(e.history)-i > maxHistory) {
		i++
	}
	e.history = append(e.history[:0], e.history[i:]...)
}

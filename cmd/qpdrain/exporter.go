package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/qpdrain/qpdrain/leaks"
	"github.com/qpdrain/qpdrain/metrics"
)

func init() { subcommands = append(subcommands, newExporterCmd) }

// exporterOptions are the flags of "qpdrain exporter".
type exporterOptions struct {
	listen    string
	window    time.Duration
	nearLimit float64
	host      hostOptions
}

func newExporterCmd(opts *globalOptions) *cobra.Command {
	o := &exporterOptions{}
	cmd := &cobra.Command{
		Use:   "exporter",
		Short: "Serve the host's QPs and leak findings as Prometheus metrics on /metrics",
		Long: `Serve Prometheus metrics on --listen: each scrape of /metrics reads the host's QPs afresh
through RDMA netlink (qpdrain_qps by device, port, type and state; qpdrain_device_max_qp), runs
the leak analysis of qpdrain leaks over the scrapes of the last --window (qpdrain_leak_findings
and qpdrain_leak_qps by reason and device), and reports its own cost (qpdrain_scrape_duration_seconds,
qpdrain_scrape_errors_total). No label carries a pid or a QP number. deploy/ has a DaemonSet
and alert rules. It stops on SIGINT or SIGTERM, its normal end: exit 0.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// A signal cancels the context (execute): the exporter's normal
			// end, exit 0.
			ctx := cmdContext(cmd)
			ln, err := net.Listen("tcp", o.listen)
			if err != nil {
				return withExitCode(exitError, fmt.Errorf("listening on %s: %w", o.listen, err))
			}
			return serveExporter(ctx, ln, cmd.ErrOrStderr(), opts, o)
		},
	}
	o.host.flags(cmd, metrics.DefaultScrapeTimeout)
	f := cmd.Flags()
	stringFlag(f, &o.listen, "listen", ":9879", "the address to serve /metrics on (HOST:PORT, :PORT)", listenAddress)
	durationFlag(f, &o.window, "window", metrics.DefaultWindow, "how far back the scrapes behind the findings reach", positive)
	floatFlag(f, &o.nearLimit, "near-limit", leaks.DefaultNearLimit, "fraction of max_qp at which a device is near its limit", fraction(true))
	return cmd
}

// listenAddress refuses what net.Listen would not take, or would take as
// "any port" (":0" and "" listen on a random port nobody scrapes).
func listenAddress(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.New("want HOST:PORT or :PORT")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q: want 1 to 65535", port)
	}
	return nil
}

// limitCache asks each device its max_qp once: it does not change.
type limitCache struct {
	mu sync.Mutex
	h  host
	m  map[string]leaks.Limit
}

// sampler returns a Sampler that fills the cache with the limits of the
// devices each sample names, after the sample, so that qpdrain's own open
// of a device is never in one.
func (c *limitCache) sampler(timeout time.Duration) leaks.Sampler {
	return samplerFunc(func(ctx context.Context) (leaks.Sample, error) {
		s, err := boundedSampler{c.h, timeout}.Sample(ctx)
		if err != nil {
			return s, err
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		var missing []string
		for _, d := range hostDevices(s) {
			if _, ok := c.m[d]; !ok {
				missing = append(missing, d)
			}
		}
		for d, l := range c.h.Limits(missing) {
			c.m[d] = l
		}
		return s, nil
	})
}

func (c *limitCache) limits() map[string]leaks.Limit {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]leaks.Limit, len(c.m))
	for k, v := range c.m {
		out[k] = v
	}
	return out
}

// samplerFunc is a function that is a leaks.Sampler.
type samplerFunc func(ctx context.Context) (leaks.Sample, error)

func (f samplerFunc) Sample(ctx context.Context) (leaks.Sample, error) { return f(ctx) }

// serveExporter serves /metrics on ln until ctx is done.
func serveExporter(ctx context.Context, ln net.Listener, stderr io.Writer, opts *globalOptions, o *exporterOptions) error {
	h, err := openHost(o.host, stderr)
	if err != nil {
		ln.Close()
		return hostError(err)
	}
	defer h.Close()
	cache := &limitCache{h: h, m: map[string]leaks.Limit{}}
	exp := metrics.NewExporter(cache.sampler(o.host.timeout), metrics.ExporterOptions{
		Window: o.window, ScrapeTimeout: o.host.timeout, Log: opts.log,
		Analyze: leaks.Options{NearLimit: o.nearLimit, IPoIBNonSRQLimit: ipoibNonSRQLimit()},
		Limits:  cache.limits,
	})
	reg := prometheus.NewRegistry()
	if err := reg.Register(exp); err != nil {
		ln.Close()
		return withExitCode(exitError, fmt.Errorf("registering the exporter: %w", err))
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: opts.log}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintln(w, "qpdrain exporter: the host's QPs and leak findings on /metrics")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	opts.log.WithField("listen", ln.Addr().String()).Info("serving /metrics")
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return withExitCode(exitError, fmt.Errorf("serving /metrics: %w", err))
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return withExitCode(exitError, fmt.Errorf("stopping the exporter: %w", err))
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return withExitCode(exitError, fmt.Errorf("serving /metrics: %w", err))
	}
	return nil
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/exporter-toolkit/web"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/qpdrain/qpdrain/leaks"
	"github.com/qpdrain/qpdrain/metrics"
)

func init() { subcommands = append(subcommands, newExporterCmd) }

// exporterOptions are the flags of "qpdrain exporter".
type exporterOptions struct {
	// listen, telemetryPath and webConfig are the flags every Prometheus
	// exporter shares (exporter-toolkit's web package).
	listen        []string
	telemetryPath string
	webConfig     string
	window        time.Duration
	nearLimit     float64
	host          hostOptions
}

func newExporterCmd(opts *globalOptions) *cobra.Command {
	o := &exporterOptions{}
	cmd := &cobra.Command{
		Use:   "exporter",
		Short: "Serve the host's QPs and leak findings as Prometheus metrics on /metrics",
		Long: `Serve Prometheus metrics on each --web.listen-address: each scrape of --web.telemetry-path
reads the host's QPs afresh through RDMA netlink (qpdrain_qps by device, port, type and state;
qpdrain_workload_qps by device, state and pod UID or top-level cgroup; qpdrain_device_max_qp),
runs the leak analysis of qpdrain leaks over the scrapes of the last --window
(qpdrain_leak_findings and qpdrain_leak_qps by reason and device, qpdrain_workload_leak_* also
by workload), and reports its own cost (qpdrain_scrape_duration_seconds,
qpdrain_scrape_errors_total). No label carries a pid, a container or a QP number.
--web.config.file enables TLS and basic authentication as Prometheus's exporter-toolkit reads
them (its docs/web-configuration.md: tls_server_config, basic_auth_users with bcrypt hashes).
/ is a landing page; /healthz answers 200 "ok" without reading the host, for liveness and
readiness probes (behind the same TLS and basic authentication). deploy/ has a DaemonSet and
alert rules. It stops on SIGINT or SIGTERM, its
normal end: exit 0.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Every input is checked before the first listener opens.
			if err := o.check(); err != nil {
				return withExitCode(exitError, err)
			}
			// A signal cancels the context (execute): the exporter's normal
			// end, exit 0.
			ctx := cmdContext(cmd)
			var lns []net.Listener
			for _, addr := range o.listen {
				ln, err := net.Listen("tcp", addr)
				if err != nil {
					closeAll(lns)
					return withExitCode(exitError, fmt.Errorf("listening on %s: %w", addr, err))
				}
				lns = append(lns, ln)
			}
			return serveExporter(ctx, lns, cmd.ErrOrStderr(), opts, o)
		},
	}
	o.host.flags(cmd, metrics.DefaultScrapeTimeout)
	f := cmd.Flags()
	stringsFlag(f, &o.listen, "web.listen-address", []string{":9879"}, "address to serve the landing page and metrics on (HOST:PORT, :PORT); repeat for more (--listen is an alias)", listenAddress)
	f.StringVar(&o.telemetryPath, "web.telemetry-path", "/metrics", "path to serve the metrics on")
	f.StringVar(&o.webConfig, "web.config.file", "", "web configuration file for TLS and basic authentication (Prometheus exporter-toolkit's format)")
	// --listen was this command's flag before it took the exporters' names.
	f.SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		if name == "listen" {
			name = "web.listen-address"
		}
		return pflag.NormalizedName(name)
	})
	durationFlag(f, &o.window, "window", metrics.DefaultWindow, "how far back the scrapes behind the findings reach", positive)
	floatFlag(f, &o.nearLimit, "near-limit", leaks.DefaultNearLimit, "fraction of max_qp at which a device is near its limit", fraction(true))
	return cmd
}

// healthPath is the exporter's health endpoint.
const healthPath = "/healthz"

// check refuses what the flags' own checks cannot see alone: a telemetry
// path that is not below / or is the health endpoint's, a web config file
// exporter-toolkit rejects.
func (o *exporterOptions) check() error {
	if !strings.HasPrefix(o.telemetryPath, "/") || o.telemetryPath == "/" || o.telemetryPath == healthPath {
		return fmt.Errorf("--web.telemetry-path %q: want a path below / other than %s (/ is the landing page)", o.telemetryPath, healthPath)
	}
	if o.webConfig != "" {
		if err := web.Validate(o.webConfig); err != nil {
			return fmt.Errorf("--web.config.file %s: %w", o.webConfig, err)
		}
	}
	return nil
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

func closeAll(lns []net.Listener) {
	for _, ln := range lns {
		ln.Close()
	}
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

// serveExporter serves the landing page and the metrics on lns until ctx
// is done, closing them.
func serveExporter(ctx context.Context, lns []net.Listener, stderr io.Writer, opts *globalOptions, o *exporterOptions) error {
	fail := func(err error) error {
		closeAll(lns)
		return withExitCode(exitError, err)
	}
	landing, err := web.NewLandingPage(web.LandingConfig{
		Name:        "qpdrain exporter",
		Description: "The host's RDMA QPs, by device, state and workload, and the leaks among them",
		Links:       []web.LandingLinks{{Address: o.telemetryPath, Text: "Metrics"}, {Address: healthPath, Text: "Health"}},
		Profiling:   "false",
	})
	if err != nil {
		return fail(fmt.Errorf("the landing page: %w", err))
	}
	h, err := openHost(o.host, stderr)
	if err != nil {
		closeAll(lns)
		return hostError(err)
	}
	defer h.Close()
	cache := &limitCache{h: h, m: map[string]leaks.Limit{}}
	exp := metrics.NewExporter(cache.sampler(o.host.timeout), metrics.ExporterOptions{
		Window: o.window, ScrapeTimeout: o.host.timeout, Log: opts.libLog(),
		Analyze: leaks.Options{NearLimit: o.nearLimit, IPoIBNonSRQLimit: ipoibNonSRQLimit()},
		Limits:  cache.limits,
	})
	reg := prometheus.NewRegistry()
	if err := reg.Register(exp); err != nil {
		return fail(fmt.Errorf("registering the exporter: %w", err))
	}
	mux := http.NewServeMux()
	mux.Handle(o.telemetryPath, promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: opts.log}))
	mux.HandleFunc(healthPath, serveHealth)
	mux.Handle("/", landing)
	// The toolkit logs the startup lines (the address, TLS on or off) at
	// info, whatever --log-level: an operator needs them.
	log := toolkitLogger(stderr, opts.logFormat)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	flags := &web.FlagConfig{WebListenAddresses: &o.listen, WebSystemdSocket: new(bool), WebConfigFile: &o.webConfig}
	done := make(chan error, 1)
	go func() { done <- web.ServeMultiple(lns, srv, flags, log) }()
	select {
	case err := <-done:
		closeAll(lns)
		return withExitCode(exitError, fmt.Errorf("serving %s: %w", o.telemetryPath, err))
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return withExitCode(exitError, fmt.Errorf("stopping the exporter: %w", err))
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return withExitCode(exitError, fmt.Errorf("serving %s: %w", o.telemetryPath, err))
	}
	return nil
}

// serveHealth answers a probe: the exporter serves HTTP. It reads nothing
// of the host, so that a kubelet probing every few seconds costs no
// netlink dump; a host the exporter cannot read shows in
// qpdrain_scrape_success instead, where an alert can name it (a probe
// failing there would only restart a pod that cannot do better).
func serveHealth(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, "ok\n")
}

// toolkitLogger is the log of exporter-toolkit's web package, in
// --log-format.
func toolkitLogger(w io.Writer, format string) *slog.Logger {
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, nil))
	}
	return slog.New(slog.NewTextHandler(w, nil))
}

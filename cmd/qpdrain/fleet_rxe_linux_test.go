package main

import (
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// The fleet test's inputs: Prometheus's server and the rules to load. The
// rxe stage runs TestFleetPrometheusRxe with them through qpdrain vm run
// (scripts/rxe/fleet.sh), Debian's prometheus copied into the guest;
// without -qpdrain.prometheus it is skipped, as in the stage's go-test run,
// whose guest has no Prometheus.
var (
	prometheusBin = flag.String("qpdrain.prometheus", "", "Prometheus server binary for TestFleetPrometheusRxe (empty: skip it)")
	fleetRules    = flag.String("qpdrain.rules", "../../deploy/qpdrain-rules.yaml", "alert rules for TestFleetPrometheusRxe")
)

// fleetFor is the `for:` every rule gets in the fleet test in place of its
// minutes: the rules' expressions are the shipped ones, their dwell what a
// test can wait for.
const fleetFor = "5s"

// freePort is a TCP port on 127.0.0.1 nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// alertStates are Prometheus's /api/v1/alerts by alert name: "pending" or
// "firing", absent when inactive.
func alertStates(t *testing.T, base string) map[string]string {
	t.Helper()
	var doc struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	if err := json.Unmarshal(httpGet(t, base+"/api/v1/alerts"), &doc); err != nil {
		t.Fatalf("/api/v1/alerts: %v", err)
	}
	out := map[string]string{}
	for _, a := range doc.Data.Alerts {
		if out[a.Labels["alertname"]] != "firing" {
			out[a.Labels["alertname"]] = a.State
		}
	}
	return out
}

// fleetEvent is when an alert was first seen in a state ("" resolved).
type fleetEvent struct {
	alert, state string
	at           time.Time
}

// TestFleetPrometheusRxe is the path from a leaked QP to an alert, whole:
// a process leaves QPs in ERR; the real qpdrain exporter (this binary as
// the CLI, its own process) serves the host over TLS with basic auth; a
// real Prometheus scrapes it with the shipped rules (their `for:` made
// fleetFor); the stuck-in-error alert goes pending, then firing, and
// resolves after qpdrain reap; the exporter stopped, the exporter-down
// alert goes pending, then firing. Everything is read from Prometheus's
// HTTP API, and the series over the run are printed (@@FLEET lines) for
// make demo-fleet's plot.
func TestFleetPrometheusRxe(t *testing.T) {
	needRxe(t)
	if *prometheusBin == "" {
		t.Skip("no -qpdrain.prometheus: the rxe stage runs this test with Debian's prometheus (scripts/rxe/fleet.sh)")
	}
	dir := t.TempDir()
	rules, err := os.ReadFile(*fleetRules)
	if err != nil {
		t.Fatal(err)
	}
	rules = regexp.MustCompile(`(?m)^(\s+for:) \S+$`).ReplaceAll(rules, []byte("${1} "+fleetFor))
	writeFile(t, filepath.Join(dir, "rules.yaml"), string(rules))

	certFile, keyFile, _ := selfSigned(t, dir)
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "web.yml"), "tls_server_config:\n  cert_file: "+certFile+"\n  key_file: "+keyFile+
		"\nbasic_auth_users:\n  prometheus: "+string(hash)+"\n")
	expAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	// The target carries the label the DaemonSet's pods have, which the
	// exporter-down rule selects (deploy/qpdrain-rules.yaml).
	writeFile(t, filepath.Join(dir, "prometheus.yml"), `global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [rules.yaml]
scrape_configs:
  - job_name: qpdrain
    scheme: https
    tls_config: {ca_file: `+certFile+`}
    basic_auth: {username: prometheus, password: s3cret}
    static_configs:
      - targets: ['`+expAddr+`']
        labels: {app_kubernetes_io_name: qpdrain-exporter}
`)

	stuck := startHelper(t, "stuck")
	stuckPID := stuck.pid(t, "pid")

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	exporter := exec.Command(self, "exporter", "--web.listen-address", expAddr, "--web.config.file", filepath.Join(dir, "web.yml"), "--window", "1m")
	exporter.Env = append(os.Environ(), envHelper+"=cli")
	exporter.Stdout, exporter.Stderr = os.Stderr, os.Stderr
	if err := exporter.Start(); err != nil {
		t.Fatal(err)
	}
	exporterDone := make(chan error, 1)
	go func() { exporterDone <- exporter.Wait() }()
	stopExporter := func() {
		if exporter.ProcessState != nil {
			return
		}
		_ = exporter.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exporterDone:
			if err != nil {
				t.Errorf("qpdrain exporter after SIGTERM: %v, want exit 0", err)
			}
		case <-time.After(30 * time.Second):
			_ = exporter.Process.Kill()
			t.Errorf("qpdrain exporter still running 30s after SIGTERM")
			<-exporterDone
		}
	}
	t.Cleanup(stopExporter)

	promAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	promLog, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer promLog.Close()
	prom := exec.Command(*prometheusBin, "--config.file", filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path", filepath.Join(dir, "data"), "--web.listen-address", promAddr)
	prom.Dir, prom.Stdout, prom.Stderr = dir, promLog, promLog
	if err := prom.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = prom.Process.Signal(syscall.SIGTERM)
		_ = prom.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(promLog.Name())
			t.Logf("prometheus's log:\n%s", b)
		}
	})
	base := "http://" + promAddr
	start := time.Now()

	// Prometheus's own client, not Go's default, speaks to the exporter: a
	// scrape without the password must fail, with it succeed.
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer client.CloseIdleConnections()
	waitUp(t, client, "https://"+expAddr+healthPath, 0)
	resp, err := client.Get("https://" + expAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("/metrics without the password: %s, want 401", resp.Status)
	}
	waitUp(t, &http.Client{Timeout: 5 * time.Second}, base+"/-/ready", http.StatusOK)

	var events []fleetEvent
	// await polls the alerts until alert is in state ("" inactive),
	// recording each state it passes through.
	last := map[string]string{}
	await := func(alert, state string, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			cur := alertStates(t, base)
			for _, name := range []string{"RDMAQPsStuckInError", "QpdrainExporterDown", alert} {
				if cur[name] != last[name] {
					events = append(events, fleetEvent{name, cur[name], time.Now()})
					t.Logf("%6.1fs %s: %q -> %q", time.Since(start).Seconds(), name, last[name], cur[name])
					last[name] = cur[name]
				}
			}
			if cur[alert] == state {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not %q within %v (alerts %v)", alert, state, within, cur)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	// Two scrapes make the finding, then the rule's for, then an
	// evaluation: seconds, under TCG tens.
	await("RDMAQPsStuckInError", "pending", 2*time.Minute)
	await("RDMAQPsStuckInError", "firing", 2*time.Minute)
	var r reapResult
	runJSON(t, exitClean, &r, "reap", "--pid", strconv.Itoa(stuckPID), "--yes", "-j", "--wait", "60s")
	if !r.Done || r.Freed == 0 {
		t.Errorf("reap --pid %d: %+v", stuckPID, r)
	}
	reaped := time.Now()
	await("RDMAQPsStuckInError", "", 2*time.Minute)
	stopExporter()
	stopped := time.Now()
	await("QpdrainExporterDown", "pending", 2*time.Minute)
	await("QpdrainExporterDown", "firing", 2*time.Minute)
	end := time.Now()

	// Each alert passed through pending to firing, in order.
	var seq []string
	for _, e := range events {
		seq = append(seq, e.alert+":"+e.state)
	}
	want := []string{"RDMAQPsStuckInError:pending", "RDMAQPsStuckInError:firing", "RDMAQPsStuckInError:", "QpdrainExporterDown:pending", "QpdrainExporterDown:firing"}
	if fmt.Sprint(seq) != fmt.Sprint(want) {
		t.Errorf("alert transitions %v, want %v", seq, want)
	}

	// The series over the run, from Prometheus, for the plot.
	fmt.Printf("@@FLEET start=%d reap=%d exporter_stopped=%d end=%d\n", start.UnixMilli(), reaped.UnixMilli(), stopped.UnixMilli(), end.UnixMilli())
	for _, e := range events {
		fmt.Printf("@@FLEET event %d %s %s\n", e.at.UnixMilli(), e.alert, e.state)
	}
	for _, q := range []string{`qpdrain_leak_qps{reason="stuck-in-error"}`, `up{job="qpdrain"}`, `sum(qpdrain_qps{state="ERR"})`} {
		for _, p := range queryRange(t, base, q, start, end) {
			fmt.Printf("@@FLEET series %s %d %s\n", q, p.at.UnixMilli(), p.v)
		}
	}
	t.Logf("stuck-in-error fired %v after Prometheus started, resolved %v after reap; exporter-down fired %v after the stop",
		eventAt(events, "RDMAQPsStuckInError", "firing").Sub(start).Round(time.Second),
		eventAt(events, "RDMAQPsStuckInError", "").Sub(reaped).Round(time.Second),
		eventAt(events, "QpdrainExporterDown", "firing").Sub(stopped).Round(time.Second))
}

func eventAt(events []fleetEvent, alert, state string) time.Time {
	for _, e := range events {
		if e.alert == alert && e.state == state {
			return e.at
		}
	}
	return time.Time{}
}

// waitUp waits, bounded, until url answers want (0: any status).
func waitUp(t *testing.T, c *http.Client, url string, want int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := c.Get(url)
		if err == nil {
			resp.Body.Close()
			if want == 0 || resp.StatusCode == want {
				return
			}
			err = fmt.Errorf("%s", resp.Status)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v after a minute", url, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// point is one sample of a range query.
type point struct {
	at time.Time
	v  string
}

// queryRange is Prometheus's /api/v1/query_range of q, a quarter of a
// second a step (a point is the last scrape before it: steps of the scrape
// interval would draw a change up to a second late), the values of its
// first series.
func queryRange(t *testing.T, base, q string, from, to time.Time) []point {
	t.Helper()
	u := fmt.Sprintf("%s/api/v1/query_range?query=%s&start=%d&end=%d&step=0.25", base, url.QueryEscape(q), from.Unix(), to.Unix()+1)
	var doc struct {
		Data struct {
			Result []struct {
				Values [][2]any `json:"values"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(httpGet(t, u), &doc); err != nil {
		t.Fatalf("query_range %s: %v", q, err)
	}
	var out []point
	for _, r := range doc.Data.Result[:min(1, len(doc.Data.Result))] {
		for _, v := range r.Values {
			sec, _ := v[0].(float64)
			out = append(out, point{time.UnixMilli(int64(sec * 1000)), fmt.Sprint(v[1])})
		}
	}
	return out
}

package metrics

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/qpdrain/qpdrain/internal/testing/promcheck"
	"github.com/qpdrain/qpdrain/internal/testing/testmain"
	"github.com/qpdrain/qpdrain/leaks"
)

func TestMain(m *testing.M) { testmain.Run(m) }

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

// host is rxe0 with the GSI QP, two RTS QPs and one QP stuck in ERR.
func host(at time.Time) leaks.Sample {
	owner := leaks.Process{PID: 42, Comm: "app"}
	return leaks.Sample{At: at, Devices: []leaks.Device{{Name: "rxe0", QPs: []leaks.QP{
		{Port: 1, LQPN: 1, Type: "GSI", State: "RTS", KernName: "ib_core"},
		{Port: 1, LQPN: 17, Type: "RC", State: "RTS", Owner: owner},
		{Port: 1, LQPN: 18, Type: "RC", State: "RTS", Owner: owner},
		{Port: 1, LQPN: 19, Type: "RC", State: "ERR", Owner: owner},
		{LQPN: 20, Type: "RC", State: "RESET", Owner: owner},
	}}}}
}

func TestTextfile(t *testing.T) {
	samples := []leaks.Sample{host(t0), host(t0.Add(time.Second)), host(t0.Add(2 * time.Second))}
	opts := leaks.Options{Limits: map[string]leaks.Limit{"rxe0": {MaxQP: 1000}}}
	r := leaks.Analyze(samples, opts)
	path := filepath.Join(t.TempDir(), "qpdrain.prom")
	if err := WriteTextfile(path, &r, samples); err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`qpdrain_qps{device="rxe0",port="1",state="RTS",type="RC"} 2`,
		`qpdrain_qps{device="rxe0",port="0",state="RESET",type="RC"} 1`,
		`qpdrain_qps{device="rxe0",port="1",state="RTS",type="GSI"} 1`,
		`qpdrain_leak_findings{device="rxe0",reason="stuck-in-error"} 1`,
		`qpdrain_leak_qps{device="rxe0",reason="stuck-in-error"} 1`,
		`qpdrain_leak_findings{device="rxe0",reason="orphaned"} 0`,
		`qpdrain_device_max_qp{device="rxe0"} 1000`,
		`qpdrain_leak_window_seconds 2`,
		`qpdrain_leaks_last_run_timestamp_seconds 1.796119202e+09`,
	} {
		if !strings.Contains(string(text), want+"\n") {
			t.Errorf("textfile lacks %s:\n%s", want, text)
		}
	}
	if strings.Contains(string(text), "pid") || strings.Contains(string(text), "lqpn") {
		t.Errorf("textfile has a pid or lqpn label:\n%s", text)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("textfile directory holds %d files, want only the .prom file", len(entries))
	}
	if _, err := Registry(&r, nil); err == nil {
		t.Error("Registry without samples accepted")
	}
	if err := WriteTextfile(filepath.Join(t.TempDir(), "no", "such", "dir.prom"), &r, samples); err == nil {
		t.Error("WriteTextfile into a missing directory succeeded")
	}
	promcheck.Check(t, text) // last: it skips where promtool is missing outside CI
}

// stepSampler returns host() at a virtual time that advances a second per
// call, failing the calls listed in fail.
type stepSampler struct {
	calls int
	fail  map[int]bool
}

func (s *stepSampler) Sample(ctx context.Context) (leaks.Sample, error) {
	s.calls++
	if s.fail[s.calls] {
		return leaks.Sample{}, errors.New("netlink: boom")
	}
	return host(t0.Add(time.Duration(s.calls) * time.Second)), ctx.Err()
}

func TestExporter(t *testing.T) {
	s := &stepSampler{fail: map[int]bool{2: true}}
	e := NewExporter(s, ExporterOptions{Window: 3 * time.Second})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(e)
	var last string
	for i := range 6 {
		last = scrape(t, reg)
		if i == 1 {
			if !strings.Contains(last, "qpdrain_scrape_success 0") || strings.Contains(last, "qpdrain_qps{") {
				t.Errorf("failed scrape:\n%s", last)
			}
		}
	}
	for _, want := range []string{
		"qpdrain_scrape_success 1", "qpdrain_scrape_errors_total 1",
		// samples at 3, 4, 5 and 6 s: the window reaches 3 s back
		`qpdrain_leak_samples 4`, `qpdrain_leak_window_seconds 3`,
		`qpdrain_leak_findings{device="rxe0",reason="stuck-in-error"} 1`,
		`qpdrain_qps{device="rxe0",port="1",state="ERR",type="RC"} 1`,
	} {
		if !strings.Contains(last, want+"\n") {
			t.Errorf("scrape lacks %s:\n%s", want, last)
		}
	}
	if s.calls != 6 {
		t.Errorf("six scrapes read the host %d times", s.calls)
	}
	promcheck.Check(t, []byte(last))
}

// scrape gathers reg (pedantically: the registry checks every metric
// against its descriptors) and formats it as a scrape would.
func scrape(t *testing.T, reg prometheus.Gatherer) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}

// TestAlertRules checks deploy/'s alert rules with promtool, and that every
// qpdrain metric they name is one this package writes.
func TestAlertRules(t *testing.T) {
	const rules = "../deploy/qpdrain-rules.yaml"
	text, err := os.ReadFile(rules)
	if err != nil {
		t.Fatal(err)
	}
	samples := []leaks.Sample{host(t0), host(t0.Add(time.Second))}
	r := leaks.Analyze(samples, leaks.Options{})
	reg, err := Registry(&r, samples)
	if err != nil {
		t.Fatal(err)
	}
	exp := prometheus.NewPedanticRegistry()
	exp.MustRegister(NewExporter(&stepSampler{}, ExporterOptions{}))
	pods := []leaks.Sample{podHost(t0), podHost(t0.Add(time.Second))}
	pr := leaks.Analyze(pods, leaks.Options{})
	preg, err := Registry(&pr, pods)
	if err != nil {
		t.Fatal(err)
	}
	written := scrape(t, reg) + scrape(t, exp) + scrape(t, preg)
	for _, name := range regexp.MustCompile(`qpdrain_[a-z_]+`).FindAllString(string(text), -1) {
		if !strings.Contains(written, "# TYPE "+name+" ") {
			t.Errorf("%s names %s, which qpdrain does not write", rules, name)
		}
	}
	const tests = "../deploy/qpdrain-rules.test.yaml"
	unit, err := os.ReadFile(tests)
	if err != nil {
		t.Fatal(err)
	}
	alerts := regexp.MustCompile(`(?m)^\s*- alert: (\S+)$`).FindAllStringSubmatch(string(text), -1)
	if len(alerts) == 0 {
		t.Fatalf("%s has no alerts", rules)
	}
	for _, a := range alerts {
		if !strings.Contains(string(unit), "alertname: "+a[1]+"\n") {
			t.Errorf("alert %s has no unit test in %s", a[1], tests)
		}
	}
	promcheck.CheckRules(t, rules)
	promcheck.TestRules(t, tests)
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/qpdrain/qpdrain/internal/testing/promcheck"
	"github.com/qpdrain/qpdrain/internal/testing/testproc"
	"github.com/qpdrain/qpdrain/leaks"
	"github.com/qpdrain/qpdrain/reap"
)

// fakeHost is a host whose QPs a test scripts: qps(n) gives the QPs of the
// n-th sample (from 0); a signal to victim ends it: the QPs it alone
// holds go, and it leaves the holders of the others.
type fakeHost struct {
	mu       sync.Mutex
	n        int
	qps      func(n int) []leaks.QP
	noRDMA   bool
	victim   int
	signals  []syscall.Signal
	killed   bool
	deleted  bool
	notRxe   bool
	closed   bool
	maxQP    int
	unkilled bool // the victim ignores signals
}

func (f *fakeHost) Sample(ctx context.Context) (leaks.Sample, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.noRDMA || f.deleted {
		return leaks.Sample{}, leaks.ErrNoRDMA
	}
	qps := f.qps(f.n)
	f.n++
	if f.killed {
		var keep []leaks.QP
		for _, q := range qps {
			isVictim := func(p leaks.Process) bool { return p.PID == f.victim }
			if len(q.Holders) == 1 && isVictim(q.Holders[0]) {
				continue
			}
			q.Holders = slices.DeleteFunc(slices.Clone(q.Holders), isVictim)
			keep = append(keep, q)
		}
		qps = keep
	}
	return leaks.Sample{At: time.Now(), Devices: []leaks.Device{{Name: "rxe0", QPs: qps}}}, ctx.Err()
}

func (f *fakeHost) Limits(devs []string) map[string]leaks.Limit {
	out := map[string]leaks.Limit{}
	for _, d := range devs {
		out[d] = leaks.Limit{MaxQP: f.maxQP, Unknown: "fake"}
	}
	return out
}

func (f *fakeHost) Signal(pid int, sig syscall.Signal) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.signals = append(f.signals, sig)
	f.killed = pid == f.victim && !f.unkilled
	return nil
}

func (f *fakeHost) CheckRxe(context.Context, string) error {
	if f.notRxe {
		return reap.ErrRefused
	}
	return nil
}

func (f *fakeHost) DeleteRxe(context.Context, string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted = true
	return nil
}

func (f *fakeHost) Close() error { f.closed = true; return nil }

// useHost makes the commands open f.
func useHost(t *testing.T, f *fakeHost) {
	t.Helper()
	old := openHost
	opened := false
	openHost = func(hostOptions, io.Writer) (host, error) { opened = true; return f, nil }
	t.Cleanup(func() {
		openHost = old
		if opened && !f.closed {
			t.Error("the command did not close the host")
		}
	})
}

func run(t *testing.T, args ...string) (string, int) {
	t.Helper()
	out, errOut, err := runRoot(args...)
	if err != nil {
		errOut += err.Error()
	}
	return out + errOut, exitCode(err)
}

// leakyHost has the GSI QP, healthy RTS QPs of pid 100 and two QPs of
// pid 100 in ERR.
func leakyHost(victim int) *fakeHost {
	app := leaks.Process{PID: victim, Comm: "app"}
	held := []leaks.Process{app}
	return &fakeHost{victim: victim, maxQP: 1 << 20, qps: func(int) []leaks.QP {
		return []leaks.QP{
			{Port: 1, LQPN: 1, Type: "GSI", State: "RTS", KernName: "ib_core"},
			{Port: 1, LQPN: 17, Type: "RC", State: "RTS", Owner: app, Holders: held, HoldersCertain: true},
			{Port: 1, LQPN: 18, Type: "RC", State: "ERR", Owner: app, Holders: held, HoldersCertain: true},
			{Port: 1, LQPN: 19, Type: "RC", State: "ERR", Owner: app, Holders: held, HoldersCertain: true},
		}
	}}
}

func TestLeaksText(t *testing.T) {
	useHost(t, leakyHost(100))
	out, code := run(t, "leaks", "--for", "20ms", "--interval", "10ms")
	if code != exitFindings {
		t.Fatalf("exit %d, want %d:\n%s", code, exitFindings, out)
	}
	wantAll(t, "output", out, "3 samples over", "rxe0: 4 QPs, max_qp 1048576", "stuck-in-error link rxe0 pid 100 comm app qps 2 lqpn 18,19",
		"evidence: 2 QPs (2 ERR) in each of 3 samples", "remedy: pid 100 (app) must drain", "1 findings: stuck-in-error 1")
}

func TestLeaksJSONAndTextfile(t *testing.T) {
	useHost(t, leakyHost(100))
	prom := filepath.Join(t.TempDir(), "qpdrain.prom")
	out, err := runSub("leaks", "-j", "--for", "10ms", "--interval", "10ms", "--textfile", prom)
	if code := exitCode(err); code != exitFindings {
		t.Fatalf("exit %d, want %d", code, exitFindings)
	}
	var got struct {
		Samples  int `json:"samples"`
		Findings []struct {
			Reason string `json:"reason"`
			IfName string `json:"ifname"`
			Owner  struct {
				PID int `json:"pid"`
			} `json:"owner"`
			QPs []struct {
				LQPN  uint32 `json:"lqpn"`
				State string `json:"state"`
			} `json:"qps"`
			Evidence, Remedy string
		} `json:"findings"`
		WindowNS int64 `json:"window_ns"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("-j: %v\n%s", err, out)
	}
	if got.Samples != 2 || len(got.Findings) != 1 || got.Findings[0].Reason != "stuck-in-error" || got.Findings[0].Owner.PID != 100 ||
		len(got.Findings[0].QPs) != 2 || got.Findings[0].Evidence == "" || got.Findings[0].Remedy == "" {
		t.Errorf("-j: %+v", got)
	}
	text, err := os.ReadFile(prom)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(text), `qpdrain_leak_qps{device="rxe0",reason="stuck-in-error"} 2`) {
		t.Errorf("textfile:\n%s", text)
	}
	promcheck.Check(t, text)
}

func TestLeaksExitCodes(t *testing.T) {
	clean := leakyHost(100)
	clean.qps = func(int) []leaks.QP {
		return []leaks.QP{{Port: 1, LQPN: 17, Type: "RC", State: "RTS", Owner: leaks.Process{PID: 100}}}
	}
	useHost(t, clean)
	if out, code := run(t, "leaks", "--for", "10ms", "--interval", "5ms"); code != exitClean || !strings.Contains(out, "no leaks found") {
		t.Errorf("clean host: exit %d:\n%s", code, out)
	}
	clean.noRDMA = true
	if out, code := run(t, "leaks", "--for", "0s"); code != exitUnsupported {
		t.Errorf("no RDMA: exit %d, want %d:\n%s", code, exitUnsupported, out)
	}
	wantRefused(t, []string{"leaks"}, []badInput{
		{[]string{"--near-limit", "2"}, exitError, `"2" for "--near-limit" flag`},
		{[]string{"--interval", "0s"}, exitError, `"0s" for "--interval" flag`},
		{[]string{"--for", "-1s"}, exitError, `"-1s" for "--for" flag`},
	})
}

func TestReapPlanAndAct(t *testing.T) {
	// A real process the fake host says owns QPs (the fake host's signals
	// never reach it). The test's parent will not do: in the VM it is
	// init, which reap refuses.
	pid := testproc.Idle(t)
	f := leakyHost(pid)
	useHost(t, f)
	out, code := run(t, "reap", "--pid", strconv.Itoa(pid))
	if code != exitClean || len(f.signals) != 0 || !strings.Contains(out, "plan: send SIGTERM to pid") ||
		!strings.Contains(out, "for the 3 QPs it alone holds (3 owned, 0 kept alive as a holder)") || !strings.Contains(out, "nothing done: run again with --yes") {
		t.Fatalf("plan: exit %d signals %v:\n%s", code, f.signals, out)
	}
	// --signal takes any case, with or without SIG; the plan names it as
	// signal(7) does.
	if out, code = run(t, "reap", "--pid", strconv.Itoa(pid), "--signal", "sigHup"); code != exitClean || !strings.Contains(out, "plan: send SIGHUP to pid") {
		t.Errorf("plan with --signal sigHup: exit %d:\n%s", code, out)
	}
	out, code = run(t, "reap", "--pid", strconv.Itoa(pid), "--yes", "--signal", "KILL")
	if code != exitClean || len(f.signals) != 1 || f.signals[0] != syscall.SIGKILL || !strings.Contains(out, "freed 3 of 3 QPs") || !strings.Contains(out, "0 remain") {
		t.Fatalf("reap: exit %d signals %v:\n%s", code, f.signals, out)
	}
}

func TestReapRemaining(t *testing.T) {
	pid := testproc.Idle(t)
	f := leakyHost(pid)
	f.unkilled = true
	useHost(t, f)
	out, code := run(t, "reap", "--pid", strconv.Itoa(pid), "--yes", "--wait", "300ms", "-j")
	var got reapResult
	if err := json.NewDecoder(strings.NewReader(out)).Decode(&got); err != nil {
		t.Fatalf("-j: %v\n%s", err, out)
	}
	if code != exitFindings || !got.Done || got.Freed != 0 || len(got.Remaining) != 3 || got.WaitedNS < 300*int64(time.Millisecond) {
		t.Errorf("exit %d, %+v", code, got)
	}
	// A wait over before any sample was read proves nothing left: all remain.
	out, code = run(t, "reap", "--pid", strconv.Itoa(pid), "--yes", "--wait", "1ns", "-j")
	got = reapResult{}
	if err := json.NewDecoder(strings.NewReader(out)).Decode(&got); err != nil || code != exitFindings || len(got.Remaining) != 3 {
		t.Errorf("--wait 1ns: exit %d, %+v (%v):\n%s", code, got, err, out)
	}
}

// TestReapHolders: reap waits for the QPs whose context the target alone
// holds, lists apart those it shares or may hold, and exits 0 when its own
// went.
func TestReapHolders(t *testing.T) {
	pid := testproc.Idle(t)
	app := leaks.Process{PID: pid, Comm: "app"}
	// Pids no process can have (above the kernel's largest pid_max,
	// 1<<22), never a target's: in the VM's guest the target was once pid
	// 500, which "other" had.
	child, other := leaks.Process{PID: 1<<22 + 300, Comm: "child"}, leaks.Process{PID: 1<<22 + 500, Comm: "other"}
	f := &fakeHost{victim: pid, qps: func(int) []leaks.QP {
		return []leaks.QP{
			{Port: 1, LQPN: 17, Type: "RC", State: "RTS", Owner: app, Holders: []leaks.Process{app}, HoldersCertain: true},
			// Its forked-and-exited creator's context, held by the target alone.
			{Port: 1, LQPN: 20, Type: "RC", State: "ERR", Holders: []leaks.Process{app}, HoldersCertain: true},
			{Port: 1, LQPN: 21, Type: "RC", State: "RTS", Owner: app, Holders: []leaks.Process{app, child}, HoldersCertain: true},
			{Port: 1, LQPN: 22, Type: "RC", State: "RTS", Holders: []leaks.Process{app, other}},
			{Port: 1, LQPN: 30, Type: "RC", State: "RTS", Owner: other, Holders: []leaks.Process{other}, HoldersCertain: true},
		}
	}}
	useHost(t, f)
	out, code := run(t, "reap", "--pid", strconv.Itoa(pid))
	for _, want := range []string{"for the 2 QPs it alone holds (1 owned, 1 kept alive as a holder)", "rxe0 lqpn 17 RC RTS, rxe0 lqpn 20 RC ERR",
		"not waited for: 2 QPs", fmt.Sprintf("rxe0 lqpn 21 RC RTS: also held by pid %d (child)", child.PID),
		fmt.Sprintf("rxe0 lqpn 22 RC RTS: held by one or more of pid %d (app), pid %d (other)", pid, other.PID)} {
		if code != exitClean || !strings.Contains(out, want) {
			t.Errorf("plan: exit %d, want %q:\n%s", code, want, out)
		}
	}
	out, code = run(t, "reap", "--pid", strconv.Itoa(pid), "--yes", "-j")
	var got reapResult
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("-j: %v\n%s", err, out)
	}
	if code != exitClean || got.Freed != 2 || len(got.QPs) != 2 || len(got.Remaining) != 0 || len(got.MayKeep) != 2 || got.MayKeep[1].Why == "" {
		t.Errorf("reap: exit %d %+v", code, got)
	}
	// Every result has every list, empty rather than null.
	useHost(t, f)
	out, code = run(t, "reap", "--pid", strconv.Itoa(testproc.Idle(t)), "-j")
	for _, want := range []string{`"qps": []`, `"may_keep_alive": []`, `"remaining": []`} {
		if code != exitClean || !strings.Contains(out, want) {
			t.Errorf("nothing to reap: exit %d, want %s:\n%s", code, want, out)
		}
	}
}

func TestReapRefuses(t *testing.T) {
	useHost(t, leakyHost(100))
	wantRefused(t, []string{"reap"}, []badInput{
		{[]string{"--pid", "1"}, exitError, "pid 1 is init"},
		{[]string{"--pid", strconv.Itoa(os.Getpid())}, exitError, "qpdrain itself"},
		{[]string{"--pid", "-4"}, exitError, "want a process id"},
		{[]string{"--pid", "2", "--signal", "STOP"}, exitError, `invalid argument "STOP" for "--signal" flag: want TERM, INT, HUP or KILL`},
		{nil, exitError, "give one target"},
		{[]string{"--pid", "5", "--rxe", "rxe0"}, exitError, "give one target"},
		{[]string{"--pid", "2"}, exitError, "kernel thread"}, // kthreadd
	})
}

func TestReapRxe(t *testing.T) {
	f := leakyHost(100)
	useHost(t, f)
	if out, code := run(t, "reap", "--rxe", "rxe0"); code != exitClean || f.deleted || !strings.Contains(out, "plan: delete rxe link rxe0") {
		t.Fatalf("plan: exit %d deleted %v:\n%s", code, f.deleted, out)
	}
	if out, code := run(t, "reap", "--rxe", "rxe0", "--yes"); code != exitClean || !f.deleted || !strings.Contains(out, "freed 4 of 4 QPs") {
		t.Fatalf("reap: exit %d deleted %v:\n%s", code, f.deleted, out)
	}
	k := leakyHost(100)
	k.qps = func(int) []leaks.QP {
		return []leaks.QP{{Port: 1, LQPN: 9, Type: "RC", State: "RTS", KernName: "rds_rdma"}}
	}
	useHost(t, k)
	if out, code := run(t, "reap", "--rxe", "rxe0", "--yes"); code != exitError || k.deleted || !strings.Contains(out, "kernel QPs of rds_rdma") {
		t.Errorf("kernel QPs: exit %d deleted %v:\n%s", code, k.deleted, out)
	}
}

// startExporter runs qpdrain exporter in this process on host until the
// test ends, returning its base URL.
func startExporter(t *testing.T, host hostOptions) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts := &globalOptions{}
	opts.log = newLogger(io.Discard, logrus.WarnLevel, "text")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- serveExporter(ctx, []net.Listener{ln}, io.Discard, opts, &exporterOptions{telemetryPath: "/metrics", window: time.Minute, nearLimit: 0.9, host: host})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("exporter: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

// httpGet gets url, failing the test unless the answer is 200 OK.
func httpGet(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %v %s", url, err, resp.Status)
	}
	return body
}

// scrapeExporter runs qpdrain exporter in this process on host and scrapes
// it twice, returning the second scrape.
func scrapeExporter(t *testing.T, host hostOptions) []byte {
	t.Helper()
	base := startExporter(t, host)
	httpGet(t, base+"/metrics")
	return httpGet(t, base+"/metrics")
}

func TestExporterServes(t *testing.T) {
	f := leakyHost(100)
	useHost(t, f)
	body := scrapeExporter(t, hostOptions{timeout: time.Second})
	for _, want := range []string{`qpdrain_qps{device="rxe0",port="1",state="ERR",type="RC"} 2`, `qpdrain_device_max_qp{device="rxe0"} 1.048576e+06`,
		`qpdrain_leak_findings{device="rxe0",reason="stuck-in-error"} 1`, "qpdrain_scrape_success 1", "qpdrain_leak_samples 2"} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("/metrics lacks %s:\n%s", want, body)
		}
	}
	promcheck.Check(t, body)
}

// TestExporterHealth: /healthz answers the probes without reading the
// host: a kubelet probing every few seconds costs no netlink dump.
func TestExporterHealth(t *testing.T) {
	f := leakyHost(100)
	useHost(t, f)
	base := startExporter(t, hostOptions{timeout: time.Second})
	for range 3 {
		if body := httpGet(t, base+healthPath); string(body) != "ok\n" {
			t.Errorf("%s: %q", healthPath, body)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n != 0 {
		t.Errorf("%s read the host %d times", healthPath, f.n)
	}
}

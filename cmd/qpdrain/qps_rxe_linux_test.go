package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
)

// iprouteQPKeys are the keys of `rdma resource show qp -j` (rdma/res-qp.c).
var iprouteQPKeys = []string{"ifindex", "ifname", "port", "lqpn", "rqpn", "type", "subtype", "state", "rq-psn", "sq-psn", "path-mig-state", "pdn", "pid", "comm"}

// needRxe skips a test that needs rxe0, saying why where that is not it.
// On iWARP (siw0) they cannot be planted: the helpers connect RC pairs by
// hand and create a UD QP (qpset), where an iWARP QP reaches RTS only
// through iw_cm (siw_qp_nextstate_from_idle) and siw creates RC QPs only
// (siw_create_qp: EOPNOTSUPP); the scale tests' helpers hold 25,000 QPs
// each, past the 144 pages of queue mappings libsiw leaves a device
// context (drain's TestConcurrentDrains says why); and qpdrain rxe adds
// rxe links.
func needRxe(t *testing.T) {
	t.Helper()
	switch {
	case devtest.CurrentProvider() == devtest.ProviderRXE:
	case devtest.IWARP() && devtest.CurrentProvider() != devtest.ProviderSoft:
		t.Skipf("%s is iWARP: these tests plant rxe0's QPs with helpers that connect RC pairs by hand and create a UD QP, or hold 25,000 QPs a process; siw reaches RTS only through iw_cm (siw_qp_nextstate_from_idle), creates RC QPs only (siw_create_qp) and maps 144 pages of queues a context (libsiw's SIW_INVAL_UOBJ_KEY)", devtest.DeviceName())
	default:
		t.Skip("needs the kernel's rxe: runs in the VM (make test-rxe)")
	}
}

// helperProc is a running helper process.
type helperProc struct {
	cmd    *exec.Cmd
	stdin  *os.File
	ready  map[string]string
	waited bool
}

// stop closes the helper's stdin, which ends it (and a keeper it started),
// and waits for it.
func (h *helperProc) stop() error {
	_ = h.stdin.Close()
	if h.waited {
		return nil
	}
	h.waited = true
	return h.cmd.Wait()
}

// startHelper starts this test binary as a helper and waits for its READY
// line. The helper (and a keeper it starts) exits when the test ends.
func startHelper(t *testing.T, mode string, env ...string) *helperProc {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(append(os.Environ(), envHelper+"="+mode), env...)
	// Files, not buffers or exec's pipes: a keeper inherits them and
	// outlives the helper, and exec closes its own pipes in Wait.
	cmd.Stderr = os.Stderr
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin = stdinR
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stdinR.Close()
	h := &helperProc{cmd: cmd, stdin: stdinW}
	t.Cleanup(func() {
		if err := h.stop(); err != nil {
			t.Errorf("helper %s: %v", mode, err)
		}
		if k, ok := h.ready["keeper"]; ok {
			if err := waitGone("/proc/" + k); err != nil {
				t.Errorf("keeper: %v", err)
			}
		}
	})
	type res struct {
		m   map[string]string
		err error
	}
	ch := make(chan res, 1)
	go func() {
		m, err := readyLine(bufio.NewReader(stdout))
		ch <- res{m, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("helper %s: %v", mode, r.err)
		}
		h.ready = r.m
	case <-time.After(5 * time.Minute):
		// (25,000 QPs under TCG on a busy host take minutes; a helper
		// that fails says so and exits at once.)
		_ = cmd.Process.Kill()
		t.Fatalf("helper %s: no READY line within 5m", mode)
	}
	// A helper of thousands of QPs lists them all; the log keeps the start.
	logged := make(map[string]string, len(h.ready))
	for k, v := range h.ready {
		if len(v) > 120 {
			v = v[:120] + fmt.Sprintf("... (%d bytes)", len(v))
		}
		logged[k] = v
	}
	t.Logf("helper %s: %v", mode, logged)
	if mode == "fork" {
		// The creator exits at once; its QPs live on in the keeper.
		h.waited = true
		if err := cmd.Wait(); err != nil {
			t.Fatalf("helper fork: %v", err)
		}
	}
	return h
}

func (h *helperProc) pid(t *testing.T, key string) int {
	t.Helper()
	n, err := strconv.Atoi(h.ready[key])
	if err != nil {
		t.Fatalf("helper READY %v: no %s", h.ready, key)
	}
	return n
}

func (h *helperProc) qpns() []string { return strings.Split(h.ready["qpns"], ",") }

// runJSON runs the CLI, which must exit want, decodes its -j document into
// v and returns the document.
func runJSON(t *testing.T, want int, v any, args ...string) string {
	t.Helper()
	out, err := runQpdrain(t, args...)
	if code := exitCode(err); code != want {
		t.Fatalf("qpdrain %s: exit %d, want %d:\n%s", strings.Join(args, " "), code, want, out)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("qpdrain %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func runRdma(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("rdma", args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("rdma %s: %v: %s", strings.Join(args, " "), err, ee.Stderr)
		}
		t.Fatalf("rdma %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}

// qpObjects parses a -j array into objects keyed by "ifname/lqpn".
func qpObjects(t *testing.T, who, out string) map[string]map[string]any {
	t.Helper()
	var list []map[string]any
	d := json.NewDecoder(strings.NewReader(out))
	d.UseNumber()
	if err := d.Decode(&list); err != nil {
		t.Fatalf("%s -j: %v:\n%s", who, err, out)
	}
	m := map[string]map[string]any{}
	for _, o := range list {
		m[fmt.Sprintf("%v/%v", o["ifname"], o["lqpn"])] = o
	}
	return m
}

// keyOrders reads a -j array's objects' keys in order, by "ifname/lqpn".
func keyOrders(t *testing.T, out string) map[string][]string {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(out))
	m := map[string][]string{}
	fail := func(err error) { t.Fatalf("-j: %v:\n%s", err, out) }
	if _, err := d.Token(); err != nil { // [
		fail(err)
	}
	for d.More() {
		if _, err := d.Token(); err != nil { // {
			fail(err)
		}
		var keys []string
		var name, lqpn string
		for d.More() {
			k, err := d.Token()
			if err != nil {
				fail(err)
			}
			var v json.RawMessage
			if err := d.Decode(&v); err != nil {
				fail(err)
			}
			keys = append(keys, fmt.Sprint(k))
			switch k {
			case "ifname":
				name = strings.Trim(string(v), `"`)
			case "lqpn":
				lqpn = string(v)
			}
		}
		if _, err := d.Token(); err != nil { // }
			fail(err)
		}
		m[name+"/"+lqpn] = keys
	}
	return m
}

// TestQPsMatchRdma compares `qpdrain qps -j` with `rdma resource show qp
// -j`, QP by QP and key by key, with helpers holding QPs in several states
// and types, a helper whose creating thread exited, and a creator that
// exited leaving its context to a child; then checks qpdrain's owners and
// holders against the helpers' pids.
func TestQPsMatchRdma(t *testing.T) {
	needRxe(t)
	hold := startHelper(t, "hold")
	thread := startHelper(t, "thread")
	fork := startHelper(t, "fork")

	var ours, theirs map[string]map[string]any
	var ours0 string
	for try := 0; ; try++ {
		before := runRdma(t, "-j", "resource", "show", "qp")
		out, err := runQpdrain(t, "qps", "-j")
		if err != nil {
			t.Fatal(err)
		}
		after := runRdma(t, "-j", "resource", "show", "qp")
		theirs, ours, ours0 = qpObjects(t, "rdma", before), qpObjects(t, "qpdrain", out), out
		if reflect.DeepEqual(theirs, qpObjects(t, "rdma", after)) || try == 2 {
			break
		}
	}
	keys := func(m map[string]map[string]any) []string {
		var out []string
		for k := range m {
			out = append(out, k)
		}
		sort.Strings(out)
		return out
	}
	if !reflect.DeepEqual(keys(ours), keys(theirs)) {
		t.Fatalf("QPs differ:\n qpdrain %v\n rdma    %v", keys(ours), keys(theirs))
	}
	for id, want := range theirs {
		got := ours[id]
		for _, k := range iprouteQPKeys {
			wv, wok := want[k]
			gv, gok := got[k]
			if wok != gok || fmt.Sprint(wv) != fmt.Sprint(gv) {
				t.Errorf("QP %s key %q: qpdrain %v (present %v), rdma %v (present %v)", id, k, gv, gok, wv, wok)
			}
		}
		for k := range want {
			if !slices.Contains(iprouteQPKeys, k) {
				t.Errorf("QP %s: rdma prints key %q that qpdrain does not know", id, k)
			}
		}
	}
	t.Logf("%d QPs match rdma key by key", len(theirs))
	// iproute2's key order (print_link: ifindex, ifname, port), for the
	// keys both print.
	theirOrder, ourOrder := keyOrders(t, runRdma(t, "-j", "resource", "show", "qp")), keyOrders(t, ours0)
	for id, want := range theirOrder {
		got := slices.DeleteFunc(slices.Clone(ourOrder[id]), func(k string) bool { return !slices.Contains(want, k) })
		if got != nil && !slices.Equal(got, want) {
			t.Errorf("QP %s keys: qpdrain %v, rdma %v", id, got, want)
		}
	}

	dev := devtest.DeviceName()
	owner := func(id string) (map[string]any, bool, []any) {
		o := ours[dev+"/"+id]
		if o == nil {
			t.Fatalf("QP %s not listed", id)
		}
		own, _ := o["owner"].(map[string]any)
		gone, _ := o["creator_gone"].(bool)
		hs, _ := o["holders"].([]any)
		return own, gone, hs
	}
	holds := func(hs []any, pid int) bool {
		for _, h := range hs {
			if m, ok := h.(map[string]any); ok && fmt.Sprint(m["pid"]) == strconv.Itoa(pid) {
				return true
			}
		}
		return false
	}
	withCtx := hasCtxTable(t)
	for _, n := range hold.qpns() {
		own, gone, hs := owner(n)
		if own == nil || fmt.Sprint(own["pid"]) != strconv.Itoa(hold.pid(t, "pid")) || own["via"] != "qp" || gone {
			t.Errorf("hold helper's QP %s: owner %v creator_gone %v, want pid %d via qp", n, own, gone, hold.pid(t, "pid"))
		}
		// Before 5.11 no context is tied to its file: the holders of the
		// device are the candidates.
		if !holds(hs, hold.pid(t, "pid")) || len(hs) != 1 && (withCtx || ours[dev+"/"+n]["holders_certain"] != false) {
			t.Errorf("hold helper's QP %s: holders %v, want the helper %d alone (before 5.11 among the candidates)", n, hs, hold.pid(t, "pid"))
		}
	}
	for _, n := range thread.qpns() {
		own, gone, _ := owner(n)
		if !withCtx {
			// 5.10's row keeps the exited thread's process.
			if own == nil || fmt.Sprint(own["pid"]) != strconv.Itoa(thread.pid(t, "pid")) || gone {
				t.Errorf("exited thread's QP %s: owner %v creator_gone %v, want pid %d", n, own, gone, thread.pid(t, "pid"))
			}
			continue
		}
		if _, ok := ours[dev+"/"+n]["pid"]; ok {
			t.Errorf("QP %s of an exited thread has a pid: %v", n, ours[dev+"/"+n])
		}
		if own == nil || fmt.Sprint(own["pid"]) != strconv.Itoa(thread.pid(t, "pid")) || own["via"] == "qp" || gone {
			t.Errorf("exited thread's QP %s: owner %v creator_gone %v, want pid %d via pd or ctx", n, own, gone, thread.pid(t, "pid"))
		}
	}
	keeper := fork.pid(t, "keeper")
	for _, n := range fork.qpns() {
		own, gone, hs := owner(n)
		if !withCtx {
			// Without the context table the creator may be alive: the
			// owner is unknown, and the keeper among the candidates.
			line, err := runQpdrain(t, "qps", "-d", "link", dev, "lqpn", n)
			if err != nil {
				t.Fatal(err)
			}
			if own != nil || gone || ours[dev+"/"+n]["owner_uncertain"] != true || !holds(hs, keeper) || !strings.Contains(line, "owner unknown") {
				t.Errorf("exited creator's QP %s: owner %v creator_gone %v owner_uncertain %v holders %v, qps -d %q; want the owner unknown, keeper %d a candidate",
					n, own, gone, ours[dev+"/"+n]["owner_uncertain"], hs, line, keeper)
			}
			continue
		}
		if own != nil || !gone || !holds(hs, keeper) || len(hs) != 1 || ours[dev+"/"+n]["holders_certain"] != true {
			t.Errorf("exited creator's QP %s: owner %v creator_gone %v holders %v certain %v, want no owner, creator_gone, keeper %d alone, certain",
				n, own, gone, hs, ours[dev+"/"+n]["holders_certain"], keeper)
		}
		line, err := runQpdrain(t, "qps", "-d", "link", dev, "lqpn", n)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(line, "creator gone") || !strings.Contains(line, fmt.Sprintf("holders %d/", keeper)) && !strings.Contains(line, fmt.Sprintf(",%d/", keeper)) {
			t.Errorf("qps -d for QP %s: %q, want creator gone and holder %d", n, line, keeper)
		}
	}
	// Text: the same words as rdma's, line for line, through the filters.
	for _, n := range append(hold.qpns(), "1") {
		want := strings.TrimRight(runRdma(t, "resource", "show", "qp", "link", dev, "lqpn", n), " \n")
		got, err := runQpdrain(t, "qps", "link", dev, "lqpn", n)
		if err != nil {
			t.Fatal(err)
		}
		if got = strings.TrimRight(got, "\n"); got != want {
			t.Errorf("qps link %s lqpn %s:\n qpdrain %q\n rdma    %q", dev, n, got, want)
		}
	}
	for _, f := range [][]string{{"state", "RTS,ERR"}, {"type", "UD"}, {"link", dev + "/-"}, {"lqpn", "1-5"}} {
		want := qpObjects(t, "rdma", runRdma(t, append([]string{"-j", "resource", "show", "qp"}, f...)...))
		out, err := runQpdrain(t, append([]string{"qps", "-j"}, f...)...)
		if err != nil {
			t.Fatal(err)
		}
		if got := qpObjects(t, "qpdrain", out); !reflect.DeepEqual(keys(got), keys(want)) {
			t.Errorf("filter %v: qpdrain %v, rdma %v", f, keys(got), keys(want))
		}
	}
	sum, err := runQpdrain(t, "qps", "--summary")
	if err != nil || !strings.Contains(sum, dev+": max_qp ") {
		t.Errorf("qps --summary: %q, want %s with max_qp", sum, dev)
	}
}

// TestRxeAddDel creates and removes a second rxe link with qpdrain rxe,
// and checks that a delete waits for, and names, a process holding it.
func TestRxeAddDel(t *testing.T) {
	needRxe(t)
	ip := func(args ...string) {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	ip("link", "add", "dummy1", "type", "dummy")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", "dummy1").Run() })
	ip("link", "set", "dummy1", "up")
	if _, err := runQpdrain(t, "rxe", "add", "rxe1", "dummy1"); err != nil {
		t.Fatal(err)
	}
	list, err := runQpdrain(t, "rxe", "list")
	if err != nil || !strings.Contains(list, "link rxe1/1 ") || !strings.Contains(list, "netdev dummy1") || !strings.Contains(list, "link "+devtest.DeviceName()+"/1 ") {
		t.Fatalf("rxe list after add: %q (%v), want rxe1 on dummy1 and %s", list, err, devtest.DeviceName())
	}
	h := startHelper(t, "many", "QPDRAIN_TEST_DEVICE=rxe1", "QPDRAIN_QPS_N=1")
	_, err = runQpdrain(t, "rxe", "del", "rxe1", "--timeout", "1s")
	var ec *exitCodeError
	if !errors.As(err, &ec) || ec.code != exitError || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", h.pid(t, "pid"))) {
		t.Fatalf("rxe del while held: %v, want exit 2 naming pid %d", err, h.pid(t, "pid"))
	}
	// reap's wait is --wait, and the message names it (not --timeout).
	_, err = runQpdrain(t, "reap", "--rxe", "rxe1", "--yes", "--wait", "2s")
	if !errors.As(err, &ec) || ec.code != exitError || !strings.Contains(err.Error(), "after 2s") {
		t.Fatalf("reap --rxe while held: %v, want exit 2 giving up after 2s", err)
	}
	if err := h.stop(); err != nil {
		t.Fatalf("helper: %v", err)
	}
	if _, err := runQpdrain(t, "rxe", "del", "rxe1"); err != nil {
		t.Fatal(err)
	}
	if list, _ := runQpdrain(t, "rxe", "list"); strings.Contains(list, "rxe1") {
		t.Fatalf("rxe list after del: %q", list)
	}
}

// runCost is what one run of a command cost.
type runCost struct {
	wall, cpu time.Duration // cpu: user plus system time
	rss       int64         // peak RSS, KiB
}

// String is "wall/cpu", as BENCH lines list runs.
func (r runCost) String() string {
	return fmt.Sprintf("%v/%v", r.wall.Round(time.Millisecond), r.cpu.Round(time.Millisecond))
}

// medianCosts are the medians of the runs' wall and CPU times.
func medianCosts(rs []runCost) (wall, cpu time.Duration) {
	var ws, cs []time.Duration
	for _, r := range rs {
		ws, cs = append(ws, r.wall), append(cs, r.cpu)
	}
	slices.Sort(ws)
	slices.Sort(cs)
	return ws[len(ws)/2], cs[len(cs)/2]
}

// timedRun runs name with args as a process of its own (the test binary
// as qpdrain when name is self), failing t unless it exits 0 or with ok,
// and returns its wall and CPU time and peak RSS.
func timedRun(t *testing.T, self string, ok int, name string, args ...string) runCost {
	t.Helper()
	cmd := exec.Command(name, args...)
	if name == self {
		cmd.Env = append(os.Environ(), envHelper+"=cli")
	}
	cmd.Stdout = io.Discard
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	err := cmd.Run()
	if ee, isExit := err.(*exec.ExitError); err != nil && (!isExit || ee.ExitCode() != ok) {
		t.Fatalf("%s %v: %v: %s", name, args, err, stderr.String())
	}
	wall, ps := time.Since(start), cmd.ProcessState
	return runCost{wall: wall, cpu: ps.UserTime() + ps.SystemTime(), rss: ps.SysUsage().(*syscall.Rusage).Maxrss}
}

// scaleQPs adds a point to the scale tests (TestQPsScale, TestLeaksScale)
// beside the 10,000 QPs of every rxe stage: it takes minutes under TCG and
// more guest memory than the default (RXE_MEM, docs/VM.md), so it is asked
// for: qpdrain vm go-test ./cmd/qpdrain -- -qpdrain.scale-qps=100000. (A
// flag, not an environment variable: the guest's tests get RXE_TEST_ARGS,
// not the host's environment.)
var scaleQPs = flag.Int("qpdrain.scale-qps", 0, "a further QP count for TestQPsScale and TestLeaksScale beside 10,000 (0: none)")

// scalePoints are the QP counts the scale tests measure, each in a subtest.
func scalePoints() []int {
	if *scaleQPs > 0 {
		return []int{10000, *scaleQPs}
	}
	return []int{10000}
}

// qpsPerHelper is the most QPs one helper creates: every QP maps its queues,
// and a process tops out near 32k QPs under the default vm.max_map_count
// (65530 mappings).
const qpsPerHelper = 25000

// startMany starts helpers holding n RC QPs in all, after checking that the
// device can hold them (its max_qp); the helpers exit when t ends.
func startMany(t *testing.T, n int) {
	t.Helper()
	ctx, err := ibv.Open(devtest.DeviceName())
	if err != nil {
		t.Fatal(err)
	}
	attr, err := ctx.QueryDevice()
	if cerr := ctx.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	if attr.MaxQP < n {
		t.Fatalf("%s's max_qp is %d: it cannot hold %d QPs", devtest.DeviceName(), attr.MaxQP, n)
	}
	start := time.Now()
	procs := 0
	for left := n; left > 0; left -= qpsPerHelper {
		startHelper(t, "many", fmt.Sprintf("QPDRAIN_QPS_N=%d", min(left, qpsPerHelper)))
		procs++
	}
	t.Logf("created %d QPs in %d processes in %v (max_qp %d)", n, procs, time.Since(start), attr.MaxQP)
}

// scaleRuns is how many timed runs of each command a point of n QPs gets,
// runs up to 10,000 QPs: every message of a dump walks the QP table from
// its start (nldev's res_get_common_dumpit), so with rdma's page-sized
// reads a 100,000-QP run takes minutes under TCG, and one run each is what
// a VM's deadline holds.
func scaleRuns(n, runs int) int {
	if n > 10000 {
		return 1
	}
	return runs
}

// scaleName is a point's name in subtests and BENCH lines ("10k").
func scaleName(n int) string {
	if n%1000 == 0 {
		return fmt.Sprintf("%dk", n/1000)
	}
	return strconv.Itoa(n)
}

// TestQPsScale times `qpdrain qps -j` against `rdma resource show qp -j`
// at each scale point (10,000 QPs; -qpdrain.scale-qps adds one), each run
// as its own process, five times alternately after one untimed run of each
// (medians; once each beyond 10,000 QPs), and reports qpdrain's peak memory per QP (BENCH lines;
// docs/BENCH.md).
func TestQPsScale(t *testing.T) {
	needRxe(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	rssBase := timedRun(t, self, exitClean, self, "qps", "-j").rss
	for _, n := range scalePoints() {
		t.Run(scaleName(n), func(t *testing.T) {
			run := func(name string, args ...string) runCost {
				return timedRun(t, self, exitClean, name, args...)
			}
			startMany(t, n)
			if n <= 10000 {
				// One untimed run of each brings both binaries into the
				// page cache (for the later points too).
				run(self, "qps", "-j")
				run("rdma", "-j", "resource", "show", "qp")
			}
			var ours, theirs []runCost
			var rss int64
			for range scaleRuns(n, 5) {
				o := run(self, "qps", "-j")
				ours, rss = append(ours, o), max(rss, o.rss)
				theirs = append(theirs, run("rdma", "-j", "resource", "show", "qp"))
			}
			mo, co := medianCosts(ours)
			mt, ct := medianCosts(theirs)
			perQP := float64(rss-rssBase) * 1024 / float64(n)
			line := fmt.Sprintf("BENCH qps-%s kernel=%s qpdrain=%v rdma=%v ratio=%.2f qpdrain_cpu=%v rdma_cpu=%v cpu_ratio=%.2f qpdrain_runs=%v rdma_runs=%v maxrss_kib=%d base_kib=%d bytes_per_qp=%.0f",
				scaleName(n), kernelRelease(), mo.Round(time.Millisecond), mt.Round(time.Millisecond), float64(mo)/float64(mt),
				co.Round(time.Millisecond), ct.Round(time.Millisecond), float64(co)/float64(ct), ours, theirs, rss, rssBase, perQP)
			t.Log(line)
			fmt.Println("@@" + line)
			if mo > mt {
				t.Errorf("qpdrain qps -j (%v) is slower than rdma resource show qp -j (%v) over %d QPs", mo, mt, n)
			}
		})
	}
}

func kernelRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

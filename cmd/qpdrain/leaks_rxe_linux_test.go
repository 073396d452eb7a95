package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/internal/testing/promcheck"
	"github.com/qpdrain/qpdrain/internal/testing/qpset"
	"github.com/qpdrain/qpdrain/leaks"
	"github.com/qpdrain/qpdrain/rcsetup"
)

// The leak helpers, started like the qps helpers (startHelper) with
// envHelper set to their mode, before TestMain runs:
//
//	stuck: a connected RC pair in RTS, two RC QPs left in ERR and one in
//	       RESET, held by a live process
//	grow:  creates two RC QPs every growStep, one of them left in ERR,
//	       for growFor
//	mapper: creates two RC QPs and closes its uverbs fd: the queues'
//	       mappings alone hold the context
//
// They exit 0 on SIGTERM, as a well-behaved process does, or when stdin
// closes; stuck and grow clean up first, mapper leaves it to the kernel
// (without the fd its verbs objects cannot be destroyed).
const (
	growStep = 30 * time.Millisecond
	growFor  = 30 * time.Second
)

func init() {
	switch mode := os.Getenv(envHelper); mode {
	case "stuck", "grow", "mapper":
		if err := leakHelper(mode); err != nil {
			fmt.Fprintf(os.Stderr, "helper %s: %v\n", mode, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

func leakHelper(mode string) error {
	runtime.LockOSThread()
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	eof := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(eof)
	}()
	ctx, set, err := openQPSet()
	if err != nil {
		return err
	}
	route, err := rcsetup.Loopback(ctx, qpset.Port)
	if err != nil {
		return err
	}
	toErr := func(qp ibv.QP) error {
		if err := route.Bring(qp, qp.Num(), ibv.QPSInit); err != nil {
			return err
		}
		return qp.Modify(ibv.QPAttr{State: ibv.QPSErr}, ibv.QPAttrState)
	}
	ready := fmt.Sprintf("READY pid=%d", os.Getpid())
	var grow <-chan time.Time
	switch mode {

	case "stuck":
		if err := set.Many(5); err != nil {
			return err
		}
		q := set.QPs
		if err := route.Connect(q[0], q[1]); err != nil {
			return err
		}
		for _, qp := range q[2:4] {
			if err := toErr(qp); err != nil {
				return err
			}
		}
		fmt.Printf("%s qpns=%s err=%d,%d\n", ready, qpns(set), q[2].Num(), q[3].Num())
	case "mapper":
		if err := set.Many(2); err != nil {
			return err
		}
		fd, _, err := uverbsFD()
		if err != nil {
			return err
		}
		if err := unix.Close(fd); err != nil {
			return err
		}
		fmt.Printf("%s qpns=%s\n", ready, qpns(set))
	case "grow":
		fmt.Println(ready)
		t := time.NewTicker(growStep)
		defer t.Stop()
		grow = t.C
	}
	stop := time.After(growFor)
	for done := false; !done; {
		select {
		case <-grow:
			if err := set.Many(2); err != nil {
				return err
			}
			if err := toErr(set.QPs[len(set.QPs)-1]); err != nil {
				return err
			}
		case <-stop:
			grow = nil
		case <-term:
			done = true
		case <-eof:
			done = true
		}
	}
	if mode == "mapper" {
		return nil
	}
	if err := set.Close(); err != nil {
		return err
	}
	return ctx.Close()
}

// rdmaQPs is `rdma resource show qp -j` of rxe0, by lqpn.
func rdmaQPs(t *testing.T) map[uint32]map[string]any {
	t.Helper()
	out := map[uint32]map[string]any{}
	for _, o := range qpObjects(t, "rdma", runRdma(t, "-j", "resource", "show", "qp")) {
		if o["ifname"] != devtest.DeviceName() {
			continue
		}
		n, err := strconv.ParseUint(fmt.Sprint(o["lqpn"]), 10, 32)
		if err != nil {
			t.Fatalf("rdma lqpn %v: %v", o["lqpn"], err)
		}
		out[uint32(n)] = o
	}
	return out
}

func parseQPNs(t *testing.T, s string) []uint32 {
	t.Helper()
	var out []uint32
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			t.Fatalf("QP number %q: %v", f, err)
		}
		out = append(out, uint32(n))
	}
	slices.Sort(out)
	return out
}

// reapAndCheck runs qpdrain reap --pid pid --yes -j and checks against
// rdma that every QP it targeted is gone and that it says so.
func reapAndCheck(t *testing.T, pid int, want []uint32) {
	t.Helper()
	var r reapResult
	runJSON(t, exitClean, &r, "reap", "--pid", strconv.Itoa(pid), "--yes", "-j", "--wait", "60s")
	var got []uint32
	for _, q := range r.QPs {
		got = append(got, q.LQPN)
	}
	slices.Sort(got)
	if want != nil && !slices.Equal(got, want) {
		t.Errorf("reap --pid %d targeted QPs %v, want %v", pid, got, want)
	}
	if !r.Done || r.Freed != len(r.QPs) || len(r.Remaining) != 0 || r.Freed == 0 {
		t.Errorf("reap --pid %d: %+v", pid, r)
	}
	after := rdmaQPs(t)
	for _, n := range got {
		if o, ok := after[n]; ok && fmt.Sprint(o["type"]) == "RC" {
			t.Errorf("reap --pid %d said lqpn %d was freed; rdma still shows %v", pid, n, o)
		}
	}
	t.Logf("reap --pid %d freed %d QPs in %v", pid, r.Freed, time.Duration(r.WaitedNS))
}

// reapOwn reaps pid, whose QPs are want (nil: any), and checks the
// answer: where the kernel has the context table, reapAndCheck's; before
// it (5.10), with more than one process holding the device, no QP is
// provably kept by pid alone, so reap waits for none, names want among
// the QPs pid may keep alive, and rdma shows them gone after the signal.
func reapOwn(t *testing.T, pid int, want []uint32) {
	t.Helper()
	if hasCtxTable(t) {
		reapAndCheck(t, pid, want)
		return
	}
	var r reapResult
	runJSON(t, exitClean, &r, "reap", "--pid", strconv.Itoa(pid), "--yes", "-j", "--wait", "60s")
	may := map[uint32]bool{}
	for _, q := range r.MayKeep {
		may[q.LQPN] = true
	}
	if len(r.QPs) != 0 || len(r.MayKeep) == 0 || !r.Done {
		t.Errorf("reap --pid %d before 5.11: %+v, want no QP waited for and some it may keep alive", pid, r)
	}
	for _, n := range want {
		if !may[n] {
			t.Errorf("reap --pid %d does not name its QP %d among those it may keep alive", pid, n)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		now, left := rdmaQPs(t), 0
		for _, n := range want {
			if _, ok := now[n]; ok {
				left++
			}
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("reap --pid %d: %d of its QPs still there 30s after the signal", pid, left)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("reap --pid %d: %d QPs it may keep alive, %d of them gone at its last sample", pid, len(r.MayKeep), len(r.MayKeepGone))
}

// TestLeaksRxe plants every leak rxe can produce next to healthy QPs,
// checks that qpdrain leaks -j reports exactly those, that qpdrain reap
// frees them (checked against rdma), and that the exporter's metrics pass
// promtool and match rdma's QP counts.
func TestLeaksRxe(t *testing.T) {
	needRxe(t)
	stuck := startHelper(t, "stuck")
	fork := startHelper(t, "fork") // the creator has exited: its QPs live on in the keeper
	_ = startHelper(t, "thread")   // healthy: its owner is found through the PD row
	grow := startHelper(t, "grow")
	stuckPID, keeper, growPID := stuck.pid(t, "pid"), fork.pid(t, "keeper"), grow.pid(t, "pid")
	errQPNs, forkQPNs := parseQPNs(t, stuck.ready["err"]), parseQPNs(t, fork.ready["qpns"])

	before := rdmaQPs(t)
	for _, n := range errQPNs {
		if s := fmt.Sprint(before[n]["state"]); s != "ERR" {
			t.Fatalf("rdma shows stuck QP %d in %s, want ERR", n, s)
		}
	}
	for _, n := range forkQPNs {
		if o, ok := before[n]; !ok || o["pid"] != nil {
			t.Errorf("rdma shows QP %d of the exited creator as %v, want it without a pid", n, o)
		}
	}

	var r leaksJSON
	out := runJSON(t, exitFindings, &r, "leaks", "-j", "--for", "2s", "--interval", "500ms")
	var reasons []string
	for _, f := range r.Findings {
		reasons = append(reasons, string(f.Reason))
		if f.Device != devtest.DeviceName() || f.Evidence == "" || f.Remedy == "" {
			t.Errorf("finding %+v", f)
		}
		switch f.Reason {
		case leaks.StuckInError:
			if f.Owner == nil || f.Owner.PID != stuckPID || !slices.Equal(lqpns(f.QPs), errQPNs) {
				t.Errorf("stuck-in-error: owner %v QPs %v, want pid %d QPs %v", f.Owner, lqpns(f.QPs), stuckPID, errQPNs)
			}
		case leaks.Orphaned:
			if len(f.Holders) != 1 || f.Holders[0].PID != keeper || !slices.Equal(lqpns(f.QPs), forkQPNs) {
				t.Errorf("orphaned: holders %v QPs %v, want pid %d QPs %v", f.Holders, lqpns(f.QPs), keeper, forkQPNs)
			}
		case leaks.Growing:
			if f.Owner == nil || f.Owner.PID != growPID || len(f.QPs) == 0 {
				t.Errorf("growing: owner %v QPs %v, want pid %d", f.Owner, lqpns(f.QPs), growPID)
			}
			for _, q := range f.QPs {
				if q.State != "ERR" {
					t.Errorf("growing names QP %d in %s", q.LQPN, q.State)
				}
			}
		}
	}
	// Before 5.11 the exited creator's QPs have an uncertain owner, not a
	// gone one: no orphaned finding, and a note says why.
	wantReasons := []string{"stuck-in-error", "orphaned", "growing"}
	if !hasCtxTable(t) {
		wantReasons = []string{"stuck-in-error", "growing"}
		if !slices.ContainsFunc(r.Notes, func(n string) bool { return strings.Contains(n, "has no RES_CTX_GET") }) {
			t.Errorf("notes %q: none says the kernel has no RES_CTX_GET", r.Notes)
		}
	}
	if !slices.Equal(reasons, wantReasons) {
		t.Errorf("findings %v, want exactly %v:\n%s", reasons, wantReasons, out)
	}

	reapOwn(t, growPID, nil) // it grows until reaped: no fixed list
	reapOwn(t, stuckPID, parseQPNs(t, stuck.ready["qpns"]))
	reapOwn(t, keeper, forkQPNs)

	// Now only healthy QPs are left: the exporter agrees with rdma, and
	// qpdrain leaks finds nothing.
	body := scrapeExporter(t, hostOptions{proc: "/proc", sys: "/sys", dev: "/dev", timeout: time.Minute})
	promcheck.Check(t, body)
	want := map[string]int{}
	for _, o := range rdmaQPs(t) {
		want[fmt.Sprintf("%v/%v", o["type"], o["state"])]++
	}
	got := map[string]int{}
	re := regexp.MustCompile(`(?m)^qpdrain_qps\{device="` + devtest.DeviceName() + `",port="\d+",state="(\w+)",type="(\w+)"\} (\d+)$`)
	for _, m := range re.FindAllStringSubmatch(string(body), -1) {
		n, _ := strconv.Atoi(m[3])
		got[m[2]+"/"+m[1]] += n
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("exporter QPs by type/state %v, rdma %v:\n%s", got, want, body)
	}
	if !strings.Contains(string(body), `qpdrain_device_max_qp{device="`+devtest.DeviceName()+`"}`) {
		t.Errorf("exporter has no max_qp for %s:\n%s", devtest.DeviceName(), body)
	}
	if out, err := runQpdrain(t, "leaks", "--for", "1s", "--interval", "500ms"); exitCode(err) != exitClean {
		t.Errorf("leaks after the reaps: exit %d:\n%s", exitCode(err), out)
	}
}

// TestLeaksScale times qpdrain leaks at each scale point (10,000 QPs;
// -qpdrain.scale-qps adds one) next to rdma resource show qp -j in the same
// run: the whole command with one sample (wall and CPU time, peak RSS;
// three runs, one beyond 10,000 QPs), one sample in this process (the
// median of three, and the heap a sample keeps), and an exporter scrape.
func TestLeaksScale(t *testing.T) {
	needRxe(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range scalePoints() {
		t.Run(scaleName(n), func(t *testing.T) {
			run := func(name string, args ...string) runCost {
				return timedRun(t, self, exitFindings, name, args...)
			}
			startMany(t, n)
			var cli, rdma []runCost
			var rss int64
			for range scaleRuns(n, 3) {
				c := run(self, "leaks", "-j", "--for", "0s")
				cli, rss = append(cli, c), max(rss, c.rss)
				rdma = append(rdma, run("rdma", "-j", "resource", "show", "qp"))
			}
			h, err := openRealHost(hostOptions{proc: "/proc", sys: "/sys", dev: "/dev"}, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			var one []time.Duration
			var heap uint64
			for range 3 {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				start := time.Now()
				s, err := h.Sample(context.Background())
				one = append(one, time.Since(start))
				if err != nil {
					t.Fatal(err)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				if got := len(s.Devices[0].QPs); got < n {
					t.Fatalf("a sample has %d QPs, want at least %d", got, n)
				}
				heap = max(heap, after.HeapAlloc-min(after.HeapAlloc, before.HeapAlloc))
				runtime.KeepAlive(s)
			}
			start := time.Now()
			// two scrapes, each a sample bounded as the exporter's (minutes
			// at 100,000 QPs under TCG)
			scrapeExporter(t, hostOptions{proc: "/proc", sys: "/sys", dev: "/dev", timeout: 5 * time.Minute})
			scrape := time.Since(start) / 2
			med := func(ds []time.Duration) time.Duration {
				s := slices.Clone(ds)
				slices.Sort(s)
				return s[len(s)/2]
			}
			wc, cc := medianCosts(cli)
			wr, cr := medianCosts(rdma)
			line := fmt.Sprintf("BENCH leaks-%s kernel=%s leaks_cli=%v rdma=%v ratio=%.2f leaks_cpu=%v rdma_cpu=%v cpu_ratio=%.2f sample=%v sample_runs=%v sample_heap_bytes_per_qp=%.0f leaks_maxrss_kib=%d exporter_scrape=%v cli_runs=%v rdma_runs=%v",
				scaleName(n), kernelRelease(), wc.Round(time.Millisecond), wr.Round(time.Millisecond), float64(wc)/float64(wr),
				cc.Round(time.Millisecond), cr.Round(time.Millisecond), float64(cc)/float64(cr),
				med(one).Round(time.Millisecond), one, float64(heap)/float64(n), rss, scrape.Round(time.Millisecond), cli, rdma)
			t.Log(line)
			fmt.Println("@@" + line)
		})
	}
}

// TestReapHoldersRxe plants the holder cases side by side on one device: two
// unrelated processes, a creator that forked a keeper and exited (reaped),
// a zombie creator whose keeper holds its fd, and a process that holds its
// context by mappings alone. It checks each QP's holders in qpdrain qps -j,
// the filter errors, then reaps each holder and checks against rdma that
// exactly its QPs went.
func TestReapHoldersRxe(t *testing.T) {
	needRxe(t)
	dev := devtest.DeviceName()
	a, b := startHelper(t, "stuck"), startHelper(t, "stuck")
	mapper := startHelper(t, "mapper")
	fork := startHelper(t, "fork")
	zombie := startHelper(t, "zombie") // startHelper does not reap it
	if err := waitGone("/proc/" + zombie.ready["pid"]); err != nil {
		t.Fatal(err)
	}
	kf, kz := fork.pid(t, "keeper"), zombie.pid(t, "keeper")
	qpnsOf := func(h *helperProc) []uint32 { return parseQPNs(t, h.ready["qpns"]) }
	all := map[string][]uint32{"a": qpnsOf(a), "b": qpnsOf(b), "mapper": qpnsOf(mapper), "fork": qpnsOf(fork), "zombie": qpnsOf(zombie)}

	snapshot := func() map[uint32]qpJSON {
		t.Helper()
		var list []qpJSON
		runJSON(t, exitClean, &list, "qps", "-j", "link", dev)
		m := map[uint32]qpJSON{}
		for _, q := range list {
			m[q.LQPN] = q
		}
		return m
	}
	check := func(m map[uint32]qpJSON, who string, pids []int, certain, gone bool) {
		t.Helper()
		for _, n := range all[who] {
			q, ok := m[n]
			if !ok {
				t.Errorf("%s's QP %d not listed", who, n)
				continue
			}
			var got []int
			for _, h := range q.Holders {
				got = append(got, int(h.PID))
			}
			if !slices.Equal(got, pids) || q.HoldersCertain != certain || q.CreatorGone != gone {
				t.Errorf("%s's QP %d: holders %v certain %v creator_gone %v, want %v %v %v", who, n, got, q.HoldersCertain, q.CreatorGone, pids, certain, gone)
			}
		}
	}
	m := snapshot()
	if !hasCtxTable(t) {
		reapHoldersNoCtx(t, m, all, snapshot, kf, kz)
		return
	}
	check(m, "a", []int{a.pid(t, "pid")}, true, false)
	check(m, "b", []int{b.pid(t, "pid")}, true, false)
	check(m, "mapper", []int{mapper.pid(t, "pid")}, true, false)
	if q := m[all["mapper"][0]]; len(q.Holders) != 1 || !q.Holders[0].Mapped || len(q.Holders[0].FDs) != 0 {
		t.Errorf("mapper's QP holders %+v, want the mapper by mappings only", q.Holders)
	}
	// Two contexts whose creators are gone, each held by a keeper: the
	// kernel does not say which keeper holds which.
	pair := []int{min(kf, kz), max(kf, kz)}
	check(m, "fork", pair, false, true)
	check(m, "zombie", pair, false, true)
	if o := m[all["zombie"][0]].Owner; o == nil || int(o.PID) != zombie.pid(t, "pid") || !o.Zombie {
		t.Errorf("zombie's QP owner %+v, want the zombie %d", o, zombie.pid(t, "pid"))
	}

	for _, f := range [][]string{{"state", "FOO"}, {"type", "XYZ"}, {"path-mig-state", "NONE"}, {"link", dev + "/7"}} {
		if out, err := runQpdrain(t, append([]string{"qps"}, f...)...); exitCode(err) != exitError {
			t.Errorf("qps %v: exit %d, want %d:\n%s", f, exitCode(err), exitError, out)
		}
	}

	// left checks against rdma that the QPs of whos are all there and
	// those of gone all went.
	left := func(gone []string, whos ...string) {
		t.Helper()
		now := rdmaQPs(t)
		for _, who := range whos {
			for _, n := range all[who] {
				if _, ok := now[n]; !ok {
					t.Errorf("%s's QP %d went with another holder", who, n)
				}
			}
		}
		for _, who := range gone {
			for _, n := range all[who] {
				if _, ok := now[n]; ok {
					t.Errorf("%s's QP %d is still there", who, n)
				}
			}
		}
	}
	reapAndCheck(t, a.pid(t, "pid"), all["a"])
	left([]string{"a"}, "b", "mapper", "fork", "zombie")
	reapAndCheck(t, b.pid(t, "pid"), all["b"])
	left([]string{"b"}, "mapper", "fork", "zombie")
	reapAndCheck(t, mapper.pid(t, "pid"), all["mapper"])
	left([]string{"mapper"}, "fork", "zombie")

	// The fork's keeper may keep either pair of QPs: reap waits for none,
	// and rdma shows that its own went.
	reapForkCandidate(t, kf, all["fork"][0])
	left([]string{"fork"}, "zombie")
	// Now one context and one file are left: the zombie's keeper is proven.
	check(snapshot(), "zombie", []int{kz}, true, true)
	reapAndCheck(t, kz, all["zombie"])
	left([]string{"zombie"})
}

// reapHoldersNoCtx is TestReapHoldersRxe on a kernel without the context
// table (5.10): no context is tied to its file, so every QP's holders are
// the five candidates, and the exited creators' QPs have an uncertain
// owner; reap waits for no QP of a candidate and names the ones it may
// keep alive, which go with it; once one holder is left it is proven, and
// reap frees its QPs.
func reapHoldersNoCtx(t *testing.T, m map[uint32]qpJSON, all map[string][]uint32, snapshot func() map[uint32]qpJSON, kf, kz int) {
	t.Helper()
	var holders []int
	for _, h := range m[all["a"][0]].Holders {
		holders = append(holders, int(h.PID))
	}
	if len(holders) != 5 {
		t.Errorf("holders of a's QPs %v, want the five processes holding the device", holders)
	}
	for who, qpns := range all {
		for _, n := range qpns {
			q, ok := m[n]
			if !ok {
				t.Errorf("%s's QP %d not listed", who, n)
				continue
			}
			var got []int
			for _, h := range q.Holders {
				got = append(got, int(h.PID))
			}
			exited := who == "fork" || who == "zombie"
			if !slices.Equal(got, holders) || q.HoldersCertain || q.CreatorGone || q.OwnerUncertain != exited {
				t.Errorf("%s's QP %d: holders %v certain %v creator_gone %v owner_uncertain %v, want the candidates %v, uncertain, owner uncertain %v",
					who, n, got, q.HoldersCertain, q.CreatorGone, q.OwnerUncertain, holders, exited)
			}
			if !exited && (q.Owner == nil || q.Owner.Via == "") {
				t.Errorf("%s's QP %d: owner %+v, want its live creator", who, n, q.Owner)
			}
		}
	}
	for _, who := range []string{"a", "b", "mapper"} {
		if o := m[all[who][0]].Owner; o != nil {
			reapOwn(t, int(o.PID), all[who])
		}
	}
	reapForkCandidate(t, kf, all["fork"][0])
	// One holder left: it holds every context, proven.
	for _, n := range all["zombie"] {
		if q := snapshot()[n]; len(q.Holders) != 1 || int(q.Holders[0].PID) != kz || !q.HoldersCertain {
			t.Errorf("zombie's QP %d with one holder left: %+v, want pid %d, certain", n, q.Holders, kz)
		}
	}
	reapAndCheck(t, kz, all["zombie"])
}

// reapForkCandidate reaps kf, one of two processes that may each keep the
// fork's QPs alive: reap waits for none of them and lists all 4 as ones kf
// may keep alive; then kf is gone, and (within 30 s) so is forkQP when kf
// was its keeper.
func reapForkCandidate(t *testing.T, kf int, forkQP uint32) {
	t.Helper()
	var r reapResult
	if runJSON(t, exitClean, &r, "reap", "--pid", strconv.Itoa(kf), "--yes", "-j"); len(r.QPs) != 0 || len(r.MayKeep) != 4 {
		t.Fatalf("reap --pid %d (a candidate): %+v, want no QP waited for and 4 it may keep alive", kf, r)
	}
	if err := waitGone("/proc/" + strconv.Itoa(kf)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, ok := rdmaQPs(t)[forkQP]; ok && time.Now().Before(deadline); _, ok = rdmaQPs(t)[forkQP] {
		time.Sleep(100 * time.Millisecond)
	}
}

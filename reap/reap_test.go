package reap

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/leaks"
)

var (
	app   = leaks.Process{PID: 100, Comm: "app"}
	child = leaks.Process{PID: 300, Comm: "child"}
	other = leaks.Process{PID: 500, Comm: "other"}
)

// hostQPs are the holder cases side by side: owned and held alone, held
// alone after its creator exited, shared with a child, among unproven
// candidates, another process's, and a kernel QP.
func hostQPs() []leaks.QP {
	return []leaks.QP{
		{Port: 1, LQPN: 1, Type: "GSI", State: "RTS", KernName: "ib_core"},
		{Port: 1, LQPN: 17, Type: "RC", State: "RTS", Owner: app, Holders: []leaks.Process{app}, HoldersCertain: true},
		{Port: 1, LQPN: 20, Type: "RC", State: "ERR", Holders: []leaks.Process{app}, HoldersCertain: true},
		{Port: 1, LQPN: 21, Type: "RC", State: "RTS", Owner: app, Holders: []leaks.Process{app, child}, HoldersCertain: true},
		{Port: 1, LQPN: 22, Type: "RC", State: "RTS", Holders: []leaks.Process{app, other}},
		{Port: 1, LQPN: 30, Type: "RC", State: "RTS", Owner: other, Holders: []leaks.Process{other}, HoldersCertain: true},
	}
}

func sampleOf(qps []leaks.QP) leaks.Sample {
	return leaks.Sample{At: time.Now(), Devices: []leaks.Device{{Name: "rxe0", QPs: qps}}}
}

func lqpns(qps []QP) []uint32 {
	out := []uint32{}
	for _, q := range qps {
		out = append(out, q.LQPN)
	}
	return out
}

func TestPlanPID(t *testing.T) {
	p := PlanPID(sampleOf(hostQPs()), app)
	if got := lqpns(p.QPs); !slices.Equal(got, []uint32{17, 20}) {
		t.Errorf("alone %v, want 17 and 20", got)
	}
	if p.QPs[0].Held || !p.QPs[1].Held {
		t.Errorf("held %v %v: 20's creator is gone, app only holds it", p.QPs[0].Held, p.QPs[1].Held)
	}
	if got := lqpns(p.MayKeep); !slices.Equal(got, []uint32{21, 22}) {
		t.Errorf("may keep %v, want 21 and 22", got)
	}
	if p.MayKeep[0].Why != "also held by pid 300 (child)" || p.MayKeep[1].Why != "held by one or more of pid 100 (app), pid 500 (other)" {
		t.Errorf("why: %q, %q", p.MayKeep[0].Why, p.MayKeep[1].Why)
	}
	if e := PlanPID(sampleOf(hostQPs()), leaks.Process{PID: 7}); !e.Empty() || e.QPs == nil || e.MayKeep == nil {
		t.Errorf("a process holding nothing: %+v, want empty lists, not nil", e)
	}
}

// Remaining: a planned QP number the kernel reused for another process's
// QP is gone; one whose owner exited (the holder keeps it) is not.
func TestRemaining(t *testing.T) {
	p := PlanPID(sampleOf(hostQPs()), app)
	after := []leaks.QP{
		{Port: 1, LQPN: 17, Type: "RC", State: "INIT", Owner: other},
		{Port: 1, LQPN: 20, Type: "RC", State: "ERR"},
	}
	if got := lqpns(Remaining(sampleOf(after), p.QPs, app.PID)); !slices.Equal(got, []uint32{20}) {
		t.Errorf("remaining %v, want 20 (17 is another process's now)", got)
	}
}

// fakeHost scripts the host: a signal to victim ends it, and the QPs it
// alone held go, with those in alsoGone.
type fakeHost struct {
	mu       sync.Mutex
	victim   int
	killed   bool
	alsoGone []uint32
	signals  []syscall.Signal
	noRDMA   bool
}

func (f *fakeHost) Sample(ctx context.Context) (leaks.Sample, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.noRDMA && f.killed {
		return leaks.Sample{}, leaks.ErrNoRDMA
	}
	qps := hostQPs()
	if f.killed {
		qps = slices.DeleteFunc(qps, func(q leaks.QP) bool {
			return slices.Contains(f.alsoGone, q.LQPN) || len(q.Holders) == 1 && q.Holders[0].PID == f.victim
		})
	}
	return sampleOf(qps), ctx.Err()
}

func (f *fakeHost) Signal(pid int, sig syscall.Signal) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.signals = append(f.signals, sig)
	f.killed = pid == f.victim
	return nil
}

// Signal proves the QPs the target alone held went, and reports the QPs
// it may have kept alive that went too (the child exited with it), which
// it does not wait for.
func TestSignalReportsMayKeepGone(t *testing.T) {
	f := &fakeHost{victim: app.PID, alsoGone: []uint32{21}}
	p := PlanPID(sampleOf(hostQPs()), app)
	r, err := Signal(context.Background(), f, f, &p, syscall.SIGTERM, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if r.Freed != 2 || len(r.Remaining) != 0 || !slices.Equal(f.signals, []syscall.Signal{syscall.SIGTERM}) {
		t.Errorf("result %+v, signals %v", r, f.signals)
	}
	if got := lqpns(r.MayKeepGone); !slices.Equal(got, []uint32{21}) {
		t.Errorf("may keep alive, gone: %v, want 21 (22 is still there)", got)
	}
	// A host left without RDMA devices has none of them left.
	f = &fakeHost{victim: app.PID, noRDMA: true}
	if r, err = Signal(context.Background(), f, f, &p, syscall.SIGKILL, time.Second); err != nil || r.Freed != 2 || len(r.MayKeepGone) != 2 {
		t.Errorf("no RDMA after the signal: %+v %v, want every QP gone", r, err)
	}
}

// A target that ignores the signal: the wait ends with every QP there and
// none of those it may keep alive reported gone.
func TestSignalIgnored(t *testing.T) {
	f := &fakeHost{victim: -1}
	p := PlanPID(sampleOf(hostQPs()), app)
	r, err := Signal(context.Background(), f, f, &p, syscall.SIGTERM, 250*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if r.Freed != 0 || len(r.Remaining) != 2 || len(r.MayKeepGone) != 0 || r.Waited < 250*time.Millisecond {
		t.Errorf("%+v", r)
	}
	// A wait over before any sample was read proves nothing gone.
	if r, err = Signal(context.Background(), f, f, &p, syscall.SIGTERM, time.Nanosecond); err != nil || len(r.Remaining) != 2 || len(r.MayKeepGone) != 0 {
		t.Errorf("--wait 1ns: %+v %v", r, err)
	}
}

func TestCheckPID(t *testing.T) {
	for _, c := range []struct {
		pid  int
		want string
	}{{1, "pid 1 is init"}, {os.Getpid(), "qpdrain itself"}, {2, "kernel thread"}} {
		if _, err := CheckPID("", c.pid); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("pid %d: %v, want %q", c.pid, err, c.want)
		}
	}
	// A thread of this process other than its leader.
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Skip(err)
	}
	for _, e := range tasks {
		if tid, _ := strconv.Atoi(e.Name()); tid != os.Getpid() {
			if _, err := CheckPID("/proc", tid); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "is a thread of process "+strconv.Itoa(os.Getpid())) {
				t.Errorf("thread %d: %v", tid, err)
			}
			break
		}
	}
}

// kernelThread reads PF_KTHREAD past a comm with spaces and parentheses.
func TestKernelThread(t *testing.T) {
	root := t.TempDir()
	for pid, flags := range map[int]int{10: pfKthread | 0x40, 11: 0x400100} {
		dir := filepath.Join(root, strconv.Itoa(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		stat := strconv.Itoa(pid) + " (a (b) c) S 2 0 0 0 -1 " + strconv.Itoa(flags) + " 0 0\n"
		if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if k, err := kernelThread(root, 10); !k || err != nil {
		t.Errorf("pid 10: %v %v, want a kernel thread", k, err)
	}
	if k, err := kernelThread(root, 11); k || err != nil {
		t.Errorf("pid 11: %v %v, want none", k, err)
	}
}

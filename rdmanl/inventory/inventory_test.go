package inventory

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/qpdrain/qpdrain/rdmanl"
)

// fakeSource is an RDMA netlink that answers from tables.
type fakeSource struct {
	devs    []rdmanl.Device
	qps     []rdmanl.QP
	pds     []rdmanl.PD
	ctxs    []rdmanl.Ctx
	pdCalls int
	// ctxErr, when set, is the context dump's answer.
	ctxErr error
	// hidden are QPs the device has that its dump misses, as one running
	// while QPs are destroyed does.
	hidden []rdmanl.QP
}

func (f *fakeSource) Devices(context.Context) ([]rdmanl.Device, error) { return f.devs, nil }
func (f *fakeSource) AppendQPs(_ context.Context, dst []rdmanl.QP, d rdmanl.Device) ([]rdmanl.QP, error) {
	for _, q := range f.qps {
		if q.Device == d.Index {
			dst = append(dst, q)
		}
	}
	return dst, nil
}
func (f *fakeSource) PDs(context.Context, rdmanl.Device) ([]rdmanl.PD, error) {
	f.pdCalls++
	return f.pds, nil
}
func (f *fakeSource) Contexts(context.Context, rdmanl.Device) ([]rdmanl.Ctx, error) {
	if f.ctxErr != nil {
		return nil, f.ctxErr
	}
	return f.ctxs, nil
}
func (f *fakeSource) LookupQP(_ context.Context, q rdmanl.QP) (rdmanl.QP, error) {
	for _, have := range append(f.qps, f.hidden...) {
		if have.Device == q.Device && have.ID() == q.ID() {
			return have, nil
		}
	}
	return rdmanl.QP{}, fmt.Errorf("%w: %w", rdmanl.ErrNoSuchQP, syscall.ENOENT)
}
func (f *fakeSource) UverbsChardev(_ context.Context, d rdmanl.Device) (rdmanl.Chardev, error) {
	return rdmanl.Chardev{Name: "uverbs" + strconv.Itoa(int(d.Index)-1)}, nil
}

// procTree writes a /proc with processes: pid -> comm, threads, fds, maps.
type task struct {
	pid, tgid uint32
	comm      string
	zombie    bool
	fds       map[int]string
	maps      string
}

func procTree(t testing.TB, tasks ...task) string {
	t.Helper()
	root := t.TempDir()
	for _, k := range tasks {
		dir := filepath.Join(root, strconv.Itoa(int(k.pid)))
		if err := os.MkdirAll(filepath.Join(dir, "fd"), 0o755); err != nil {
			t.Fatal(err)
		}
		state := "S (sleeping)"
		if k.zombie {
			state = "Z (zombie)"
		}
		status := "Name:\t" + k.comm + "\nState:\t" + state + "\nTgid:\t" + strconv.Itoa(int(k.tgid)) + "\nPid:\t" + strconv.Itoa(int(k.pid)) + "\n"
		for name, body := range map[string]string{"status": status, "comm": k.comm + "\n", "maps": k.maps} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		for fd, target := range k.fds {
			if err := os.Symlink(target, filepath.Join(dir, "fd", strconv.Itoa(fd))); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root
}

// ownersFixture is rxe0 with a QP of each way of finding its owner, and
// the /proc tree of their processes.
func ownersFixture(t *testing.T) (proc string, src *fakeSource) {
	const uv = "/dev/infiniband/uverbs0"
	proc = procTree(t,
		task{pid: 100, tgid: 100, comm: "server", fds: map[int]string{7: uv, 8: "/dev/null"}},
		// A thread of 100 named differently: rdma prints its name as comm.
		task{pid: 105, tgid: 100, comm: "worker"},
		task{pid: 200, tgid: 200, comm: "child", fds: map[int]string{3: uv}},
		task{pid: 300, tgid: 300, comm: "mapper", maps: "7f00-7f01 rw-s 00000000 00:05 12 " + uv + "\n7f02-7f03 r-xp 0 0:0 0 /usr/lib/libc.so\n"},
		task{pid: 400, tgid: 400, comm: "dying", zombie: true},
		task{pid: 500, tgid: 500, comm: "bystander", fds: map[int]string{3: "/dev/infiniband/uverbs1"}},
	)
	rxe0 := rdmanl.Device{Index: 1, Name: "rxe0"}
	src = &fakeSource{
		devs: []rdmanl.Device{rxe0},
		qps: []rdmanl.QP{
			{Device: 1, DeviceName: "rxe0", LQPN: 1, KernName: "ib_core", Has: rdmanl.HasKernName},
			{Device: 1, DeviceName: "rxe0", LQPN: 17, PID: 105, PDN: 1, Has: rdmanl.HasPID | rdmanl.HasPDN},
			// The creating thread exited: the PD names the process.
			{Device: 1, DeviceName: "rxe0", LQPN: 18, PDN: 1, Has: rdmanl.HasPDN},
			// The creator is gone; only the context's pid is left.
			{Device: 1, DeviceName: "rxe0", LQPN: 19, PDN: 2, Has: rdmanl.HasPDN},
			// Creator, PD and context rows all without a pid.
			{Device: 1, DeviceName: "rxe0", LQPN: 20, PDN: 3, Has: rdmanl.HasPDN},
			// The row names a pid that no longer exists.
			{Device: 1, DeviceName: "rxe0", LQPN: 21, PID: 999, PDN: 3, Has: rdmanl.HasPID | rdmanl.HasPDN},
			{Device: 1, DeviceName: "rxe0", LQPN: 22, PID: 400, PDN: 4, Has: rdmanl.HasPID | rdmanl.HasPDN},
		},
		pds: []rdmanl.PD{
			{Device: 1, PDN: 1, CtxN: 1, PID: 100, Has: rdmanl.HasCtxN | rdmanl.HasPID},
			{Device: 1, PDN: 2, CtxN: 2, Has: rdmanl.HasCtxN},
			{Device: 1, PDN: 3, CtxN: 3, Has: rdmanl.HasCtxN},
		},
		ctxs: []rdmanl.Ctx{{Device: 1, CtxN: 1, PID: 100, Has: rdmanl.HasPID}, {Device: 1, CtxN: 2, PID: 200, Has: rdmanl.HasPID}, {Device: 1, CtxN: 3}},
	}
	return proc, src
}

func TestTakeOwners(t *testing.T) {
	proc, src := ownersFixture(t)
	snap, err := Take(context.Background(), src, Options{Proc: Proc{Root: proc}})
	if err != nil {
		t.Fatal(err)
	}
	wantHolders := []Holder{{PID: 100, Comm: "server", FDs: []int{7}}, {PID: 200, Comm: "child", FDs: []int{3}}, {PID: 300, Comm: "mapper", Mapped: true}}
	if len(snap.Devices) != 1 || snap.Devices[0].Chardev != "uverbs0" || !reflect.DeepEqual(snap.Devices[0].Holders, wantHolders) {
		t.Fatalf("devices %+v, want rxe0 on uverbs0 held by %+v", snap.Devices, wantHolders)
	}
	want := map[uint32]struct {
		owner *Owner
		comm  string
		gone  bool
	}{
		1:  {&Owner{Comm: "ib_core", Via: FromKernel}, "ib_core", false},
		17: {&Owner{PID: 100, TID: 105, Comm: "server", Via: FromQP}, "worker", false},
		18: {&Owner{PID: 100, Comm: "server", Via: FromPD}, "", false},
		19: {&Owner{PID: 200, Comm: "child", Via: FromCtx}, "", false},
		20: {nil, "", true},
		21: {nil, "", true},
		// A zombie creator has closed its files: gone, though named.
		22: {&Owner{PID: 400, Comm: "dying", Zombie: true, Via: FromQP}, "dying", true},
	}
	for _, q := range snap.QPs {
		w := want[q.LQPN]
		if !reflect.DeepEqual(q.Owner, w.owner) || q.Comm != w.comm || q.CreatorGone != w.gone {
			t.Errorf("QP %d: owner %+v comm %q gone %v, want %+v %q %v", q.LQPN, q.Owner, q.Comm, q.CreatorGone, w.owner, w.comm, w.gone)
		}
		// Without kcmp (a recorded /proc) no fd is known to share a file:
		// each user QP's candidates are the device's holders.
		if wh := wantHolders; q.LQPN != 1 && (!reflect.DeepEqual(q.Holders, wh) || q.HoldersCertain) || q.LQPN == 1 && (q.Holders != nil || !q.HoldersCertain) {
			t.Errorf("QP %d: holders %+v certain %v", q.LQPN, q.Holders, q.HoldersCertain)
		}
	}
}

// A kernel without RES_CTX_GET (before 5.11 it answers EINVAL) does not
// fail the snapshot: a QP whose QP and PD rows name no live process has
// an unknown owner, not a gone one, and a note says why. Any other
// failure of the context dump fails it.
func TestTakeWithoutContextTable(t *testing.T) {
	proc, src := ownersFixture(t)
	src.ctxErr = &rdmanl.Error{Command: rdmanl.CmdResCtxGet, Device: "rxe0", Err: syscall.EINVAL}
	snap, err := Take(context.Background(), src, Options{Proc: Proc{Root: proc}})
	if err != nil {
		t.Fatalf("Take on a kernel without RES_CTX_GET: %v, want a snapshot", err)
	}
	if len(snap.Notes) != 1 || !strings.Contains(snap.Notes[0], "rxe0: the kernel has no RES_CTX_GET") {
		t.Errorf("notes %q, want one saying rxe0's kernel has no RES_CTX_GET", snap.Notes)
	}
	want := map[uint32]struct {
		pid       uint32
		uncertain bool
	}{1: {0, false}, 17: {100, false}, 18: {100, false}, 19: {0, true}, 20: {0, true}, 21: {0, true}, 22: {400, true}}
	for _, q := range snap.QPs {
		w := want[q.LQPN]
		pid := uint32(0)
		if q.Owner != nil {
			pid = q.Owner.PID
		}
		if pid != w.pid || q.OwnerUncertain != w.uncertain || q.CreatorGone {
			t.Errorf("QP %d: owner pid %d uncertain %v creator gone %v, want %d %v and not gone", q.LQPN, pid, q.OwnerUncertain, q.CreatorGone, w.pid, w.uncertain)
		}
	}
	src.ctxErr = &rdmanl.Error{Command: rdmanl.CmdResCtxGet, Device: "rxe0", Err: syscall.EPERM}
	if _, err := Take(context.Background(), src, Options{Proc: Proc{Root: proc}}); !errors.Is(err, syscall.EPERM) {
		t.Errorf("context dump failing with EPERM: %v, want the error", err)
	}
}

func TestTakePDsOnlyWhenNeeded(t *testing.T) {
	proc := procTree(t, task{pid: 100, tgid: 100, comm: "server"})
	src := &fakeSource{
		devs: []rdmanl.Device{{Index: 1, Name: "rxe0"}},
		qps:  []rdmanl.QP{{Device: 1, LQPN: 17, PID: 100, Has: rdmanl.HasPID}},
	}
	if _, err := Take(context.Background(), src, Options{Proc: Proc{Root: proc}, NoHolders: true}); err != nil {
		t.Fatal(err)
	}
	if src.pdCalls != 0 {
		t.Errorf("PD table read %d times although every QP row names a live process", src.pdCalls)
	}
}

func TestTakeErrors(t *testing.T) {
	if _, err := Take(context.Background(), &fakeSource{}, Options{}); !errors.Is(err, ErrNoDevices) {
		t.Errorf("no devices: %v, want ErrNoDevices", err)
	}
	src := &fakeSource{devs: []rdmanl.Device{{Index: 1, Name: "rxe0"}}}
	if _, err := Take(context.Background(), src, Options{Devices: []string{"mlx5_0"}}); !errors.Is(err, ErrNoSuchDevice) {
		t.Errorf("unknown device: %v, want ErrNoSuchDevice", err)
	}
}

func TestSysUverbsDevices(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "class", "infiniband_verbs", "uverbs0")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ibdev"), []byte("rxe0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := Sys{Root: root}.UverbsDevices()
	if err != nil || !reflect.DeepEqual(m, map[string]string{"uverbs0": "rxe0"}) {
		t.Fatalf("UverbsDevices: %v %v", m, err)
	}
	if m, err := (Sys{Root: t.TempDir()}).UverbsDevices(); err != nil || len(m) != 0 {
		t.Errorf("without infiniband_verbs: %v %v, want empty", m, err)
	}
}

// lqpns are a snapshot's QP numbers, in its order.
func lqpns(snap *Snapshot) []uint32 {
	var out []uint32
	for _, q := range snap.QPs {
		out = append(out, q.LQPN)
	}
	return out
}

// A QP of the previous snapshot that a dump missed (one running while QPs
// are destroyed) is kept when the kernel still has it, and only then; one
// the kernel has not is gone.
func TestTakeConfirmsMissingQPs(t *testing.T) {
	proc, src := ownersFixture(t)
	for i := range src.qps { // on a port: looked up by number
		src.qps[i].Port, src.qps[i].Has = 1, src.qps[i].Has|rdmanl.HasPort
	}
	prev, err := Take(context.Background(), src, Options{Proc: Proc{Root: proc}})
	if err != nil {
		t.Fatal(err)
	}
	// 18 is alive but missing from the dump; 21 was destroyed.
	var kept []rdmanl.QP
	for _, q := range src.qps {
		switch q.LQPN {
		case 18:
			src.hidden = append(src.hidden, q)
		case 21:
		default:
			kept = append(kept, q)
		}
	}
	src.qps = kept
	snap, err := Take(context.Background(), src, Options{Proc: Proc{Root: proc}, Previous: prev})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := lqpns(snap), []uint32{1, 17, 19, 20, 22, 18}; !reflect.DeepEqual(got, want) {
		t.Errorf("QPs with the previous snapshot %v, want %v (18 found by number, 21 gone)", got, want)
	}
	for _, q := range snap.QPs {
		if q.LQPN == 18 && (q.Owner == nil || q.Owner.PID != 100) {
			t.Errorf("QP 18 found by number: owner %+v, want pid 100 through its PD", q.Owner)
		}
	}
	if len(snap.Notes) != 0 {
		t.Errorf("notes %q", snap.Notes)
	}
	// Without the previous snapshot, the dump is all there is.
	snap, err = Take(context.Background(), src, Options{Proc: Proc{Root: proc}})
	if err != nil {
		t.Fatal(err)
	}
	if got := lqpns(snap); slices.Contains(got, 18) {
		t.Errorf("QPs without the previous snapshot %v: 18 was hidden from the dump", got)
	}
}

// A QP the kernel cannot look up (one without a port, or a kernel whose
// RES_QP_GET takes no number) is sought in a second dump, which lists it
// when it is alive: a dump that misses it twice is what hides it.
func TestTakeConfirmUnsupported(t *testing.T) {
	proc, src := ownersFixture(t)
	prev, err := Take(context.Background(), src, Options{Proc: Proc{Root: proc}, NoHolders: true})
	if err != nil {
		t.Fatal(err)
	}
	all := src.qps
	k := &missOnce{noLookup: noLookup{src}, first: all[:2], all: all}
	snap, err := Take(context.Background(), k, Options{Proc: Proc{Root: proc}, NoHolders: true, Previous: prev})
	if err != nil {
		t.Fatal(err)
	}
	if got := lqpns(snap); len(got) != len(all) || len(snap.Notes) != 0 || k.dumps != 2 {
		t.Errorf("QPs %v notes %q after %d dumps, want all %d after 2", got, snap.Notes, k.dumps, len(all))
	}
}

// missOnce is a kernel whose first dump lists first and every later one all.
type missOnce struct {
	noLookup
	first, all []rdmanl.QP
	dumps      int
}

func (m *missOnce) AppendQPs(_ context.Context, dst []rdmanl.QP, _ rdmanl.Device) ([]rdmanl.QP, error) {
	m.dumps++
	if m.dumps == 1 {
		return append(dst, m.first...), nil
	}
	return append(dst, m.all...), nil
}

// noLookup is a kernel whose RES_QP_GET takes no QP number.
type noLookup struct{ *fakeSource }

func (noLookup) LookupQP(context.Context, rdmanl.QP) (rdmanl.QP, error) {
	return rdmanl.QP{}, &rdmanl.Error{Command: rdmanl.CmdResQPGet, Err: syscall.EOPNOTSUPP}
}

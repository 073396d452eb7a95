package inventory

import (
	"context"
	"slices"
	"testing"

	"github.com/qpdrain/qpdrain/rdmanl"
)

// sameFiles is a SameFileFunc over a table: pid -> fd -> file name.
func sameFiles(files map[uint32]map[int]string) SameFileFunc {
	return func(pid1 uint32, fd1 int, pid2 uint32, fd2 int) (bool, error) {
		a, ok1 := files[pid1][fd1]
		b, ok2 := files[pid2][fd2]
		if !ok1 || !ok2 {
			return false, ErrFDGone
		}
		return a == b, nil
	}
}

// holderFixture is one device with the host's hard cases side by side,
// each QP in its own context (ctxn = pdn = lqpn/10):
//
//	10 app1 (pid 100) forked worker 600, which shares its file A
//	20 app2 (pid 200) unrelated, its own file B
//	30 creator forked child 300 and exited (reaped): no row names anyone
//	40 creator 400 is a zombie; its child 401 holds the file
//	50 mapper 500 closed its fd and holds the context by mappings only
type holderFixture struct {
	tasks []task
	files map[uint32]map[int]string
	src   *fakeSource
}

const uv0 = "/dev/infiniband/uverbs0"

func newHolderFixture() *holderFixture {
	fx := &holderFixture{
		tasks: []task{
			{pid: 100, tgid: 100, comm: "app1", fds: map[int]string{3: uv0}},
			{pid: 600, tgid: 600, comm: "worker", fds: map[int]string{3: uv0}},
			{pid: 200, tgid: 200, comm: "app2", fds: map[int]string{3: uv0, 4: "/dev/null"}},
			{pid: 300, tgid: 300, comm: "child", fds: map[int]string{5: uv0}},
			{pid: 400, tgid: 400, comm: "zombie", zombie: true},
			{pid: 401, tgid: 401, comm: "kid", fds: map[int]string{4: uv0}},
			{pid: 500, tgid: 500, comm: "mapper", maps: "7f00-7f01 rw-s 00000000 00:05 12 " + uv0 + "\n"},
		},
		files: map[uint32]map[int]string{100: {3: "A"}, 600: {3: "A"}, 200: {3: "B"}, 300: {5: "C"}, 401: {4: "D"}},
		src:   &fakeSource{devs: []rdmanl.Device{{Index: 1, Name: "rxe0"}}},
	}
	for n, pid := range map[uint32]uint32{1: 100, 2: 200, 3: 0, 4: 400, 5: 500} {
		has := rdmanl.HasPDN
		if pid != 0 {
			has |= rdmanl.HasPID
		}
		fx.src.qps = append(fx.src.qps, rdmanl.QP{Device: 1, DeviceName: "rxe0", Port: 1, LQPN: n * 10, PID: pid, PDN: n, Has: has | rdmanl.HasPort})
		fx.src.pds = append(fx.src.pds, rdmanl.PD{Device: 1, PDN: n, CtxN: n, PID: pid, Has: has&rdmanl.HasPID | rdmanl.HasCtxN})
		fx.src.ctxs = append(fx.src.ctxs, rdmanl.Ctx{Device: 1, CtxN: n, PID: pid, Has: has & rdmanl.HasPID})
	}
	slices.SortFunc(fx.src.qps, func(a, b rdmanl.QP) int { return int(a.LQPN) - int(b.LQPN) })
	return fx
}

// without drops the processes (and their files) of pids and the QPs of
// the contexts ctxns.
func (fx *holderFixture) without(pids []uint32, ctxns ...uint32) *holderFixture {
	fx.tasks = slices.DeleteFunc(fx.tasks, func(k task) bool { return slices.Contains(pids, k.pid) })
	for _, p := range pids {
		delete(fx.files, p)
	}
	fx.src.qps = slices.DeleteFunc(fx.src.qps, func(q rdmanl.QP) bool { return slices.Contains(ctxns, q.PDN) })
	fx.src.ctxs = slices.DeleteFunc(fx.src.ctxs, func(c rdmanl.Ctx) bool { return slices.Contains(ctxns, c.CtxN) })
	return fx
}

func (fx *holderFixture) take(t *testing.T, same bool) map[uint32]QP {
	t.Helper()
	p := Proc{Root: procTree(t, fx.tasks...)}
	if same {
		p.SameFile = sameFiles(fx.files)
	}
	snap, err := Take(context.Background(), fx.src, Options{Proc: p})
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint32]QP{}
	for _, q := range snap.QPs {
		out[q.LQPN] = q
	}
	return out
}

func pids(hs []Holder) []uint32 {
	var out []uint32
	for _, h := range hs {
		out = append(out, h.PID)
	}
	return out
}

type wantHeld struct {
	pids    []uint32
	certain bool
	gone    bool
}

func checkHeld(t *testing.T, qps map[uint32]QP, want map[uint32]wantHeld) {
	t.Helper()
	for n, w := range want {
		q, ok := qps[n]
		if !ok {
			t.Errorf("QP %d missing", n)
			continue
		}
		if got := pids(q.Holders); !slices.Equal(got, w.pids) || q.HoldersCertain != w.certain || q.CreatorGone != w.gone {
			t.Errorf("QP %d: holders %v certain %v creator gone %v, want %v %v %v", n, got, q.HoldersCertain, q.CreatorGone, w.pids, w.certain, w.gone)
		}
	}
}

func TestTakeHoldersPerContext(t *testing.T) {
	t.Run("all", func(t *testing.T) {
		// The fork-and-exit child and the zombie's child are two files
		// left for two contexts without a live creator: nothing tells
		// which is which, so both are candidates of both.
		checkHeld(t, newHolderFixture().take(t, true), map[uint32]wantHeld{
			10: {[]uint32{100, 600}, true, false},
			20: {[]uint32{200}, true, false},
			30: {[]uint32{300, 401}, false, true},
			40: {[]uint32{300, 401}, false, true},
			50: {[]uint32{500}, true, false},
		})
	})
	t.Run("fork-and-exit", func(t *testing.T) {
		qps := newHolderFixture().without([]uint32{400, 401}, 4).take(t, true)
		checkHeld(t, qps, map[uint32]wantHeld{
			10: {[]uint32{100, 600}, true, false},
			20: {[]uint32{200}, true, false},
			30: {[]uint32{300}, true, true},
			50: {[]uint32{500}, true, false},
		})
		if h := qps[30].Holders[0]; !slices.Equal(h.FDs, []int{5}) || h.Comm != "child" || h.Mapped {
			t.Errorf("QP 30 holder %+v, want child by fd 5", h)
		}
		if h := qps[50].Holders[0]; !h.Mapped || h.FDs != nil {
			t.Errorf("QP 50 holder %+v, want mapper by mappings", h)
		}
	})
	t.Run("zombie creator", func(t *testing.T) {
		qps := newHolderFixture().without([]uint32{300}, 3).take(t, true)
		checkHeld(t, qps, map[uint32]wantHeld{40: {[]uint32{401}, true, true}, 20: {[]uint32{200}, true, false}})
		if o := qps[40].Owner; o == nil || o.PID != 400 || !o.Zombie {
			t.Errorf("QP 40 owner %+v, want the zombie 400", o)
		}
	})
	t.Run("two unrelated", func(t *testing.T) {
		checkHeld(t, newHolderFixture().without([]uint32{600, 300, 400, 401, 500}, 3, 4, 5).take(t, true), map[uint32]wantHeld{
			10: {[]uint32{100}, true, false},
			20: {[]uint32{200}, true, false},
		})
	})
	t.Run("no kcmp", func(t *testing.T) {
		all := []uint32{100, 200, 300, 401, 500, 600}
		checkHeld(t, newHolderFixture().take(t, false), map[uint32]wantHeld{
			10: {all, false, false},
			40: {all, false, true},
		})
	})
	t.Run("one holder", func(t *testing.T) {
		// One process holds the device: it holds every context of it,
		// and the PD and context tables are not read.
		fx := newHolderFixture().without([]uint32{600, 200, 300, 400, 401, 500}, 2, 3, 4, 5)
		checkHeld(t, fx.take(t, false), map[uint32]wantHeld{10: {[]uint32{100}, true, false}})
		if fx.src.pdCalls != 0 {
			t.Errorf("PD table read %d times", fx.src.pdCalls)
		}
	})
	t.Run("creator holds two files", func(t *testing.T) {
		// app1 opened the device twice (two contexts, two files): which
		// context is which file is not known.
		fx := newHolderFixture().without([]uint32{600, 300, 400, 401, 500}, 3, 4, 5)
		fx.tasks[0].fds[7] = uv0
		fx.files[100][7] = "E"
		fx.src.ctxs = append(fx.src.ctxs, rdmanl.Ctx{Device: 1, CtxN: 6, PID: 100, Has: rdmanl.HasPID})
		fx.src.pds = append(fx.src.pds, rdmanl.PD{Device: 1, PDN: 6, CtxN: 6, PID: 100, Has: rdmanl.HasPID | rdmanl.HasCtxN})
		fx.src.qps = append(fx.src.qps, rdmanl.QP{Device: 1, DeviceName: "rxe0", LQPN: 60, PID: 100, PDN: 6, Has: rdmanl.HasPID | rdmanl.HasPDN})
		qps := fx.take(t, true)
		checkHeld(t, qps, map[uint32]wantHeld{10: {[]uint32{100}, false, false}, 60: {[]uint32{100}, false, false}, 20: {[]uint32{200}, true, false}})
		if fds := qps[60].Holders[0].FDs; !slices.Equal(fds, []int{3, 7}) {
			t.Errorf("QP 60 candidate fds %v, want both files' 3 and 7", fds)
		}
	})
}

func TestTieContextsConflict(t *testing.T) {
	// Two live creators claim one file (one passed its fd on and closed
	// its own): one file has one context, so neither claim is proof.
	files := []File{{Holders: []Holder{{PID: 1, FDs: []int{3}}, {PID: 2, FDs: []int{3}}}}, {Holders: []Holder{{PID: 3, FDs: []int{4}}}}}
	got := tieContexts(files, nil, []creator{{ctxn: 1, pid: 1, live: true}, {ctxn: 2, pid: 2, live: true}})
	for _, c := range []uint32{1, 2} {
		if h := got[c]; h.certain || !slices.Equal(pids(h.holders), []uint32{1, 2, 3}) {
			t.Errorf("context %d: %+v, want the candidates 1, 2, 3", c, h)
		}
	}
}

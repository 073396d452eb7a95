package rdmanl

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/internal/testing/qpset"
)

// recordPrefix starts the lines that carry recorded kernel replies out of
// the VM; testdata/import.sh turns them into testdata/<kernel>/*.hex.
const recordPrefix = "@@NLREC"

// nlType maps libibverbs QP types to RDMA/core's.
func nlType(t ibv.QPType) QPType {
	switch t {
	case ibv.QPTUD:
		return QPTypeUD
	case ibv.QPTUC:
		return QPTypeUC
	}
	return QPTypeRC
}

// TestKernelReplies runs every request this package sends against rxe0
// with a known spread of QPs, checks the decoded answers, and prints the
// kernel's replies byte for byte (@@NLREC lines) for the replay tests.
func TestKernelReplies(t *testing.T) {
	switch {
	case devtest.CurrentProvider() == devtest.ProviderRXE:
	case devtest.IWARP() && devtest.CurrentProvider() != devtest.ProviderSoft:
		// The spread (qpset.Spread) connects RC QPs by hand and creates a
		// UD QP; the replays are of rxe's replies.
		t.Skipf("%s is iWARP: the QP spread connects RC QPs by hand and creates a UD QP; siw reaches RTS only through iw_cm (siw_qp_nextstate_from_idle) and creates RC QPs only (siw_create_qp: EOPNOTSUPP)", devtest.DeviceName())
	default:
		t.Skip("talks to the kernel's rxe: runs in the VM (make test-rxe)")
	}
	dctx := devtest.Open(t)
	set, err := qpset.NewPD(dctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := set.Close(); err != nil {
			t.Error(err)
		}
	})
	if err := set.Spread(); err != nil {
		t.Fatal(err)
	}
	c, err := Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var recs []recording
	c.record = func(cmd Command, _ string, msgs []netlink.Message) {
		recs = append(recs, recording{name: strings.ToLower(cmd.String()), msgs: msgs})
	}
	ctx, cancel := context.WithTimeout(context.Background(), devtest.Timeout)
	defer cancel()

	devs, err := c.Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var dev Device
	for _, d := range devs {
		if d.Name == dctx.Name() {
			dev = d
		}
	}
	if dev.Name == "" || dev.Ports != 1 || dev.Protocol != "roce" {
		t.Fatalf("devices %+v: want %s with 1 port, protocol roce", devs, dctx.Name())
	}
	ports, err := c.Ports(ctx, dev)
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != 1 || ports[0].Port != 1 || ports[0].State.String() != "ACTIVE" || ports[0].Netdev != "dummy0" {
		t.Errorf("ports %+v: want port 1 ACTIVE on dummy0", ports)
	}
	qps, err := c.QPs(ctx, dev)
	if err != nil {
		t.Fatal(err)
	}
	pid := uint32(os.Getpid())
	byNum := map[uint32]QP{}
	for _, q := range qps {
		byNum[q.LQPN] = q
	}
	want := wantFile{Device: dev.Name, PID: pid}
	for num, w := range set.Want {
		q, ok := byNum[num]
		if !ok {
			t.Errorf("QP %d not in the dump", num)
			continue
		}
		if q.Type != nlType(w.Type) || q.State != QPState(w.State) {
			t.Errorf("QP %d is %s %s, want %s %s", num, q.Type, q.State, nlType(w.Type), QPState(w.State))
		}
		if q.Has&HasPDN == 0 || q.Has&HasPID == 0 {
			t.Errorf("QP %d has no pdn or pid: %+v", num, q)
		}
		if (q.State == QPStateReset) == (q.Has&HasPort != 0) {
			t.Errorf("QP %d in %s: port present %v", num, q.State, q.Has&HasPort != 0)
		}
		want.PDN = q.PDN
		want.QPs = append(want.QPs, wantQP{LQPN: num, Type: q.Type.String(), State: q.State.String()})
	}
	if g, ok := byNum[1]; !ok || g.Type != QPTypeGSI || g.Has&HasKernName == 0 {
		t.Errorf("no kernel GSI QP 1 in the dump: %+v", g)
	}
	pds, err := c.PDs(ctx, dev)
	if err != nil {
		t.Fatal(err)
	}
	var ctxn uint32
	found := false
	for _, p := range pds {
		if p.PDN == want.PDN && p.Has&HasCtxN != 0 {
			ctxn, found = p.CtxN, true
		}
	}
	if !found {
		t.Errorf("PD %d with a ctxn not in the PD dump %+v", want.PDN, pds)
	}
	ctxs, err := c.Contexts(ctx, dev)
	if err != nil {
		t.Fatal(err)
	}
	found = false
	for _, x := range ctxs {
		if x.CtxN == ctxn && x.Has&HasPID != 0 {
			found = true
			if tgid := tgidOf(t, x.PID); tgid != pid {
				t.Errorf("context %d: pid %d (process %d), want %d", ctxn, x.PID, tgid, pid)
			}
		}
	}
	if !found {
		t.Errorf("context %d not in the context dump %+v", ctxn, ctxs)
	}
	sum, err := c.Summary(ctx, dev)
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := sum.Count("qp"); !ok || n != uint64(len(qps)) {
		t.Errorf("summary %+v: qp count %d, want %d (the dump's)", sum, n, len(qps))
	}
	cd, err := c.UverbsChardev(ctx, dev)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(cd.Name, "uverbs") || cd.DriverID != DriverRXE || unix.Major(cd.Dev) != 231 {
		t.Errorf("chardev %+v: want uverbsN, driver id %d, major 231", cd, DriverRXE)
	}

	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	kver := unix.ByteSliceToString(u.Release[:])
	for _, r := range recs {
		for _, m := range r.msgs {
			b, err := m.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			fmt.Printf("%s %s %s %s\n", recordPrefix, kver, r.name, hex.EncodeToString(b))
		}
	}
	wb, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("%s %s want %s\n", recordPrefix, kver, wb)
}

// tgidOf maps a thread id to its process.
func tgidOf(t *testing.T, tid uint32) uint32 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", tid))
	if err != nil {
		t.Fatalf("reading task %d: %v", tid, err)
	}
	for line := range strings.Lines(string(b)) {
		var n uint32
		if _, err := fmt.Sscanf(line, "Tgid: %d", &n); err == nil {
			return n
		}
	}
	t.Fatalf("task %d: no Tgid", tid)
	return 0
}

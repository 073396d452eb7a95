package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/mdlayher/netlink/nltest"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/qpdrain/qpdrain/leaks"
	"github.com/qpdrain/qpdrain/metrics"
	"github.com/qpdrain/qpdrain/rdmanl"
	"github.com/qpdrain/qpdrain/rdmanl/inventory"
)

// nldev numbers (include/uapi/rdma/rdma_netlink.h) the synthesized replies
// use.
const (
	nlClientNLDEV  = 5
	nlCmdGet       = 1
	nlCmdResQPGet  = 10
	nlCmdResPDGet  = 14
	nlCmdResCtxGet = 22
	nlDevIndex     = 1
	nlDevName      = 2
	nlPortIndex    = 3
	nlResQP        = 19
	nlResQPEntry   = 20
	nlResLQPN      = 21
	nlResType      = 26
	nlResState     = 27
	nlResPID       = 28
	nlResKernName  = 29
	nlResPD        = 46
	nlResPDEntry   = 47
	nlResPDN       = 60
	nlResCtxN      = 64
	ibQPTypeGSI    = 1 // enum ib_qp_type
	ibQPTypeRC     = 2
	ibQPTypeUD     = 4
	ibQPStateRTS   = 3 // enum ib_qp_state
	ibQPStateError = 6
)

// nlEncode is the attributes fill writes.
func nlEncode(t *testing.T, fill func(ae *netlink.AttributeEncoder)) []byte {
	t.Helper()
	ae := netlink.NewAttributeEncoder()
	fill(ae)
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// nlTable is one dump message of device 0 (mlx5_0): its table attribute
// holding what entries writes.
func nlTable(t *testing.T, table uint16, entries func(tab *netlink.AttributeEncoder)) []byte {
	return nlEncode(t, func(ae *netlink.AttributeEncoder) {
		ae.Uint32(nlDevIndex, 0)
		ae.String(nlDevName, "mlx5_0")
		ae.Nested(table, func(tab *netlink.AttributeEncoder) error {
			entries(tab)
			return nil
		})
	})
}

// nlKernel answers each nldev command in replies with its one message (a
// dump's ended by NLMSG_DONE), GET with the device mlx5_0, and any other
// command with EOPNOTSUPP (GET_CHARDEV: no uverbs char device), or with
// the errno errnos gives it.
func nlKernel(t *testing.T, replies map[uint16][]byte, errnos map[uint16]syscall.Errno) *rdmanl.Conn {
	t.Helper()
	dev := nlEncode(t, func(ae *netlink.AttributeEncoder) {
		ae.Uint32(nlDevIndex, 0)
		ae.String(nlDevName, "mlx5_0")
		ae.Uint32(nlPortIndex, 1)
	})
	return rdmanl.NewConn(nltest.Dial(func(req []netlink.Message) ([]netlink.Message, error) {
		r := req[0]
		cmd := uint16(r.Header.Type) &^ (nlClientNLDEV << 10)
		body, ok := replies[cmd]
		if cmd == nlCmdGet {
			body, ok = dev, true
		}
		if errno := errnos[cmd]; errno != 0 || !ok {
			if errno == 0 {
				errno = syscall.EOPNOTSUPP
			}
			r.Header.Flags = 0
			return nltest.Error(int(errno), []netlink.Message{r})
		}
		msgs := []netlink.Message{{Header: netlink.Header{Type: r.Header.Type, Sequence: r.Header.Sequence}, Data: body}}
		if r.Header.Flags&netlink.Dump == 0 {
			return msgs, nil
		}
		msgs = append(msgs, netlink.Message{Header: netlink.Header{Type: netlink.Done}, Data: make([]byte, 4)})
		return nltest.Multipart(msgs)
	}))
}

// nlQP writes one QP entry; a kernel QP names its module, a user QP its
// pid (0: none, the creating thread is gone) and PD.
func nlQP(tab *netlink.AttributeEncoder, lqpn uint32, typ, state uint8, kern string, pid, pdn uint32) {
	tab.Nested(nlResQPEntry, func(e *netlink.AttributeEncoder) error {
		e.Uint32(nlPortIndex, 1)
		e.Uint32(nlResLQPN, lqpn)
		if kern != "" {
			e.String(nlResKernName, kern)
		} else {
			e.Uint32(nlResPDN, pdn)
		}
		if pid != 0 {
			e.Uint32(nlResPID, pid)
		}
		e.Uint8(nlResType, typ)
		e.Uint8(nlResState, state)
		return nil
	})
}

// ipoibKernel answers nldev as a kernel with IPoIB in connected mode on
// mlx5_0 would: the GSI QP, IPoIB's UD QP, 120 connected-mode RC QPs in
// RTS and three in ERR, all owned by ib_ipoib (kern_name, no pid).
func ipoibKernel(t *testing.T) *rdmanl.Conn {
	t.Helper()
	qps := nlTable(t, nlResQP, func(tab *netlink.AttributeEncoder) {
		nlQP(tab, 1, ibQPTypeGSI, ibQPStateRTS, "ib_core", 0, 0)
		nlQP(tab, 2, ibQPTypeUD, ibQPStateRTS, "ib_ipoib", 0, 0)
		for i := range uint32(123) {
			state := uint8(ibQPStateRTS)
			if i%41 == 0 {
				state = ibQPStateError
			}
			nlQP(tab, 100+i, ibQPTypeRC, state, "ib_ipoib", 0, 0)
		}
	})
	return nlKernel(t, map[uint16][]byte{nlCmdResQPGet: qps}, nil)
}

// kernel510 answers nldev as Linux 5.10 does on mlx5_0, which has no
// RES_CTX_GET (EINVAL): the GSI QP, QP 17 of the live pid 100, and QP 18 in
// ERR whose creating thread is gone, in a PD whose row names no pid.
func kernel510(t *testing.T) *rdmanl.Conn {
	t.Helper()
	qps := nlTable(t, nlResQP, func(tab *netlink.AttributeEncoder) {
		nlQP(tab, 1, ibQPTypeGSI, ibQPStateRTS, "ib_core", 0, 0)
		nlQP(tab, 17, ibQPTypeRC, ibQPStateRTS, "", 100, 1)
		nlQP(tab, 18, ibQPTypeRC, ibQPStateError, "", 0, 2)
	})
	pds := nlTable(t, nlResPD, func(tab *netlink.AttributeEncoder) {
		for _, pdn := range []uint32{1, 2} {
			tab.Nested(nlResPDEntry, func(e *netlink.AttributeEncoder) error {
				e.Uint32(nlResPDN, pdn)
				e.Uint32(nlResCtxN, pdn)
				return nil
			})
		}
	})
	return nlKernel(t, map[uint16][]byte{nlCmdResQPGet: qps, nlCmdResPDGet: pds}, map[uint16]syscall.Errno{nlCmdResCtxGet: syscall.EINVAL})
}

// TestKernelWithoutContextTable: on a kernel without RES_CTX_GET (5.10)
// the host view degrades instead of failing. Every sample of one Conn
// succeeds; QP 18, whose owner only the context row could name, is
// neither orphaned nor stuck, and the report says why; the exporter's
// scrapes all succeed.
func TestKernelWithoutContextTable(t *testing.T) {
	proc := t.TempDir()
	if err := os.Mkdir(filepath.Join(proc, "100"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(proc, "100", "status"), "Name:\tapp\nState:\tS (sleeping)\nTgid:\t100\nPid:\t100\n")
	writeFile(t, filepath.Join(proc, "100", "comm"), "app\n")
	opts := hostOptions{proc: proc, sys: proc, dev: proc, timeout: time.Second}
	h := newRealHost(kernel510(t), opts, nil)
	defer h.Close()
	samples, err := leaks.Watch(context.Background(), h, 20*time.Millisecond, 10*time.Millisecond, nil)
	if err != nil {
		t.Fatalf("sampling a 5.10 kernel: %v", err)
	}
	r := leaks.Analyze(samples, leaks.Options{})
	if len(r.Findings) != 0 {
		t.Errorf("findings %+v, want none: QP 18's owner is unknown, not gone", r.Findings)
	}
	if !slices.ContainsFunc(r.Notes, func(n string) bool { return strings.Contains(n, "mlx5_0: the kernel has no RES_CTX_GET") }) {
		t.Errorf("notes %q do not say the kernel has no RES_CTX_GET", r.Notes)
	}
	scraped := newRealHost(kernel510(t), opts, nil)
	defer scraped.Close()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewExporter(scraped, metrics.ExporterOptions{}))
	for i := range 3 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "qpdrain_scrape_success" && mf.GetMetric()[0].GetGauge().GetValue() != 1 {
				t.Errorf("scrape %d: qpdrain_scrape_success %v, want 1", i+1, mf.GetMetric()[0].GetGauge().GetValue())
			}
		}
	}
}

// TestKernelIPoIBFindings: kernel QPs, which rxe cannot have, from
// synthesized nldev replies through the real sampler: IPoIB-CM QPs in ERR
// are a kernel finding with the down/up remedy, and 123 of them are near
// ib_ipoib's non-SRQ connection limit.
func TestKernelIPoIBFindings(t *testing.T) {
	dir := t.TempDir()
	h := newRealHost(ipoibKernel(t), hostOptions{proc: dir, sys: dir, dev: dir, timeout: time.Second}, nil)
	defer h.Close()
	samples, err := leaks.Watch(context.Background(), h, 20*time.Millisecond, 10*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(samples[0].Devices[0].QPs); n != 125 {
		t.Fatalf("sample has %d QPs, want 125", n)
	}
	r := leaks.Analyze(samples, leaks.Options{})
	var got []string
	for _, f := range r.Findings {
		got = append(got, string(f.Reason)+"/"+f.KernName)
	}
	if !slices.Equal(got, []string{"near-limit/ib_ipoib", "kernel/ib_ipoib"}) {
		t.Fatalf("findings %v, want near-limit and kernel of ib_ipoib: %+v", got, r.Findings)
	}
	kern, near := r.Findings[1], r.Findings[0]
	if !slices.Equal(lqpns(kern.QPs), []uint32{100, 141, 182}) || !strings.Contains(kern.Remedy, "ipoib_cm_dev_stop") ||
		!strings.Contains(kern.Remedy, "ip link set dev IF down") {
		t.Errorf("kernel finding %+v", kern)
	}
	if !strings.Contains(near.Evidence, "up to 123 IPoIB-CM RC QPs") || !strings.Contains(near.Evidence, "max_nonsrq_conn_qp 128") {
		t.Errorf("near-limit finding %+v", near)
	}
}

// TestToSample: owners, zombies and each QP's own holders.
func TestToSample(t *testing.T) {
	rq := func(dev, lqpn uint32, state rdmanl.QPState) rdmanl.QP {
		return rdmanl.QP{Device: dev, Port: 1, LQPN: lqpn, Type: rdmanl.QPTypeRC, State: state}
	}
	app := []inventory.Holder{{PID: 10, Comm: "app", FDs: []int{3}}}
	child := []inventory.Holder{{PID: 20, Comm: "child", FDs: []int{4}}}
	either := []inventory.Holder{{PID: 20, Comm: "child"}, {PID: 30, Comm: "other"}}
	snap := &inventory.Snapshot{
		Devices: []inventory.Device{
			{Device: rdmanl.Device{Index: 0, Name: "rxe0"}, Holders: append(append([]inventory.Holder{}, app...), child...)},
			{Device: rdmanl.Device{Index: 1, Name: "rxe1"}, Holders: either},
		},
		QPs: []inventory.QP{
			{QP: rq(0, 17, rdmanl.QPStateRTS), Owner: &inventory.Owner{PID: 10, Comm: "app", Via: inventory.FromQP}, Holders: app, HoldersCertain: true},
			{QP: rq(0, 18, rdmanl.QPStateErr), CreatorGone: true, Holders: child, HoldersCertain: true},
			{QP: rq(0, 19, rdmanl.QPStateRTS), Owner: &inventory.Owner{PID: 40, Comm: "dying", Zombie: true, Via: inventory.FromQP}, CreatorGone: true, Holders: child, HoldersCertain: true},
			{QP: rdmanl.QP{Device: 0, Port: 1, LQPN: 1, Type: rdmanl.QPTypeGSI, State: rdmanl.QPStateRTS, KernName: "ib_core"},
				Owner: &inventory.Owner{Comm: "ib_core", Via: inventory.FromKernel}, HoldersCertain: true},
			{QP: rq(1, 21, rdmanl.QPStateRTS), CreatorGone: true, Holders: either},
		},
	}
	s := leaks.FromSnapshot(snap, time.Unix(1, 0))
	if len(s.Devices) != 2 || len(s.Devices[0].QPs) != 4 || len(s.Devices[1].QPs) != 1 {
		t.Fatalf("sample %+v", s)
	}
	q := s.Devices[0].QPs
	if q[0].Owner.PID != 10 || !slices.Equal(q[0].Holders, []leaks.Process{{PID: 10, Comm: "app"}}) || !q[0].HoldersCertain || q[0].Type != "RC" || q[0].State != "RTS" {
		t.Errorf("owned QP %+v", q[0])
	}
	if q[1].Owner.PID != 0 || !slices.Equal(q[1].Holders, []leaks.Process{{PID: 20, Comm: "child"}}) || !q[1].HoldersCertain || q[1].State != "ERR" {
		t.Errorf("QP without a creator %+v", q[1])
	}
	if q[2].Owner.PID != 0 || len(q[2].Holders) != 1 || q[2].Holders[0].PID != 20 {
		t.Errorf("a zombie's QP %+v: want no owner, the holder", q[2])
	}
	if !q[3].Kernel() || q[3].Owner.PID != 0 || q[3].Holders != nil {
		t.Errorf("kernel QP %+v", q[3])
	}
	if q := s.Devices[1].QPs[0]; len(q.Holders) != 2 || q.HoldersCertain {
		t.Errorf("rxe1 QP %+v: want the two candidates, uncertain", q)
	}
}

// lqpns is the sorted QP numbers of qps.
func lqpns(qps []leaks.QPRef) []uint32 {
	out := make([]uint32, len(qps))
	for i, q := range qps {
		out[i] = q.LQPN
	}
	slices.Sort(out)
	return out
}

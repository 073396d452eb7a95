package main

import (
	"context"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/mdlayher/netlink/nltest"

	"github.com/qpdrain/qpdrain/leaks"
	"github.com/qpdrain/qpdrain/rdmanl"
	"github.com/qpdrain/qpdrain/rdmanl/inventory"
)

// nldev numbers (include/uapi/rdma/rdma_netlink.h) the synthesized replies
// use.
const (
	nlClientNLDEV  = 5
	nlCmdGet       = 1
	nlCmdResQPGet  = 10
	nlDevIndex     = 1
	nlDevName      = 2
	nlPortIndex    = 3
	nlResQP        = 19
	nlResQPEntry   = 20
	nlResLQPN      = 21
	nlResType      = 26
	nlResState     = 27
	nlResKernName  = 29
	ibQPTypeGSI    = 1 // enum ib_qp_type
	ibQPTypeRC     = 2
	ibQPTypeUD     = 4
	ibQPStateRTS   = 3 // enum ib_qp_state
	ibQPStateError = 6
)

// ipoibKernel answers nldev as a kernel with IPoIB in connected mode on
// mlx5_0 would: the GSI QP, IPoIB's UD QP, 120 connected-mode RC QPs in
// RTS and three in ERR, all owned by ib_ipoib (kern_name, no pid).
func ipoibKernel(t *testing.T) *rdmanl.Conn {
	t.Helper()
	encode := func(fill func(ae *netlink.AttributeEncoder)) []byte {
		ae := netlink.NewAttributeEncoder()
		fill(ae)
		b, err := ae.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	qp := func(tab *netlink.AttributeEncoder, lqpn uint32, typ, state uint8, kern string) {
		tab.Nested(nlResQPEntry, func(e *netlink.AttributeEncoder) error {
			e.Uint32(nlPortIndex, 1)
			e.Uint32(nlResLQPN, lqpn)
			e.String(nlResKernName, kern)
			e.Uint8(nlResType, typ)
			e.Uint8(nlResState, state)
			return nil
		})
	}
	dev := encode(func(ae *netlink.AttributeEncoder) {
		ae.Uint32(nlDevIndex, 0)
		ae.String(nlDevName, "mlx5_0")
		ae.Uint32(nlPortIndex, 1)
	})
	qps := encode(func(ae *netlink.AttributeEncoder) {
		ae.Uint32(nlDevIndex, 0)
		ae.String(nlDevName, "mlx5_0")
		ae.Nested(nlResQP, func(tab *netlink.AttributeEncoder) error {
			qp(tab, 1, ibQPTypeGSI, ibQPStateRTS, "ib_core")
			qp(tab, 2, ibQPTypeUD, ibQPStateRTS, "ib_ipoib")
			for i := range uint32(123) {
				state := uint8(ibQPStateRTS)
				if i%41 == 0 {
					state = ibQPStateError
				}
				qp(tab, 100+i, ibQPTypeRC, state, "ib_ipoib")
			}
			return nil
		})
	})
	return rdmanl.NewConn(nltest.Dial(func(req []netlink.Message) ([]netlink.Message, error) {
		r := req[0]
		var body []byte
		switch uint16(r.Header.Type) {
		case nlClientNLDEV<<10 | nlCmdGet:
			body = dev
		case nlClientNLDEV<<10 | nlCmdResQPGet:
			body = qps
		default: // GET_CHARDEV: this fake has no uverbs char device
			r.Header.Flags = 0
			return nltest.Error(int(syscall.EOPNOTSUPP), []netlink.Message{r})
		}
		msgs := []netlink.Message{{Header: netlink.Header{Type: r.Header.Type, Sequence: r.Header.Sequence}, Data: body}}
		if r.Header.Flags&netlink.Dump == 0 {
			return msgs, nil
		}
		msgs = append(msgs, netlink.Message{Header: netlink.Header{Type: netlink.Done}, Data: make([]byte, 4)})
		return nltest.Multipart(msgs)
	}))
}

// TestKernelIPoIBFindings: kernel QPs, which rxe cannot have, from
// synthesized nldev replies through the real sampler: IPoIB-CM QPs in ERR
// are a kernel finding with the down/up remedy, and 123 of them are near
// ib_ipoib's non-SRQ connection limit.
func TestKernelIPoIBFindings(t *testing.T) {
	dir := t.TempDir()
	h := &realHost{conn: ipoibKernel(t), opts: hostOptions{proc: dir, sys: dir, dev: dir, timeout: time.Second}}
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

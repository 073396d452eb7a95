package rdmanl

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/mdlayher/netlink"
	"github.com/mdlayher/netlink/nltest"
)

// qpEntry builds one RES_QP_ENTRY from attribute setters.
func qpEntry(fill func(ae *netlink.AttributeEncoder)) func(ae *netlink.AttributeEncoder) error {
	return func(ae *netlink.AttributeEncoder) error {
		ae.Nested(attrResQPEntry, func(e *netlink.AttributeEncoder) error {
			fill(e)
			return nil
		})
		return nil
	}
}

// qpMessage builds one RES_QP_GET dump message with the given entries.
func qpMessage(t testing.TB, dev uint32, name string, entries ...func(ae *netlink.AttributeEncoder) error) []byte {
	t.Helper()
	ae := netlink.NewAttributeEncoder()
	ae.Uint32(attrDevIndex, dev)
	ae.String(attrDevName, name)
	ae.Nested(attrResQP, func(tab *netlink.AttributeEncoder) error {
		for _, e := range entries {
			if err := e(tab); err != nil {
				return err
			}
		}
		return nil
	})
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeQPs(t *testing.T) {
	b := qpMessage(t, 3, "mlx5_0",
		qpEntry(func(e *netlink.AttributeEncoder) {
			e.Uint32(attrPortIndex, 1)
			e.Uint32(attrResLQPN, 7)
			e.Uint32(attrResRQPN, 8)
			e.Uint32(attrResRQPSN, 100)
			e.Uint32(attrResSQPSN, 200)
			e.Uint8(attrResPathMigState, 2)
			e.Uint8(attrResType, uint8(QPTypeGSI))
			// mlx5 on 6.10+ sends the type twice: the last one counts.
			e.Uint8(attrResType, uint8(QPTypeRC))
			e.Uint8(attrResState, uint8(QPStateRTS))
			e.Uint32(attrResPID, 4242)
			e.Uint32(attrResPDN, 5)
			e.String(attrResSubtype, "DCI")
			// An attribute this package does not know is skipped.
			e.Uint64(200, 0xdead)
			e.Nested(52, func(d *netlink.AttributeEncoder) error { d.String(54, "driver detail"); return nil })
		}),
		qpEntry(func(e *netlink.AttributeEncoder) {
			e.Uint32(attrResLQPN, 1)
			e.Uint32(attrResSQPSN, 0)
			e.Uint8(attrResType, uint8(QPTypeGSI))
			e.Uint8(attrResState, uint8(QPStateReset))
			e.String(attrResKernName, "ib_core")
		}),
	)
	qps, err := appendQPs(nil, b)
	if err != nil {
		t.Fatal(err)
	}
	want := []QP{
		{Device: 3, DeviceName: "mlx5_0", Port: 1, LQPN: 7, RQPN: 8, RQPSN: 100, SQPSN: 200, PathMigState: 2,
			Type: QPTypeRC, State: QPStateRTS, PID: 4242, PDN: 5, Subtype: "DCI",
			Has: HasPort | HasRQPN | HasRQPSN | HasSQPSN | HasPathMigState | HasPID | HasPDN | HasSubtype},
		{Device: 3, DeviceName: "mlx5_0", LQPN: 1, Type: QPTypeGSI, State: QPStateReset, KernName: "ib_core", Has: HasSQPSN | HasKernName},
	}
	if len(qps) != len(want) {
		t.Fatalf("got %d QPs, want %d: %+v", len(qps), len(want), qps)
	}
	for i := range want {
		if qps[i] != want[i] {
			t.Errorf("QP %d:\n got  %+v\n want %+v", i, qps[i], want[i])
		}
	}
	if s := qps[0].PathMigState.String(); s != "ARMED" {
		t.Errorf("path-mig-state 2 = %q, want ARMED", s)
	}
}

func TestDecodeMalformed(t *testing.T) {
	good := qpMessage(t, 1, "rxe0", qpEntry(func(e *netlink.AttributeEncoder) { e.Uint32(attrResLQPN, 9) }))
	for name, b := range map[string][]byte{
		"truncated":       good[:len(good)-3],
		"short attribute": {3, 0, 1, 0},
		"lqpn as u8":      qpMessage(t, 1, "rxe0", qpEntry(func(e *netlink.AttributeEncoder) { e.Uint8(attrResLQPN, 9) })),
		// Longer than its type is as wrong as shorter: not read short.
		"lqpn as u64": qpMessage(t, 1, "rxe0", qpEntry(func(e *netlink.AttributeEncoder) { e.Uint64(attrResLQPN, 9) })),
		"type as u32": qpMessage(t, 1, "rxe0", qpEntry(func(e *netlink.AttributeEncoder) { e.Uint32(attrResType, uint32(QPTypeRC)) })),
	} {
		if qps, err := appendQPs(nil, b); !errors.Is(err, ErrMalformed) || len(qps) != 0 {
			t.Errorf("%s: %d QPs, err %v, want none and ErrMalformed", name, len(qps), err)
		}
	}
}

// Every row of a message keeps its own kern_name: a user QP after a
// kernel one has none, and two modules' names of one length stay apart.
func TestDecodeKernNamePerRow(t *testing.T) {
	kern := func(lqpn uint32, name string) func(*netlink.AttributeEncoder) error {
		return qpEntry(func(e *netlink.AttributeEncoder) {
			e.Uint32(attrResLQPN, lqpn)
			e.String(attrResKernName, name)
		})
	}
	b := qpMessage(t, 1, "mlx5_0", kern(1, "ib_core"),
		qpEntry(func(e *netlink.AttributeEncoder) {
			e.Uint32(attrResLQPN, 17)
			e.Uint32(attrResPID, 5)
		}),
		kern(2, "ib_ipoib"), kern(3, "rds_rdma"), kern(4, "rds_rdma"))
	qps, err := appendQPs(nil, b)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"ib_core", "", "ib_ipoib", "rds_rdma", "rds_rdma"}
	if len(qps) != len(want) {
		t.Fatalf("%d QPs, want %d", len(qps), len(want))
	}
	for i, w := range want {
		if qps[i].KernName != w || (qps[i].Has&HasKernName != 0) != (w != "") {
			t.Errorf("QP %d: kern_name %q (has %v), want %q", qps[i].LQPN, qps[i].KernName, qps[i].Has&HasKernName != 0, w)
		}
	}
}

// fakeKernel answers nldev requests with canned replies, as the kernel
// would: each dump as one multipart reply ending in NLMSG_DONE, a command
// it has no reply for with EOPNOTSUPP (an NLMSG_ERROR).
type fakeKernel map[Command][][]byte

func (f fakeKernel) dial(t testing.TB) *Conn { return f.dialHook(t, nil) }

// dialHook is dial with hook, when not nil, called first on every request:
// a non-zero errno it returns is the kernel's answer instead.
func (f fakeKernel) dialHook(t testing.TB, hook func(Command) syscall.Errno) *Conn {
	t.Helper()
	return NewConn(nltest.Dial(func(req []netlink.Message) ([]netlink.Message, error) {
		if len(req) != 1 {
			t.Fatalf("%d requests in one send", len(req))
		}
		cmd := Command(uint16(req[0].Header.Type) & 0x3ff)
		if uint16(req[0].Header.Type)>>10 != nldevClient {
			t.Fatalf("request type %#x is not nldev", req[0].Header.Type)
		}
		var errno syscall.Errno
		if hook != nil {
			errno = hook(cmd)
		}
		bodies, ok := f[cmd]
		if !ok && errno == 0 {
			errno = syscall.EOPNOTSUPP
		}
		if errno != 0 {
			// nltest.Error keeps the request's flags, and NLM_F_DUMP's bits
			// read as NLM_F_ACK_TLVS in a reply: build the error plainly.
			r := req[0]
			r.Header.Flags = 0
			return nltest.Error(int(errno), []netlink.Message{r})
		}
		msgs := make([]netlink.Message, 0, len(bodies)+1)
		for _, b := range bodies {
			msgs = append(msgs, netlink.Message{Header: netlink.Header{Type: req[0].Header.Type, Sequence: req[0].Header.Sequence}, Data: b})
		}
		if req[0].Header.Flags&netlink.Dump == 0 {
			return msgs, nil
		}
		msgs = append(msgs, netlink.Message{Header: netlink.Header{Type: netlink.Done}, Data: make([]byte, 4)})
		return nltest.Multipart(msgs)
	}))
}

func TestConnErrorsNameCommandAndDevice(t *testing.T) {
	c := fakeKernel{}.dial(t)
	defer c.Close()
	_, err := c.QPs(context.Background(), Device{Index: 1, Name: "rxe0"})
	var e *Error
	if !errors.As(err, &e) || e.Command != CmdResQPGet || e.Device != "rxe0" || !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Fatalf("err %v, want an *Error of RES_QP_GET on rxe0 wrapping EOPNOTSUPP", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "dumping QPs of rxe0 (RES_QP_GET)") {
		t.Errorf("message %q does not name the action, device and command", msg)
	}
}

func TestConnMultipartDump(t *testing.T) {
	var bodies [][]byte
	for i := range 5 {
		n := uint32(10 + 2*i)
		bodies = append(bodies, qpMessage(t, 1, "rxe0",
			qpEntry(func(e *netlink.AttributeEncoder) { e.Uint32(attrResLQPN, n) }),
			qpEntry(func(e *netlink.AttributeEncoder) { e.Uint32(attrResLQPN, n+1) })))
	}
	c := fakeKernel{CmdResQPGet: bodies}.dial(t)
	defer c.Close()
	qps, err := c.QPs(context.Background(), Device{Index: 1, Name: "rxe0"})
	if err != nil {
		t.Fatal(err)
	}
	if len(qps) != 10 || qps[0].LQPN != 10 || qps[9].LQPN != 19 {
		t.Fatalf("got %+v, want QPs 10..19 in order", qps)
	}
}

func TestConnContext(t *testing.T) {
	c := fakeKernel{CmdGet: {nil}}.dial(t)
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Devices(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Devices with a canceled context: %v, want context.Canceled", err)
	}
}

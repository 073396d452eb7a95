// Package devtest holds the device tests of qpdrain, written once against
// the ibv API, and the helpers other packages' tests use to run on the same
// device: Open picks it, the rest builds connected RC QPs on it.
//
// # Device selection
//
// The environment variable QPDRAIN_TEST_DEVICE names the device. Unset or
// "soft", the tests run on a fresh soft device (package soft);
// "soft:adversarial", on soft devices with adversarial schedules (Schedule);
// "soft:iwarp", on the soft device with siw's rules (DeviceIWARP), its
// pairs connected through the soft RDMA CM. QPDRAIN_TEST_CM=1 connects the
// pairs through the RDMA CM on any device (Pair, Connector).
// Set to a libibverbs device name ("rxe0"), they run on that device, and a
// test that cannot open it fails: a missing device must never turn a suite
// green.
//
// # Exploration
//
// Explore runs a test body under the orderly schedule and many
// adversarial seeds of the soft device; QPDRAIN_SOFT_SEEDS sets how many,
// QPDRAIN_SOFT_SEED replays one, and a failing seed prints the command
// that replays it.
package devtest

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/rcsetup"
	"github.com/qpdrain/qpdrain/soft"

	// A libibverbs device name reaches a real device through ibv.Open.
	_ "github.com/qpdrain/qpdrain/libibverbs"
)

// EnvDevice is the environment variable that selects the test device.
const EnvDevice = "QPDRAIN_TEST_DEVICE"

// Provider names the implementation behind a test device, for the tests
// that expect a documented difference (docs/PROVIDERS.md).
type Provider string

// Providers the tests know.
const (
	ProviderSoft  Provider = "soft"
	ProviderRXE   Provider = "rxe"
	ProviderOther Provider = "other"
)

// Timeout bounds every wait of a device test. rxe under qemu without KVM is
// slow, and a completion that is late by seconds is still a completion.
const Timeout = 20 * time.Second

// DeviceName is the device the tests run on: QPDRAIN_TEST_DEVICE, or
// "soft" when it is unset.
func DeviceName() string {
	if name := os.Getenv(EnvDevice); name != "" {
		return name
	}
	return string(ProviderSoft)
}

// ProviderOf says which implementation DeviceName is.
func ProviderOf(name string) Provider {
	switch {
	case name == string(ProviderSoft), name == DeviceAdversarial, name == DeviceIWARP:
		return ProviderSoft
	case strings.HasPrefix(name, "rxe"):
		return ProviderRXE
	}
	return ProviderOther
}

// CurrentProvider is ProviderOf(DeviceName()).
func CurrentProvider() Provider { return ProviderOf(DeviceName()) }

// Open opens the test device and closes it when the test ends. The close is
// the test's leak check: it fails with ErrBusy, and so fails the test, if
// any object created on the device is still open then. Register the
// cleanups of the objects (Close does it) after calling Open, so they run
// first.
func Open(t testing.TB) ibv.Context {
	t.Helper()
	name := DeviceName()
	cfg := soft.Config{Schedule: Schedule(t)}
	if name == DeviceIWARP {
		cfg.Transport = ibv.TransportIWARP
	}
	if throughCM(name) {
		return openCM(t, name, cfg)
	}
	var (
		ctx ibv.Context
		err error
	)
	if ProviderOf(name) == ProviderSoft {
		ctx, err = soft.Open(cfg)
	} else {
		ctx, err = ibv.Open(name)
	}
	if err != nil {
		t.Fatalf("opening test device %s (%s=%q): %v", name, EnvDevice, os.Getenv(EnvDevice), err)
	}
	Close(t, ctx)
	return ctx
}

// Close closes c when the test ends and fails the test if that fails.
func Close(t testing.TB, c io.Closer) {
	t.Helper()
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("closing %T: %v", c, err)
		}
	})
}

// Buffer allocates size bytes outside the Go heap, registers them with pd
// for access and releases both when the test ends.
func Buffer(t testing.TB, pd ibv.PD, size int, access ibv.AccessFlags) ibv.MR {
	t.Helper()
	buf, err := ibv.AllocBuffer(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ibv.FreeBuffer(buf); err != nil {
			t.Error(err)
		}
	})
	mr, err := pd.RegMR(buf, access)
	if err != nil {
		t.Fatalf("registering %d bytes: %v", size, err)
	}
	Close(t, mr)
	return mr
}

// AllAccess is the access the tests give their MRs and QPs.
const AllAccess = rcsetup.AllAccess

// RCConfig sizes the QPs NewRC creates.
type RCConfig struct {
	// SRQ, when set, is the SRQ the QP receives from.
	SRQ ibv.SRQ
	// SendCQ and RecvCQ default to one new CQ per QP used for both.
	SendCQ, RecvCQ ibv.CQ
	// Cap defaults to 16 WRs and 2 SGEs each way, no inline data.
	Cap ibv.QPCap
}

// NewPD allocates a PD on ctx, closed when the test ends.
func NewPD(t testing.TB, ctx ibv.Context) ibv.PD {
	t.Helper()
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatalf("allocating PD: %v", err)
	}
	Close(t, pd)
	return pd
}

// NewSRQ creates an SRQ on pd, closed when the test ends.
func NewSRQ(t testing.TB, pd ibv.PD, attr ibv.SRQAttr) ibv.SRQ {
	t.Helper()
	srq, err := pd.CreateSRQ(attr)
	if err != nil {
		t.Fatalf("creating SRQ of %d WRs: %v", attr.MaxWR, err)
	}
	Close(t, srq)
	return srq
}

// NewCQ creates a CQ of cqe entries, closed when the test ends.
func NewCQ(t testing.TB, ctx ibv.Context, cqe int) ibv.CQ {
	t.Helper()
	cq, err := ctx.CreateCQ(cqe, nil)
	if err != nil {
		t.Fatalf("creating CQ: %v", err)
	}
	Close(t, cq)
	return cq
}

// rcInit is the init attributes of an RC QP sized by cfg, its defaults
// applied (a new CQ, closed when the test ends).
func rcInit(t testing.TB, pd ibv.PD, cfg RCConfig) ibv.QPInitAttr {
	t.Helper()
	if cfg.SendCQ == nil {
		cfg.SendCQ = NewCQ(t, pd.Context(), 64)
	}
	if cfg.RecvCQ == nil {
		cfg.RecvCQ = cfg.SendCQ
	}
	if cfg.Cap == (ibv.QPCap{}) {
		cfg.Cap = ibv.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 2, MaxRecvSGE: 2}
	}
	return ibv.QPInitAttr{SendCQ: cfg.SendCQ, RecvCQ: cfg.RecvCQ, SRQ: cfg.SRQ, Cap: cfg.Cap, Type: ibv.QPTRC}
}

// NewRC creates an RC QP in RESET, closed when the test ends.
func NewRC(t testing.TB, pd ibv.PD, cfg RCConfig) ibv.QP {
	t.Helper()
	qp, err := pd.CreateQP(rcInit(t, pd, cfg))
	if err != nil {
		t.Fatalf("creating RC QP: %v", err)
	}
	Close(t, qp)
	return qp
}

// Port is the port the tests use.
const Port = 1

// Route returns the route from port Port of ctx to itself
// (rcsetup.Loopback), failing the test if there is none.
func Route(t testing.TB, ctx ibv.Context) rcsetup.Route {
	t.Helper()
	r, err := rcsetup.Loopback(ctx, Port)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Address returns the address vector that reaches port Port of ctx from
// itself. RoCE ports need a GRH with a GID from the GID table; RoCE v2 is
// preferred, as rc_pingpong's users pick it. InfiniBand ports use the LID.
func Address(t testing.TB, ctx ibv.Context) ibv.AHAttr {
	t.Helper()
	return Route(t, ctx).AH
}

// Connect moves a and b, two RC QPs of one device in RESET, to RTS connected
// to each other by hand; on a device that connects through the RDMA CM it
// skips the test (ByHand): create such pairs with Pair.
func Connect(t testing.TB, ctx ibv.Context, a, b ibv.QP) {
	t.Helper()
	ByHand(t, ctx, "connects QPs it created itself by hand")
	if err := Route(t, ctx).Connect(a, b); err != nil {
		t.Fatal(err)
	}
}

// ToError moves qp to ERROR.
func ToError(t testing.TB, qp ibv.QP) {
	t.Helper()
	if err := qp.Modify(ibv.QPAttr{State: ibv.QPSErr}, ibv.QPAttrState); err != nil {
		t.Fatalf("moving QP %d to ERR: %v", qp.Num(), err)
	}
}

// State returns qp's current state. On a real iWARP device whose
// ibv_query_qp reports no state it skips the test, saying why.
func State(t testing.TB, qp ibv.QP) ibv.QPState {
	t.Helper()
	attr, _, err := qp.Query(ibv.QPAttrState)
	if err != nil {
		t.Fatalf("querying QP %d: %v", qp.Num(), err)
	}
	// siw reports its IDLE as INIT: RESET means siw_query_qp filled in
	// no state, as before "RDMA/siw: Set qp_state in siw_query_qp"
	// (Guoqing Jiang, December 2023; Debian's 6.1 lacks it).
	if attr.State == ibv.QPSReset && CurrentProvider() != ProviderSoft && IWARP() {
		t.Skipf("%s reports no QP state (ibv_query_qp reads RESET): its siw_query_qp lacks \"RDMA/siw: Set qp_state in siw_query_qp\"", DeviceName())
	}
	return attr.State
}

// Poll polls cq until it has returned n completions, and fails the test if
// they do not come within Timeout. It takes no more than n; a test that
// must see no further completion follows it with PollNone.
func Poll(t testing.TB, cq ibv.CQ, n int) []ibv.WC {
	t.Helper()
	got := make([]ibv.WC, 0, n)
	batch := make([]ibv.WC, 16)
	deadline := time.Now().Add(Timeout)
	for len(got) < n {
		k, err := cq.Poll(batch[:min(len(batch), n-len(got))])
		if err != nil {
			t.Fatalf("polling CQ: %v", err)
		}
		got = append(got, batch[:k]...)
		if k == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("polled %d of %d completions in %v: %v", len(got), n, Timeout, got)
			}
			time.Sleep(time.Millisecond)
		}
	}
	return got
}

// PollNone checks that cq stays empty for d.
func PollNone(t testing.TB, cq ibv.CQ, d time.Duration) {
	t.Helper()
	batch := make([]ibv.WC, 4)
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(time.Millisecond) {
		k, err := cq.Poll(batch)
		if err != nil {
			t.Fatalf("polling CQ: %v", err)
		}
		if k > 0 {
			t.Fatalf("unexpected completions: %v", batch[:k])
		}
	}
}

// WaitEvent returns the next async event of ctx, failing the test if none
// comes within d.
func WaitEvent(t testing.TB, ctx ibv.Context, d time.Duration) ibv.AsyncEvent {
	t.Helper()
	e, err := nextEvent(ctx, d)
	if err != nil {
		t.Fatalf("waiting %v for an async event: %v", d, err)
	}
	return e
}

// NoEvent checks that ctx raises no async event within d.
func NoEvent(t testing.TB, ctx ibv.Context, d time.Duration) {
	t.Helper()
	e, err := nextEvent(ctx, d)
	if err == nil {
		t.Fatalf("unexpected async event %v", e)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting for no async event: %v", err)
	}
}

func nextEvent(ctx ibv.Context, d time.Duration) (ibv.AsyncEvent, error) {
	c, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return ctx.NextAsyncEvent(c)
}

package devtest

import (
	"net/netip"
	"os"
	"sync"
	"testing"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/librdmacm"
	"github.com/qpdrain/qpdrain/rcsetup"
	"github.com/qpdrain/qpdrain/soft"
	"github.com/qpdrain/qpdrain/softcm"
)

// DeviceIWARP is the QPDRAIN_TEST_DEVICE value that runs the tests on the
// soft device with siw's rules (soft.Config.Transport iWARP), its QPs
// connected through the soft RDMA CM (package softcm).
const DeviceIWARP = "soft:iwarp"

// EnvCM, set to "1", connects the tests' QP pairs through the RDMA CM on
// a device that connects them by hand otherwise; an iWARP device always
// connects through it.
const EnvCM = "QPDRAIN_TEST_CM"

// EnvAddr names the IP address of the test device's netdev, which a real
// test device connected through the RDMA CM needs (the rxe VM stage sets
// it).
const EnvAddr = "QPDRAIN_TEST_ADDR"

// softAddr is the soft device's address on its soft RDMA CM network
// (TEST-NET-1, RFC 5737).
var softAddr = netip.MustParseAddr("192.0.2.1")

// connectors are the CM connectors Open made, by the device they are on.
var connectors sync.Map // ibv.Context -> *rcsetup.CM

// IWARP reports whether the test device is iWARP: DeviceIWARP, or a
// device libibverbs lists with IBV_TRANSPORT_IWARP.
func IWARP() bool {
	name := DeviceName()
	if ProviderOf(name) == ProviderSoft {
		return name == DeviceIWARP
	}
	infos, err := ibv.Devices()
	if err != nil {
		return false // Open reports the device missing
	}
	for _, d := range infos {
		if d.Name == name {
			return d.Transport == ibv.TransportIWARP
		}
	}
	return false
}

// throughCM reports whether the tests' pairs on the device name (the
// test device) connect through the RDMA CM: EnvCM, or an iWARP device.
func throughCM(name string) bool { return os.Getenv(EnvCM) == "1" || IWARP() }

// openCM opens the test device with a CM connector on it: the soft device
// on a soft RDMA CM network, or librdmacm's context of a real device on
// the address EnvAddr names. The connector closes after every object on
// the device (with librdmacm it holds the device), the soft device last.
func openCM(t testing.TB, name string, cfg soft.Config) ibv.Context {
	t.Helper()
	var c *rcsetup.CM
	if ProviderOf(name) == ProviderSoft {
		dev, err := soft.Open(cfg)
		if err != nil {
			t.Fatalf("opening test device %s: %v", name, err)
		}
		Close(t, dev)
		n := softcm.NewNetwork()
		if err := n.Attach(dev, softAddr); err != nil {
			t.Fatal(err)
		}
		if c, err = rcsetup.ListenCM(n, softAddr); err != nil {
			t.Fatal(err)
		}
	} else {
		addr, err := netip.ParseAddr(os.Getenv(EnvAddr))
		if err != nil {
			t.Fatalf("%s=%q: %s connects through the RDMA CM, which needs the address of its netdev: %v", EnvAddr, os.Getenv(EnvAddr), name, err)
		}
		m, err := librdmacm.Open()
		if err != nil {
			t.Fatalf("opening the RDMA CM for %s: %v", name, err)
		}
		if c, err = rcsetup.ListenCM(m, addr); err != nil {
			t.Fatal(err)
		}
		if got := c.Context().Name(); got != name {
			t.Fatalf("the RDMA CM binds %s to %s, not %s", addr, got, name)
		}
	}
	Close(t, c)
	connectors.Store(c.Context(), c)
	t.Cleanup(func() { connectors.Delete(c.Context()) })
	return c.Context()
}

// Connector returns what connects RC QP pairs on ctx, a device from Open:
// the RDMA CM when the test device connects through it (an iWARP device,
// DeviceIWARP, EnvCM), else the loopback route of port Port.
func Connector(t testing.TB, ctx ibv.Context) rcsetup.Connector {
	t.Helper()
	if c, ok := connectors.Load(ctx); ok {
		return c.(*rcsetup.CM)
	}
	return Route(t, ctx)
}

// Pair creates two RC QPs on pd sized by a and b (NewRC's defaults) and
// connects them to each other (RTS) the way the test device connects
// (Connector), closed when the test ends.
func Pair(t testing.TB, pd ibv.PD, a, b RCConfig) (qa, qb ibv.QP) {
	t.Helper()
	p, err := Connector(t, pd.Context()).Pair(t.Context(), pd, rcInit(t, pd, a), rcInit(t, pd, b), rcsetup.DefaultRetry)
	if err != nil {
		t.Fatal(err)
	}
	Close(t, p)
	return p.A, p.B
}

// ByHand skips the test when the test device connects QPs through the
// RDMA CM: why names what the test does by hand (a QP taken through
// INIT and RTR itself, connected again after RESET, ...).
func ByHand(t testing.TB, ctx ibv.Context, why string) {
	t.Helper()
	if _, ok := connectors.Load(ctx); ok {
		t.Skipf("%s connects QPs through the RDMA CM; this test %s", DeviceName(), why)
	}
}

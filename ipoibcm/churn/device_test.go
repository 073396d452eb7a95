package churn

import (
	"context"
	"encoding/json"
	"os/exec"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/ipoibcm"
	"github.com/qpdrain/qpdrain/soft"
)

// deviceQPs counts the QPs of dev as the host sees them (`rdma resource
// show qp`, iproute2), or returns false when the device is not a kernel
// device or the tool is missing.
func deviceQPs(t *testing.T, dev ibv.Context) (int, bool) {
	t.Helper()
	if devtest.CurrentProvider() == devtest.ProviderSoft {
		return 0, false
	}
	path, err := exec.LookPath("rdma")
	if err != nil {
		t.Logf("no rdma tool (%v): the QP count is the manager's own", err)
		return 0, false
	}
	out, err := exec.Command(path, "-j", "resource", "show", "qp").Output()
	if err != nil {
		t.Fatalf("rdma resource show qp: %v", err)
	}
	var qps []struct {
		IfName string `json:"ifname"`
	}
	if err := json.Unmarshal(out, &qps); err != nil {
		t.Fatalf("parsing rdma resource show qp: %v\n%s", err, out)
	}
	n := 0
	for _, q := range qps {
		if q.IfName == dev.Name() {
			n++
		}
	}
	return n, true
}

// A churn of more than 1,000 connection events with real QPs on the test
// device (peers in loopback): nothing leaks, nothing is destroyed early,
// and the device's QP count is back where it started. On a real device the
// schedule runs on the real clock with timers of milliseconds; on the soft
// device it runs under every schedule devtest.Explore tries.
func TestChurnOnDevice(t *testing.T) {
	for _, tc := range []struct {
		name   string
		noSRQ  bool
		policy ipoibcm.Policy
	}{
		{"srq-bounded", false, ipoibcm.Bounded},
		{"nonsrq-kernel", true, ipoibcm.Kernel},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if devtest.IWARP() {
				// ipoibcm's own tests skip so too (skipIWARP).
				t.Skipf("%s is iWARP: IPoIB-CM (RFC 4755) connects its QPs by hand after the IB CM's REQ/REP (ipoibcm.Manager.Accept), and an iWARP QP reaches RTS only through iw_cm (siw_qp_nextstate_from_idle in drivers/infiniband/sw/siw/siw_qp.c)", devtest.DeviceName())
			}
			devtest.Explore(t, func(t *testing.T) {
				dev := devtest.Open(t)
				before, counted := deviceQPs(t, dev)
				real := devtest.CurrentProvider() != devtest.ProviderSoft
				mc := ipoibcm.Config{Policy: tc.policy, NoSRQ: tc.noSRQ, RecvQueueSize: 8,
					UpdateTime: 20 * time.Millisecond, Timeout: 50 * time.Millisecond, Delay: 75 * time.Millisecond}
				mc.Drain.LastWQETimeout, mc.Drain.DrainTimeout = time.Second, time.Second
				cfg := Config{Seed: 3, Events: 1700, Device: dev, Manager: mc, RealTime: real,
					ConnectRate: 500, SendRate: 50, Lifetime: 20 * time.Millisecond, VanishFraction: 0.25, Samples: 10}
				if d, ok := dev.(*soft.Device); ok {
					cfg.DeviceClock = d.Fabric()
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				start := time.Now()
				res, err := Run(ctx, cfg)
				if err != nil {
					t.Fatal(err)
				}
				e := res.Events
				conn := e.Connects + e.Disconnects + e.Vanishes
				t.Logf("%s: %d events (%d connection events, %d sends), %d accepted, peak %d QPs, %d reaped, stop forced %d, in %v",
					dev.Name(), e.Total(), conn, e.Sends, res.Accepted, res.PeakQPs, res.Reaped, res.StopForced, time.Since(start).Round(time.Millisecond))
				if conn < 1000 {
					t.Errorf("%d connection events, want at least 1000", conn)
				}
				if res.Accepted == 0 {
					// Every Accept rejected (siw0: none can reach RTS by
					// hand) would make the checks below vacuous.
					t.Errorf("no connection accepted (%d rejected)", res.RejectedNoQP+res.RejectedOther)
				}
				// Without an SRQ a connection is reaped when all its receives
				// came back flushed, and a receive reposted for a success
				// polled after the move to ERROR is a receive posted in
				// ERROR, as in ipoib_cm_handle_rx_wc: rxe never flushes
				// one (6.1) or only after a later post (6.12; flushcheck's
				// recv-in-error, docs/PROVIDERS.md), so such a connection
				// is freed only by device stop. Seen once in three runs on
				// 6.12. Nothing else may go wrong.
				forcedOK := 0
				if real && tc.noSRQ {
					forcedOK = res.StopForced
					if forcedOK > 0 {
						t.Logf("%d connection(s) freed only by device stop: a receive posted in ERROR was never flushed", forcedOK)
					}
				}
				if res.Leaked != forcedOK || res.HungDrains != 0 || res.LateWCs != 0 || res.StopForced != forcedOK {
					t.Errorf("leaked %d, hung %d, false safe %d, forced at stop %d: want none", res.Leaked, res.HungDrains, res.LateWCs, res.StopForced)
				}
				if res.Reaped+forcedOK != res.Accepted {
					t.Errorf("%d reaped (and %d forced at stop) of %d accepted", res.Reaped, forcedOK, res.Accepted)
				}
				if after, ok := deviceQPs(t, dev); counted && ok && after != before {
					t.Errorf("device QPs %d after the churn, %d before", after, before)
				}
			})
		})
	}
}

package cmtest

import (
	"context"
	"runtime"
	"sync"
	"testing"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/rcsetup"
)

// signalPairs is how many pairs TestConnectUnderSignals connects: without
// the signals blocked, siw0 on Linux 6.12 lost its listener about once in
// 100 (docs/PROVIDERS.md).
const signalPairs = 200

// TestConnectUnderSignals: connects through the CM succeed while the Go
// runtime signals its threads, as it does to preempt goroutines during a
// garbage collection (SIGURG). On iWARP the kernel's driver may connect
// its TCP socket inside rdma_connect (siw_connect); a signal there ended
// that wait, the socket just connected was closed and the call made again,
// and siw's listener did not survive the connection opened and closed at
// once: the next connect was refused, or failed with EADDRNOTAVAIL on the
// same ports, and the listener's destroy warned in the kernel
// (docs/PROVIDERS.md). librdmacm's Connect blocks the thread's signals
// for the call.
func TestConnectUnderSignals(t *testing.T) {
	m, addr := Open(t)
	c, err := rcsetup.ListenCM(m, addr)
	if err != nil {
		t.Fatal(err)
	}
	devtest.Close(t, c) // last: after the objects on its device
	dev := c.Context()
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	devtest.Close(t, pd)
	cq, err := dev.CreateCQ(16, nil)
	if err != nil {
		t.Fatal(err)
	}
	devtest.Close(t, cq)
	attr := ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: ibv.QPTRC,
		Cap: ibv.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					runtime.GC()
				}
			}
		})
	}
	defer wg.Wait()
	defer close(stop)
	for i := range signalPairs {
		ctx, cancel := context.WithTimeout(context.Background(), devtest.Timeout)
		p, err := c.Pair(ctx, pd, attr, attr, rcsetup.DefaultRetry)
		cancel()
		if err != nil {
			t.Fatalf("pair %d of %d, collections running: %v", i+1, signalPairs, err)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

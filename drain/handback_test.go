package drain_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/soft"
)

// The tests in this file are about the QPs a reaper hands back to its
// caller (failed, released by DestroyWhenEmpty, returned by Shutdown): which
// are handed back, and what their drain WRs may still take of the CQ.

// Shutdown racing Add: every QP that Add took and whose drain did not end
// Safe is in the list Shutdown returns, and Add refuses the others with
// ErrShutdown. The first QP waits for a receive that never comes back, so
// Shutdown waits for its ctx while QPs are still being added, each drained
// at once or failed by the shutdown. The reaper before took QPs while
// Shutdown waited for the pending drains, failed them with ErrShutdown and
// left them out.
func TestShutdownRacingAdd(t *testing.T) {
	r := quirkRig(t, soft.Quirks{})
	qps := r.pairs(16, false)
	r.postRecvs(qps[0], 1)
	rp := drain.NewReaper(r.cq, drain.Options{DrainTimeout: devtest.Timeout, Queue: queueOf})
	startCaller(t, rp, r.cq, r.dev)
	added := make(chan *drain.Handle, len(qps))
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(added)
		for i, qp := range qps {
			o := counted
			if i == 0 {
				o = drain.AddOptions{CountRecvs: true, Recvs: 2}
			}
			h, err := rp.Add(qp, o)
			switch {
			case errors.Is(err, drain.ErrShutdown):
			case err != nil:
				t.Errorf("Add racing Shutdown: %v, want ErrShutdown", err)
			default:
				added <- h
			}
			time.Sleep(100 * time.Microsecond)
		}
	})
	hs := []*drain.Handle{<-added}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	back := rp.Shutdown(ctx)
	wg.Wait()
	for h := range added {
		hs = append(hs, h)
	}
	listed := map[*drain.Handle]bool{}
	for _, h := range back {
		listed[h] = true
	}
	missing := 0
	for _, h := range hs {
		if rep := h.Report(); rep.Outcome != drain.Safe && !listed[h] {
			missing++
			t.Errorf("qpn %d ended %s (%v) and is not in Shutdown's list", rep.QPNum, rep.Outcome, rep.Err)
		}
	}
	if missing > 0 {
		t.Logf("%d of %d handles missing from Shutdown's list", missing, len(hs))
	}
}

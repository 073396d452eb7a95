package cmtest

import (
	"context"
	"slices"
	"testing"

	"github.com/qpdrain/qpdrain/cm"
	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
)

// TestDisconnectDrain: the QPs of a connection the CM tore down, as
// applications tear them down (the client's Disconnect; the server's own
// Disconnect in answer to DISCONNECTED), are drained by drain.DrainAll and
// proven safe, each side on its own CQ, then destroyed through their IDs
// (rdma_destroy_qp) and the IDs closed. Every completion the QP still
// owed comes back to the caller. Two ways to prove a queue:
//
//   - drain WRs: a receive drain WR behind an own receive queue (or Last
//     WQE Reached and a barrier drain WR, on an SRQ) and a send drain WR;
//   - counts, with no drain WR: each side counts the receives and sends
//     whose completions it has not polled (drain.AddOptions.CountRecvs,
//     CountSends) and states its QP the only one on its CQ (SoleQP: each
//     endpoint has its own CQ), since the CM moved the QP to ERROR and
//     its flushes are in the CQ before the drain begins. The client sent
//     the server two messages that nobody polled: its two sends and the
//     server's two receives completed, its own two receives are flushed.
//
// Counts prove the QPs where drain WRs cannot: siw on a user QP, and rxe
// before Linux 6.12 for receives.
func TestDisconnectDrain(t *testing.T) {
	for _, tc := range []struct {
		name   string
		srq    bool
		counts bool
	}{
		{"own receive queues, drain WRs", false, false},
		{"own receive queues, counts", false, true},
		// Only the server's QP is on an SRQ: both sides are on the test's
		// one device, whose async events one drain at a time reads.
		{"server on an SRQ", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.srq && devtest.RXELacks(devtest.RXELastWQEReached) {
				t.Skip("this rxe raises no Last WQE Reached: the SRQ side is never proven (docs/PROVIDERS.md)")
			}
			if tc.srq && devtest.IWARP() {
				t.Skip("iWARP raises no Last WQE Reached (siw: nowhere in drivers/infiniband/sw/siw): the SRQ side is never proven (docs/PROVIDERS.md)")
			}
			// The CM moved the client's QP to ERROR before anything could
			// count its flushes: without counts only drain WRs prove it.
			if !tc.counts && devtest.RXELacks(devtest.RXERecvInErrorFlushed) {
				t.Skip("this rxe never completes a receive posted in ERROR: an own receive queue moved to ERROR by the CM is proven only by counts (docs/PROVIDERS.md)")
			}
			if !tc.counts && !tc.srq && siw() {
				t.Skip("siw refuses a receive posted on a user QP in ERROR (siw_post_receive: -EINVAL, \"no kernel post_recv for user mapped rq\") and never completes a send posted there (siw_post_send flushes only the WRs it is handed, and a user QP's are in its mapped send queue, read only in RTS): only counts prove it (docs/PROVIDERS.md)")
			}
			newEndpoint := NewEndpoint
			if tc.srq {
				newEndpoint = NewSRQEndpoint
			}
			m, addr := Open(t)
			l, dst := listen(t, m, addr)
			client, cep, done := connect(t, m, dst, devtest.Timeout)
			srv := accept(t, l, 2, newEndpoint)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			postRecv(t, cep, 200)
			postRecv(t, cep, 201)
			var srvRecvs []uint64
			if !tc.srq {
				srvRecvs = []uint64{100, 101}
			}
			cw := want{recvs: []uint64{200, 201}, flushed: 2}
			sw := want{recvs: srvRecvs, flushed: len(srvRecvs)}
			if tc.counts {
				// Each completes, or is flushed if the CM's ERROR comes
				// first: one completion either way, which is what counts.
				send(t, cep, 1)
				send(t, cep, 2)
				cw.sends = []uint64{1, 2}
				cw.flushed, sw.flushed = -1, -1
			}

			if err := client.Disconnect(); err != nil {
				t.Fatal(err)
			}
			WaitEvent(t, srv.id, cm.EventDisconnected)
			if err := srv.id.Disconnect(); err != nil {
				t.Fatal(err)
			}
			WaitEvent(t, client, cm.EventDisconnected)

			// rdma_disconnect left the QPs in ERR on IB and RoCE, in SQD on
			// iWARP (librdmacm's ucma_modify_qp_sqd), where siw takes no
			// receive: the client moves its QP to ERR itself and says so;
			// the server lets the drain query its QP and move it. Both
			// are valid on either transport.
			if err := cep.QP.Modify(ibv.QPAttr{State: ibv.QPSErr}, ibv.QPAttrState); err != nil {
				t.Fatalf("moving the client's QP to ERR: %v", err)
			}
			cadd := drain.AddOptions{StateKnown: true, State: ibv.QPSErr}
			var sadd drain.AddOptions
			if tc.counts {
				cadd.CountRecvs, cadd.Recvs, cadd.CountSends, cadd.Sends, cadd.SoleQP = true, 2, true, 2, true
				sadd = drain.AddOptions{CountRecvs: true, Recvs: 2, CountSends: true, SoleQP: true}
			}
			drainDisconnected(t, "client", client, cep, cadd, cw)
			drainDisconnected(t, "server", srv.id, srv.ep, sadd, sw)
		})
	}
}

// siw reports whether the test device is siw: a real iWARP device (the
// soft device's iWARP rules do not refuse drain WRs).
func siw() bool { return devtest.IWARP() && devtest.CurrentProvider() != devtest.ProviderSoft }

// send posts a signaled zero-length SEND with ID id on e's QP.
func send(t *testing.T, e *Endpoint, id uint64) {
	t.Helper()
	if err := e.QP.PostSend([]ibv.SendWR{{ID: id, Opcode: ibv.WRSend, Flags: ibv.SendSignaled}}); err != nil {
		t.Fatal(err)
	}
}

// want is what a side's drain must hand the caller: the IDs of the
// receives and sends that complete, and how many of them flush (-1: any,
// each one either flushed or successful).
type want struct {
	recvs, sends []uint64
	flushed      int
}

// drainDisconnected drains the QP of e, the endpoint of id, alone on its
// CQ with drain.DrainAll, checks that it is safe with the proofs expected
// (counts when add counts, else drain WRs) and that exactly the
// completions w names came back to the caller, then destroys the QP and
// closes id.
func drainDisconnected(t *testing.T, who string, id cm.ID, e *Endpoint, add drain.AddOptions, w want) {
	t.Helper()
	var got []uint64
	flushed := 0
	f := drain.Feed{OnWC: func(wc ibv.WC) {
		switch {
		case wc.Status == ibv.WCWRFlushErr:
			flushed++
		case wc.Status != ibv.WCSuccess || w.flushed >= 0:
			t.Errorf("%s: completion %v, want only flushed ones", who, wc)
		}
		got = append(got, wc.ID)
	}}
	if e.SRQ != nil {
		f.Events = id.Context() // Last WQE Reached
	}
	// Headroom 2 lets the send drain WR go out behind the receive drain
	// WR, which rxe 6.12 flushes only once something runs its receive
	// task again (docs/PROVIDERS.md).
	o := drain.Options{Headroom: 2, LastWQETimeout: devtest.Timeout, DrainTimeout: devtest.Timeout,
		Queue: func(wc ibv.WC) report.Queue {
			if slices.Contains(w.recvs, wc.ID) {
				return report.QueueRecv
			}
			return report.QueueSend
		}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*devtest.Timeout)
	defer cancel()
	reps, err := drain.DrainAll(ctx, []ibv.QP{e.QP}, add, o, f)
	if err != nil {
		t.Fatalf("%s: draining QP %d after the disconnect: %v", who, e.QP.Num(), err)
	}
	rep := reps[0]
	t.Logf("%s: %s", who, rep)
	wantRecv, wantSend := report.ProofRecvDrainWR, report.ProofSendDrainWR
	switch {
	case e.SRQ != nil:
		wantRecv = report.ProofBarrier
	case add.CountRecvs:
		wantRecv = report.ProofRecvCount
	}
	switch {
	case add.CountSends && add.Sends == 0:
		wantSend = report.ProofNoSends
	case add.CountSends:
		wantSend = report.ProofSendCount
	}
	if rep.Outcome != report.Safe || rep.Recv.By != wantRecv || rep.Send.By != wantSend {
		t.Errorf("%s: %s, receive side by %s, send queue by %s; want safe by %s and %s",
			who, rep.Outcome, rep.Recv.By, rep.Send.By, wantRecv, wantSend)
	}
	if add.SoleQP && (!rep.Recv.Stated || wantSend == report.ProofSendCount && !rep.Send.Stated) {
		t.Errorf("%s: the counts are not recorded as resting on the caller's statement that the QP is the only one on its CQ", who)
	}
	slices.Sort(got)
	all := slices.Sorted(slices.Values(append(slices.Clone(w.recvs), w.sends...)))
	if !slices.Equal(got, all) || w.flushed >= 0 && flushed != w.flushed {
		t.Errorf("%s: the caller got completions %v (%d flushed), want %v (%d flushed)", who, got, flushed, all, w.flushed)
	}
	// The completions are the report's too: DrainAll adds the QP before
	// it polls, although the CM moved it to ERROR before the call.
	if n := rep.Flushed[report.QueueRecv]; n.Flushed+n.Other != len(w.recvs) {
		t.Errorf("%s: the report counts %d receives back, want %d", who, n.Flushed+n.Other, len(w.recvs))
	}

	if err := e.QP.Close(); err != nil {
		t.Fatalf("%s: destroying the drained QP: %v", who, err)
	}
	// An ID whose QP is open refuses to close (ErrBusy): this Close
	// succeeding says the QP's Close destroyed it through the ID.
	if err := id.Close(); err != nil {
		t.Errorf("%s: closing the ID after its QP: %v", who, err)
	}
}

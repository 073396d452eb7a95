package flushcheck

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/rcsetup"
	"github.com/qpdrain/qpdrain/soft"
	"github.com/qpdrain/qpdrain/softcm"
)

// openIWARP opens a soft device with siw's personality and a CM connector
// on it (softcm), closed when the test ends (the connector last).
func openIWARP(t *testing.T) (*soft.Device, *rcsetup.CM) {
	t.Helper()
	dev, err := soft.Open(soft.Config{Transport: ibv.TransportIWARP, Schedule: devtest.Schedule(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := dev.Close(); err != nil {
			t.Errorf("closing the device after the probes: %v", err)
		}
	})
	n := softcm.NewNetwork()
	addr := netip.MustParseAddr("192.0.2.1")
	if err := n.Attach(dev, addr); err != nil {
		t.Fatal(err)
	}
	c, err := rcsetup.ListenCM(n, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("closing the CM connector: %v", err)
		}
	})
	return dev, c
}

// iwarpNotApplicable are the probes that do not apply to iWARP.
var iwarpNotApplicable = []string{ProbePeerGone, ProbeRNRExhausted, ProbeResetReuse, ProbeSQD}

// iwarpDeviations are what siw's rules make deviate: no Last WQE Reached
// (siw raises IB_EVENT_QP_LAST_WQE_REACHED nowhere).
var iwarpDeviations = []string{ProbeLastWQEReached, ProbeLastWQERepeat}

// TestIWARP: on the soft device's iWARP personality, connected through
// the soft RDMA CM, every probe runs to a verdict or is not applicable
// with its reason and source; none is an error ("could not check").
func TestIWARP(t *testing.T) {
	devtest.Explore(t, func(t *testing.T) {
		dev, c := openIWARP(t)
		o := on(dev, quick)
		o.Connector = c
		checkIWARP(t, Run(context.Background(), dev, o))
	})
}

// checkIWARP checks the results of the probes on siw's rules: the
// verdicts and not-applicable reasons TestIWARP wants.
func checkIWARP(t *testing.T, results []Result) {
	t.Helper()
	var na, dev2 []string
	for _, r := range results {
		t.Logf("%-22s %-14s %s", r.Name, r.Outcome, r.Observed)
		switch r.Outcome {
		case NotApplicable:
			na = append(na, r.Name)
			if !strings.HasPrefix(r.Observed, "not applicable to iWARP: ") || !strings.Contains(r.Observed, "drivers/infiniband/sw/siw") {
				t.Errorf("%s: not applicable for %q, want a reason with siw's source", r.Name, r.Observed)
			}
		case Deviation:
			if !allowed(t, r) {
				dev2 = append(dev2, r.Name)
			}
		case Pass:
		default:
			t.Errorf("probe %s: %s, want a verdict or not applicable: %s", r.Name, r.Outcome, r.Observed)
		}
	}
	if !slices.Equal(na, iwarpNotApplicable) {
		t.Errorf("not applicable: %v, want %v", na, iwarpNotApplicable)
	}
	if !slices.Equal(dev2, iwarpDeviations) {
		t.Errorf("deviations: %v, want %v", dev2, iwarpDeviations)
	}
	if got := Count(results).NotApplicable; got != len(iwarpNotApplicable) {
		t.Errorf("Count: %d not applicable, want %d", got, len(iwarpNotApplicable))
	}
}

// TestIWARPStateUnread: on siw before Linux 6.8 every QP reads RESET
// (siwDevice.unreadState); the verdicts are those of a device whose state
// reads true, and the probes that would have judged the state say it could
// not be read and why.
func TestIWARPStateUnread(t *testing.T) {
	devtest.Explore(t, func(t *testing.T) {
		results := runSIW(t, &siwDevice{unreadState: true})
		checkIWARP(t, results)
		for _, r := range results {
			if r.Name != ProbeResponderAccessError && r.Name != ProbeCQOverrun {
				continue
			}
			if !strings.Contains(r.Observed, "state cannot be read") || !strings.Contains(r.Observed, "siw_query_qp") {
				t.Errorf("%s: %q, want it to say the state cannot be read, with siw's source", r.Name, r.Observed)
			}
		}
	})
}

// TestIWARPRecvSGE: libsiw refuses a receive without an SGE
// (siwDevice.recvNeedsSGE), so the probes' receives on iWARP carry one and
// every probe still runs to its verdict.
func TestIWARPRecvSGE(t *testing.T) {
	devtest.Explore(t, func(t *testing.T) {
		checkIWARP(t, runSIW(t, &siwDevice{recvNeedsSGE: true}))
	})
}

// TestIWARPStateAfterFlush: siw raises QP_ACCESS_ERR before it moves the
// QP to ERROR (siwDevice.errAfterFlush), so responder-access-error reads
// the responder's state once its receives are flushed, and passes.
func TestIWARPStateAfterFlush(t *testing.T) {
	devtest.Explore(t, func(t *testing.T) {
		checkIWARP(t, runSIW(t, &siwDevice{errAfterFlush: true}))
	})
}

// runSIW runs the probes on the soft device's iWARP personality with d's
// rules on the QPs its connector creates.
func runSIW(t *testing.T, d *siwDevice) []Result {
	dev, c := openIWARP(t)
	o := on(dev, quick)
	d.Context, d.qps = dev, map[ibv.QP]ibv.QP{}
	o.Connector = siwConnector{c, d}
	return Run(context.Background(), d, o)
}

// siwDevice models what siw and libsiw do that the soft device's iWARP
// personality does not, on the QPs siwConnector creates; its async events
// name those QPs.
type siwDevice struct {
	ibv.Context
	// unreadState: ibv_query_qp leaves qp_state 0 (RESET) whatever the
	// QP's state (siw_query_qp before Linux 6.8).
	unreadState bool
	// recvNeedsSGE: a receive without an SGE is refused, EINVAL
	// (push_recv_wqe in rdma-core's providers/siw/siw.c).
	recvNeedsSGE bool
	// errAfterFlush: a QP in ERROR reads RTS until a flush of its
	// receives has been polled (its event came before the state).
	errAfterFlush bool
	mu            sync.Mutex
	qps           map[ibv.QP]ibv.QP // the device's QP -> the one the probes hold
}

// NextAsyncEvent is the device's, naming the QP the probes hold.
func (d *siwDevice) NextAsyncEvent(ctx context.Context) (ibv.AsyncEvent, error) {
	ev, err := d.Context.NextAsyncEvent(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	if q, ok := d.qps[ev.QP]; ok && ev.QP != nil {
		ev.QP = q
	}
	return ev, err
}

type siwQP struct {
	ibv.QP
	d       *siwDevice
	flushed atomic.Bool // a flush of its receives was polled
}

// Query is the QP's, with the state RESET under unreadState, RTS for
// ERROR before a flush under errAfterFlush.
func (q *siwQP) Query(mask ibv.QPAttrMask) (ibv.QPAttr, ibv.QPInitAttr, error) {
	attr, init, err := q.QP.Query(mask)
	switch {
	case q.d.unreadState:
		attr.State = ibv.QPSReset
	case q.d.errAfterFlush && attr.State == ibv.QPSErr && !q.flushed.Load():
		attr.State = ibv.QPSRTS
	}
	return attr, init, err
}

// RecvCQ is the QP's, noting the flushes of its receives polled from it
// under errAfterFlush.
func (q *siwQP) RecvCQ() ibv.CQ { return q.cq(q.QP.RecvCQ()) }

// SendCQ is the QP's, as RecvCQ (one CQ object where both are one).
func (q *siwQP) SendCQ() ibv.CQ { return q.cq(q.QP.SendCQ()) }

func (q *siwQP) cq(cq ibv.CQ) ibv.CQ {
	if q.d.errAfterFlush {
		return flushCQ{cq, q}
	}
	return cq
}

type flushCQ struct {
	ibv.CQ
	q *siwQP
}

// Poll is the CQ's, noting a flush of q's receives.
func (c flushCQ) Poll(wcs []ibv.WC) (int, error) {
	n, err := c.CQ.Poll(wcs)
	for _, wc := range wcs[:n] {
		if wc.Status == ibv.WCWRFlushErr && wc.QPNum == c.q.Num() && wc.ID >= recvBase {
			c.q.flushed.Store(true)
		}
	}
	return n, err
}

// PostRecv is the QP's, refusing a receive without an SGE under
// recvNeedsSGE (the ones before it posted).
func (q *siwQP) PostRecv(wrs []ibv.RecvWR) error {
	for i, wr := range wrs {
		if q.d.recvNeedsSGE && len(wr.SGL) == 0 {
			if err := q.QP.PostRecv(wrs[:i]); err != nil {
				return err
			}
			return &ibv.PostError{Index: i, Err: ibv.ErrInvalidArgument}
		}
	}
	return q.QP.PostRecv(wrs)
}

type siwConnector struct {
	rcsetup.Connector
	d *siwDevice
}

// Pair is the connector's, its QPs under the device's rules.
func (c siwConnector) Pair(ctx context.Context, pd ibv.PD, attrA, attrB ibv.QPInitAttr, rt rcsetup.Retry) (*rcsetup.Pair, error) {
	p, err := c.Connector.Pair(ctx, pd, attrA, attrB, rt)
	if err != nil {
		return nil, err
	}
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	for _, qp := range []*ibv.QP{&p.A, &p.B} {
		w := &siwQP{QP: *qp, d: c.d}
		c.d.qps[*qp] = w
		*qp = w
	}
	return p, nil
}

package drain_test

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
)

// verbCounter is a QP that counts the calls a stated state makes needless.
type verbCounter struct {
	ibv.QP
	calls *atomic.Int32
}

func (q verbCounter) Query(mask ibv.QPAttrMask) (ibv.QPAttr, ibv.QPInitAttr, error) {
	q.calls.Add(1)
	return q.QP.Query(mask)
}

func (q verbCounter) Modify(attr ibv.QPAttr, mask ibv.QPAttrMask) error {
	q.calls.Add(1)
	return q.QP.Modify(attr, mask)
}

// QPs the caller moved to ERROR and says so are added in one pass with no
// Query and no Modify, their reports starting from the stated state, and
// drained as any other; a QP listed twice and a stated state that is not
// one are refused, naming their QP, and take nothing from the others.
func TestAddAllStated(t *testing.T) {
	r := testRig(t)
	var calls atomic.Int32
	var qps []ibv.QP
	for _, qp := range r.pairs(8, false) {
		if err := qp.Modify(ibv.QPAttr{State: ibv.QPSErr}, ibv.QPAttrState); err != nil {
			t.Fatal(err)
		}
		qps = append(qps, verbCounter{qp, &calls})
	}
	rp := newReaper(t, r.cq, drain.Options{Headroom: len(qps), DrainTimeout: devtest.Timeout, Queue: queueOf})
	o := withSendCount(counted)
	o.StateKnown, o.State = true, ibv.QPSErr
	// On siw a QP with nothing outstanding is proven by its counts at once,
	// inside AddAll: listed again, it is a new drain, not a busy one.
	list := qps
	if !siwUserQPs() {
		list = append(qps, qps[3])
	}
	hs, err := rp.AddAll(list, o)
	if !siwUserQPs() {
		wantErr(t, err, ibv.ErrBusy)
		if len(hs) != len(qps)+1 || hs[len(qps)] != nil {
			t.Fatalf("handles %v: want one per QP, none for the QP listed twice", hs)
		}
	}
	if _, err := rp.AddAll(qps[:1], drain.AddOptions{StateKnown: true, State: ibv.QPSUnknown}); err == nil {
		t.Error("a stated state that is no QP state was taken")
	} else {
		wantErr(t, err, ibv.ErrInvalidArgument)
	}
	// A count no queue can hold (queue sizes are 32-bit) is refused, not
	// cut to the bits the handle keeps.
	for _, n := range []int{-1, 1 << 32} {
		if _, err := rp.AddAll(qps[:1], drain.AddOptions{CountRecvs: true, Recvs: n}); err == nil {
			t.Errorf("a count of %d receives was taken", n)
		} else {
			wantErr(t, err, ibv.ErrInvalidArgument)
		}
	}
	pollUntilDone(t, rp, r.cq)
	for _, rep := range waitAll(t, hs[:len(qps)]) {
		if s := rep.Steps()[0]; s.Kind != report.StepState || s.From != ibv.QPSErr || s.To != ibv.QPSErr {
			t.Errorf("first step %v: want the stated ERR -> ERR\n%s", s, rep)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("%d Query or Modify calls on QPs stated in ERROR: want none", n)
	}
	if st := rp.Stats(); st.Safe != len(qps) || st.Added != len(qps) {
		t.Errorf("stats %+v: want %d added and safe", st, len(qps))
	}
}

// listedQP is a QP wrapper whose value cannot be compared (it holds a
// slice): the reaper, which tells QPs apart by identity, refuses it with an
// error instead of panicking on a comparison or a map key.
type listedQP struct {
	ibv.QP
	tags []string
}

func TestAddRefusesUnidentifiable(t *testing.T) {
	r := testRig(t)
	qp := r.pair(true)
	rp := newReaper(t, r.cq, drain.Options{DrainTimeout: devtest.Timeout})
	_, err := rp.Add(listedQP{qp, nil}, drain.AddOptions{})
	wantErr(t, err, drain.ErrUnsupportedQP)
	_, err = rp.Add(nil, drain.AddOptions{})
	wantErr(t, err, ibv.ErrInvalidArgument)
	if rp.HandleEvent(ibv.AsyncEvent{Type: ibv.EventQPLastWQEReached, QP: listedQP{qp, nil}}) {
		t.Error("an event of a QP that cannot be compared was claimed")
	}
	if st := rp.Stats(); st.Added != 0 {
		t.Errorf("stats %+v: want nothing added", st)
	}
}

// The CQ room a reaper needs is the caller's WRs plus its headroom,
// IPoIB-CM's one spare slot by default.
func TestCQEntries(t *testing.T) {
	for _, c := range []struct {
		o         drain.Options
		wrs, want int
	}{{drain.Options{}, 10, 10 + drain.DefaultHeadroom}, {drain.Options{Headroom: 4}, 10, 14}, {drain.Options{Headroom: 4}, 0, 4}} {
		if got := c.o.CQEntries(c.wrs); got != c.want {
			t.Errorf("Headroom %d: CQEntries(%d) = %d, want %d", c.o.Headroom, c.wrs, got, c.want)
		}
	}
}

// A batch of SRQ QPs with only their SRQ side open shares one barrier drain
// WR however many it holds, though AddAll takes them in a few at a time.
func TestAddAllSharesOneBarrier(t *testing.T) {
	skipWithoutLastWQE(t)
	r := testRig(t)
	qps := r.pairs(200, true)
	for _, qp := range qps {
		if err := qp.Modify(ibv.QPAttr{State: ibv.QPSErr}, ibv.QPAttrState); err != nil {
			t.Fatal(err)
		}
	}
	for range qps { // the caller's event loop saw them
		if ev := devtest.WaitEvent(t, r.dev, devtest.Timeout); ev.Type != ibv.EventQPLastWQEReached {
			t.Fatalf("event %v: want QP_LAST_WQE_REACHED", ev)
		}
	}
	rp := newReaper(t, r.cq, drain.Options{DrainTimeout: devtest.Timeout})
	hs, err := rp.AddAll(qps, drain.AddOptions{StateKnown: true, State: ibv.QPSErr, LastWQESeen: true, NoSends: true})
	if err != nil {
		t.Fatal(err)
	}
	pollUntilDone(t, rp, r.cq)
	for _, rep := range waitAll(t, hs) {
		if rep.Recv.By != report.ProofBarrier || rep.Batch != len(qps) {
			t.Errorf("qpn %d: %v in a batch of %d, want a barrier shared by all %d", rep.QPNum, rep.Recv, rep.Batch, len(qps))
		}
	}
	if st := rp.Stats(); st.DrainWRs != 1 || st.Safe != len(qps) {
		t.Errorf("stats %+v: want one drain WR, %d safe", st, len(qps))
	}
}

// listedCQ is a CQ wrapper whose value cannot be compared.
type listedCQ struct {
	ibv.CQ
	tags []string
}

// NewReaper checks what it can before any QP is added: a CQ it cannot
// tell apart, options that cannot be honoured, a headroom the CQ cannot
// hold. Each refusal names what was wrong.
func TestNewReaperRefuses(t *testing.T) {
	r := testRig(t)
	small := devtest.NewCQ(t, r.dev, 4)
	for _, c := range []struct {
		name   string
		cq     ibv.CQ
		o      drain.Options
		target error
		says   string
	}{
		{"nil CQ", nil, drain.Options{}, ibv.ErrInvalidArgument, "no CQ"},
		{"CQ that cannot be compared", listedCQ{r.cq, nil}, drain.Options{}, drain.ErrUnsupportedQP, "cannot be compared"},
		{"unknown policy", r.cq, drain.Options{Policy: 7}, ibv.ErrInvalidArgument, "Options.Policy"},
		{"negative MaxQuarantine", r.cq, drain.Options{MaxQuarantine: -1}, ibv.ErrInvalidArgument, "Options.MaxQuarantine"},
		{"negative LastWQETimeout", r.cq, drain.Options{LastWQETimeout: -time.Second}, ibv.ErrInvalidArgument, "Options.LastWQETimeout"},
		{"negative DrainTimeout", r.cq, drain.Options{DrainTimeout: -time.Second}, ibv.ErrInvalidArgument, "Options.DrainTimeout"},
		{"negative Headroom", r.cq, drain.Options{Headroom: -1}, ibv.ErrInvalidArgument, "Options.Headroom"},
		{"negative MaxBatch", r.cq, drain.Options{MaxBatch: -1}, ibv.ErrInvalidArgument, "Options.MaxBatch"},
		{"headroom beyond the CQ", small, drain.Options{Headroom: small.CQE() + 1}, ibv.ErrInvalidArgument, fmt.Sprintf("holds %d entries", small.CQE())},
	} {
		rp, err := drain.NewReaper(c.cq, c.o)
		if rp != nil || !errors.Is(err, c.target) || !strings.Contains(fmt.Sprint(err), c.says) {
			t.Errorf("%s: %v, %v; want no reaper and an error wrapping %v that says %q", c.name, rp, err, c.target, c.says)
		}
	}
	if _, err := drain.NewReaper(small, drain.Options{Headroom: small.CQE(), EventHistory: -1}); err != nil {
		t.Errorf("a headroom the CQ holds, no event history: %v", err)
	}
}

// Package scenario runs scripted scenarios on soft devices: traces of what
// the devices did, step by step (Run; the golden test of this package and
// the CLI's "qpdrain scenario" print the same steps), and drain simulations,
// QPs drained through a drain.Reaper with provider quirks (Drain, "qpdrain
// simulate"). It stands above soft and drain, so that the device stays below
// its users in the import graph.
package scenario

import (
	"fmt"
	"io"
	"strings"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/soft"
	"github.com/qpdrain/qpdrain/teardown"
)

// Step is one step of a scenario.
type Step struct {
	// Explain says in one line what the step does and shows.
	Explain string `json:"explain"`
	// Trace is what the devices did during the step, in order: state
	// changes, completions, async events, SRQ takes (soft.TraceEntry).
	Trace []string `json:"trace"`
}

// Names lists the scenarios Run knows.
var Names = []string{"srq-fault"}

// Run runs the scenario called name.
func Run(name string) ([]Step, error) {
	switch name {
	case "srq-fault":
		return SRQFault()
	}
	return nil, fmt.Errorf("unknown scenario %q (known: %s)", name, strings.Join(Names, ", "))
}

// Format writes steps as text: each explanation, then its trace indented.
func Format(w io.Writer, steps []Step) error {
	var b strings.Builder
	for i, s := range steps {
		fmt.Fprintf(&b, "step %d: %s\n", i+1, s.Explain)
		if len(s.Trace) == 0 {
			b.WriteString("    (no state change, completion or event)\n")
		}
		for _, l := range s.Trace {
			fmt.Fprintf(&b, "    %s\n", l)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// recorder collects trace entries; steps take them in order.
type recorder struct {
	entries []soft.TraceEntry
}

func (r *recorder) add(e soft.TraceEntry) { r.entries = append(r.entries, e) }

// take removes and formats the longest prefix of recorded entries that
// satisfy keep.
func (r *recorder) take(keep func(soft.TraceEntry) bool) []string {
	var out []string
	for len(r.entries) > 0 && keep(r.entries[0]) {
		out = append(out, r.entries[0].String())
		r.entries = r.entries[1:]
	}
	return out
}

// takeOnly removes every recorded entry and formats those that satisfy keep.
func (r *recorder) takeOnly(keep func(soft.TraceEntry) bool) []string {
	var out []string
	for _, e := range r.entries {
		if keep(e) {
			out = append(out, e.String())
		}
	}
	r.entries = nil
	return out
}

func all(soft.TraceEntry) bool { return true }

// SRQFault runs the SRQ-fault scenario: single-QP error handling on an SRQ.
// Three RC QPs on soft0 share one SRQ; each is connected to a peer on soft1
// and holds 2 receive WQEs taken ahead from the SRQ (Config.SRQPrefetch, the
// soft device's model of WQEs "taken but not yet completed"). QP 1's first
// send fails with a remote access error and QP 1 alone moves to ERROR and
// flushes; QP 2 keeps receiving; then the SRQ faults and QP 2 and QP 3 move
// to ERROR with QP_FATAL, flush and raise Last WQE Reached.
func SRQFault() (steps []Step, err error) {
	var rec recorder
	var td teardown.List
	defer func() {
		if cerr := td.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("tearing down the scenario: %w", cerr)
		}
	}()
	fab := soft.NewFabric()
	fab.SetAutoProgress(false)
	local, err := soft.Open(soft.Config{Name: "soft0", Fabric: fab, SRQPrefetch: 2, Trace: rec.add})
	if err != nil {
		return nil, err
	}
	td.Add(local)
	remote, err := soft.Open(soft.Config{Name: "soft1", Fabric: fab, Trace: rec.add})
	if err != nil {
		return nil, err
	}
	td.Add(remote)

	b := builder{td: &td}
	lpd := b.pd(local)
	rpd := b.pd(remote)
	srq := b.srq(lpd)
	buf := b.mr(lpd)
	rcq := b.cq(remote)
	var qps, peers [3]ibv.QP
	var cqs [3]ibv.CQ
	for i := range qps {
		cqs[i] = b.cq(local)
		qps[i] = b.qp(lpd, cqs[i], srq)
		peers[i] = b.qp(rpd, rcq, nil)
	}
	if b.err != nil {
		return nil, b.err
	}
	var wqes []ibv.RecvWR
	for id := uint64(100); id < 108; id++ {
		wqes = append(wqes, ibv.RecvWR{ID: id})
	}
	if err := srq.PostRecv(wqes); err != nil {
		return nil, fmt.Errorf("posting to the SRQ: %w", err)
	}
	for i := range qps {
		if err := soft.Connect(qps[i], peers[i], 1); err != nil {
			return nil, err
		}
	}
	steps = append(steps, Step{
		Explain: "three RC QPs on soft0 (qpn 17-19) share SRQ 1 holding wr_id 100-107; reaching RTR, each takes 2 WQEs ahead (SRQPrefetch 2: taken, not yet completed)",
		// The peers' own setup on soft1 is left out.
		Trace: rec.takeOnly(func(e soft.TraceEntry) bool { return e.Device == "soft0" }),
	})

	sends := []ibv.SendWR{
		{ID: 1, Opcode: ibv.WRRDMAWrite, Flags: ibv.SendSignaled, RemoteAddr: 0x1000, RKey: 0xbad,
			SGL: []ibv.SGE{{Addr: buf.Addr(), Length: 8, LKey: buf.LKey()}}},
		{ID: 2, Opcode: ibv.WRSend, Flags: ibv.SendSignaled},
		{ID: 3, Opcode: ibv.WRSend, Flags: ibv.SendSignaled},
	}
	if err := qps[0].PostSend(sends); err != nil {
		return nil, fmt.Errorf("posting QP 1's sends: %w", err)
	}
	steps = append(steps, Step{
		Explain: "QP 1 posts 3 send WRs (wr_id 1: RDMA WRITE with an rkey soft1 never issued; 2, 3: SEND); auto-progress is off, so all 3 are outstanding",
		Trace:   rec.take(all),
	})

	if n := fab.Progress(1); n != 1 {
		return nil, fmt.Errorf("progress executed %d WRs, want 1", n)
	}
	isLocalWC := func(e soft.TraceEntry) bool { return e.Kind == soft.TraceCompletion && e.Device == "soft0" }
	steps = append(steps,
		Step{
			Explain: "QP 1's first send fails: its peer on soft1 finds a bad rkey (class C), goes to ERROR with QP_ACCESS_ERR; QP 1 goes to ERROR; no other QP of soft0 changes state",
			Trace:   rec.take(func(e soft.TraceEntry) bool { return !isLocalWC(e) }),
		},
		Step{
			Explain: "QP 1's CQ gets, in order, the error completion of the failed send and a flush for each of the two behind it",
			Trace:   rec.take(func(e soft.TraceEntry) bool { return isLocalWC(e) && e.WC.ID < 100 }),
		},
		Step{
			Explain: "the receive side flushes the same way: the 2 WQEs QP 1 took from the SRQ complete with WR_FLUSH_ERR",
			Trace:   rec.take(func(e soft.TraceEntry) bool { return isLocalWC(e) && e.WC.ID >= 100 }),
		},
		Step{
			Explain: "QP 1 will take no more WQEs from the SRQ, so it raises Last WQE Reached, once: now it can be drained and destroyed",
			Trace:   rec.take(all),
		})

	if err := peers[1].PostSend([]ibv.SendWR{{ID: 20, Opcode: ibv.WRSend, Flags: ibv.SendSignaled}}); err != nil {
		return nil, fmt.Errorf("posting QP 2's peer's send: %w", err)
	}
	fab.Progress(0)
	steps = append(steps, Step{
		Explain: "meanwhile QP 2 keeps receiving from the same SRQ: a SEND from its peer consumes a WQE QP 2 took, and QP 2 takes the next from the SRQ",
		Trace:   rec.take(all),
	})

	if err := local.InjectSRQError(srq); err != nil {
		return nil, err
	}
	steps = append(steps, Step{
		Explain: "the SRQ faults: QP 2 and QP 3 each go to ERROR with their own QP_FATAL (class A), flush their taken WQEs to their own CQs and raise Last WQE Reached",
		Trace:   rec.take(all),
	})

	var final []string
	for i, q := range append(qps[:], peers[:]...) {
		a, _, err := q.Query(ibv.QPAttrState)
		if err != nil {
			return nil, err
		}
		dev := "soft0"
		if i >= len(qps) {
			dev = "soft1"
		}
		final = append(final, fmt.Sprintf("%s qpn %d: %s", dev, q.Num(), a.State))
	}
	wcs := make([]ibv.WC, 16)
	for _, cq := range cqs {
		n, err := cq.Poll(wcs)
		if err != nil {
			return nil, err
		}
		final = append(final, fmt.Sprintf("soft0 cq %d: polled %d completions", cq.(*soft.CQ).ID(), n))
	}
	steps = append(steps, Step{
		Explain: "final states: every soft0 QP is in ERROR and every WR it had completed; on soft1 only QP 1's peer, the responder that saw the bad rkey, is in ERROR",
		Trace:   final,
	})
	return steps, nil
}

// builder creates objects, remembering the first error and what to close.
type builder struct {
	td  *teardown.List
	err error
}

// create makes an object unless an earlier one failed, records the first
// error, and keeps what it made for the teardown.
func create[T interface{ Close() error }](b *builder, make func() (T, error)) T {
	var zero T
	if b.err != nil {
		return zero
	}
	v, err := make()
	if err != nil {
		b.err = err
		return zero
	}
	b.td.Add(v)
	return v
}

func (b *builder) pd(d *soft.Device) ibv.PD { return create(b, d.AllocPD) }

func (b *builder) mr(pd ibv.PD) ibv.MR {
	return create(b, func() (ibv.MR, error) { return pd.RegMR(make([]byte, 64), ibv.AccessLocalWrite) })
}

func (b *builder) cq(d *soft.Device) ibv.CQ {
	return create(b, func() (ibv.CQ, error) { return d.CreateCQ(16, nil) })
}

func (b *builder) srq(pd ibv.PD) ibv.SRQ {
	return create(b, func() (ibv.SRQ, error) { return pd.CreateSRQ(ibv.SRQAttr{MaxWR: 16, MaxSGE: 1}) })
}

func (b *builder) qp(pd ibv.PD, cq ibv.CQ, srq ibv.SRQ) ibv.QP {
	return create(b, func() (ibv.QP, error) {
		return pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, SRQ: srq, Type: ibv.QPTRC,
			Cap: ibv.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	})
}

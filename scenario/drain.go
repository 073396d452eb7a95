package scenario

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/soft"
	"github.com/qpdrain/qpdrain/teardown"
)

// Drain is a drain simulation: QPs on a soft device, one CQ for all of them,
// with receives taken and sends outstanding, all drained through one
// drain.Reaper ("qpdrain simulate").
type Drain struct {
	QPs   int  // QPs to drain, at most the soft device's max_qp
	NoSRQ bool // each QP has its own receive queue instead of a shared SRQ
	Taken int  // receive WQEs each QP holds (taken from the SRQ, or its own)
	Sends int  // sends outstanding on each QP
	// Quirks are the soft device's provider quirks.
	Quirks soft.Quirks
	// Policy, MaxBatch and MaxQuarantine are the reaper's drain.Options.
	Policy        drain.Policy
	MaxBatch      int
	MaxQuarantine int
	// RecvDrain proves an own receive queue by a receive drain WR instead
	// of counting its receives back.
	RecvDrain bool
	// Timeout bounds the wait for Last WQE Reached and for each drain WR;
	// 0 is DefaultTimeout of QPs.
	Timeout time.Duration
	// Log is the reaper's Options.Log.
	Log *slog.Logger
}

// MaxDrainCQE bounds the one CQ of a drain simulation, and with it the QPs,
// receives and sends it may ask for: 4 Mi completions, some 200 MB.
const MaxDrainCQE = 1 << 22

// The default Drain.Timeout: a base, and more per QP, since every step of
// every QP (the moves to ERROR, the events, the flushed completions) goes
// through one reaper, and a wait that starts with the first QP must
// outlast the work on all of them: 65,536 QPs took up to 0.6 s to 1.5 s
// on a shared 2-core machine, against a default of 6.8 s.
const (
	BaseTimeout  = 200 * time.Millisecond
	TimeoutPerQP = 100 * time.Microsecond
)

// The simulation's wr_ids: receives and sends in two ranges, so that a
// flushed completion tells its queue.
const (
	recvBase uint64 = 1 << 32
	sendBase uint64 = 2 << 32
)

var queueOf = drain.QueueByIDPrefix(32, recvBase, sendBase)

// CQE is the depth of the simulation's CQ: room for every flushed receive
// and send, the drain WRs, and some slack.
func (d *Drain) CQE() int { return d.QPs*(d.Taken+d.Sends+2) + 16 }

// WaitTimeout is Timeout, or the default for QPs.
func (d *Drain) WaitTimeout() time.Duration {
	if d.Timeout > 0 {
		return d.Timeout
	}
	return BaseTimeout + time.Duration(d.QPs)*TimeoutPerQP
}

// ErrTooManyQPs and ErrCQTooLarge are matched (errors.Is) by the error of a
// simulation larger than its device: more QPs than max_qp, or a CQ beyond
// MaxDrainCQE.
var (
	ErrTooManyQPs = errors.New("more QPs than the device creates")
	ErrCQTooLarge = errors.New("CQ larger than a simulation takes")
)

// limitError says which limit a simulation is beyond; it matches its
// sentinel without repeating its text, so that a caller can prefix what it
// asked for ("--qps 65537: soft0 creates at most 65536 QPs (max_qp)").
type limitError struct {
	sentinel error
	msg      string
}

func (e *limitError) Error() string        { return e.msg }
func (e *limitError) Is(target error) bool { return target == e.sentinel }

// DrainResult is what a drain simulation saw.
type DrainResult struct {
	Timeout time.Duration    // the wait bound used: Drain.WaitTimeout
	MaxQP   int              // the soft device's max_qp
	Reports []*report.Report // one per QP, in the order created
	Stats   drain.Stats      // the reaper's counts at the end
}

// stalledOnWait are the stalls in which a wait ran out.
var stalledOnWait = []error{drain.ErrNoLastWQE, drain.ErrDrainNotFlushed, drain.ErrNoHeadroom,
	drain.ErrRecvsMissing, drain.ErrCQNotEmpty, drain.ErrPostDrain}

// TimedOut counts the QPs whose drain stalled because a wait ran out.
func (r *DrainResult) TimedOut() int {
	n := 0
	for _, rep := range r.Reports {
		for _, e := range stalledOnWait {
			if rep.Stall != nil && errors.Is(rep.Stall, e) {
				n++
				break
			}
		}
	}
	return n
}

// NotSafe counts the QPs that are not safe to destroy.
func (r *DrainResult) NotSafe() int {
	n := 0
	for _, rep := range r.Reports {
		if !rep.Outcome.SafeToDestroy() {
			n++
		}
	}
	return n
}

// Run builds the devices, drains every QP and tears everything down. A
// simulation that asks for more than the device holds is an error matching
// ErrCQTooLarge or ErrTooManyQPs and naming the limit; ctx ending before
// the reports are in is its error.
func (d *Drain) Run(ctx context.Context) (res *DrainResult, err error) {
	if cqe := d.CQE(); cqe > MaxDrainCQE {
		return nil, &limitError{ErrCQTooLarge, fmt.Sprintf("needs a CQ of %d completions, at most %d", cqe, MaxDrainCQE)}
	}
	// Objects are closed in reverse order of creation, children first,
	// whatever happens.
	var objs teardown.List
	b := builder{td: &objs}
	defer func() {
		if cerr := objs.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()

	fab := soft.NewFabric()
	fab.SetAutoProgress(false) // sends stay outstanding until the QPs enter ERROR
	prefetch := d.Taken
	if d.NoSRQ {
		prefetch = 0
	}
	cqe := d.CQE()
	srqWR := max(d.QPs*d.Taken, 1)
	dev := create(&b, func() (*soft.Device, error) {
		return soft.Open(soft.Config{Fabric: fab, Quirks: d.Quirks, SRQPrefetch: prefetch,
			Limits: soft.Limits{MaxCQE: cqe, MaxSRQWR: srqWR, MaxQPWR: d.Taken + d.Sends + 2}})
	})
	if b.err != nil {
		return nil, b.err
	}
	// The device's limit is known before anything is created on it.
	attr, err := dev.QueryDevice()
	if err != nil {
		return nil, err
	}
	if d.QPs > attr.MaxQP {
		return nil, &limitError{ErrTooManyQPs, fmt.Sprintf("%s creates at most %d QPs (max_qp)", dev.Name(), attr.MaxQP)}
	}
	// The peers live on a second device, so that all of max_qp is the
	// drained QPs'.
	peers := create(&b, func() (*soft.Device, error) {
		return soft.Open(soft.Config{Fabric: fab, Name: "soft1", Limits: soft.Limits{MaxQPWR: d.Taken + d.Sends + 2}})
	})
	ch := create(&b, dev.CreateCompChannel)
	cq := create(&b, func() (ibv.CQ, error) { return dev.CreateCQ(cqe, ch) })
	peerCQ := b.cq(peers)
	pd := b.pd(dev)
	peerPD := b.pd(peers)
	var srq ibv.SRQ
	if !d.NoSRQ {
		srq = create(&b, func() (ibv.SRQ, error) { return pd.CreateSRQ(ibv.SRQAttr{MaxWR: uint32(srqWR), MaxSGE: 1}) })
	}
	if b.err != nil {
		return nil, b.err
	}
	if srq != nil {
		if err := srq.PostRecv(recvs(0, d.QPs*d.Taken)); err != nil {
			return nil, err
		}
	}
	qcap := ibv.QPCap{MaxSendWR: uint32(d.Sends + 1), MaxRecvWR: uint32(d.Taken + 1), MaxSendSGE: 1, MaxRecvSGE: 1}
	qps := make([]ibv.QP, d.QPs)
	for i := range qps {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		qp := create(&b, func() (ibv.QP, error) {
			return pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, SRQ: srq, Cap: qcap, Type: ibv.QPTRC})
		})
		peer := create(&b, func() (ibv.QP, error) {
			return peerPD.CreateQP(ibv.QPInitAttr{SendCQ: peerCQ, RecvCQ: peerCQ, Cap: qcap, Type: ibv.QPTRC})
		})
		if b.err != nil {
			return nil, b.err
		}
		if err := soft.Connect(qp, peer, 1); err != nil {
			return nil, err
		}
		if d.NoSRQ && d.Taken > 0 {
			if err := qp.PostRecv(recvs(i*d.Taken, d.Taken)); err != nil {
				return nil, err
			}
		}
		if d.Sends > 0 {
			if err := qp.PostSend(sends(i*d.Sends, d.Sends)); err != nil {
				return nil, err
			}
		}
		qps[i] = qp
	}

	timeout := d.WaitTimeout()
	rp, err := drain.NewReaper(cq, drain.Options{
		Policy: d.Policy, MaxQuarantine: d.MaxQuarantine, MaxBatch: d.MaxBatch,
		LastWQETimeout: timeout, DrainTimeout: timeout, Queue: queueOf,
		Log: d.Log,
	})
	if err != nil {
		return nil, err
	}
	// Every QP is added, and the reaper handed the events their moves to
	// ERROR raised, before Run starts: Run reads events and completions in
	// two goroutines, and the batches, and so the output, would otherwise
	// depend on how the scheduler interleaves them.
	hs := make([]*drain.Handle, len(qps))
	for i, qp := range qps {
		// The simulator knows what it posted: no sends means a QP with an
		// SRQ shares the barrier; its own receives can be counted back.
		add := drain.AddOptions{NoSends: d.Sends == 0, CountRecvs: d.NoSRQ && !d.RecvDrain, Recvs: d.Taken}
		if hs[i], err = rp.Add(qp, add); err != nil {
			return nil, err
		}
	}
	raised, stop := context.WithCancel(ctx)
	stop() // NextAsyncEvent returns what is queued, then the context's error
	for {
		ev, err := dev.NextAsyncEvent(raised)
		if err != nil {
			break
		}
		rp.HandleEvent(ev)
	}
	runCtx, cancel := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- rp.Run(runCtx, drain.Feed{Channel: ch, Events: dev}) }()
	defer func() {
		cancel()
		if rerr := <-runDone; rerr != nil && !errors.Is(rerr, context.Canceled) && err == nil {
			err = rerr
		}
	}()
	// Every step is bounded by the timeout; this bounds the whole run in
	// case the simulation itself is wrong.
	waitCtx, waitCancel := context.WithTimeout(ctx, 4*timeout+10*time.Second)
	defer waitCancel()
	res = &DrainResult{Timeout: timeout, MaxQP: attr.MaxQP}
	for _, h := range hs {
		rep, _ := h.Wait(waitCtx)
		res.Reports = append(res.Reports, rep)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	res.Stats = rp.Stats()
	return res, nil
}

func recvs(first, n int) []ibv.RecvWR {
	wrs := make([]ibv.RecvWR, n)
	for i := range wrs {
		wrs[i].ID = recvBase | uint64(first+i)
	}
	return wrs
}

func sends(first, n int) []ibv.SendWR {
	wrs := make([]ibv.SendWR, n)
	for i := range wrs {
		wrs[i] = ibv.SendWR{ID: sendBase | uint64(first+i), Opcode: ibv.WRSend, Flags: ibv.SendSignaled}
	}
	return wrs
}

package trace

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
)

// Kind names a finding.
type Kind string

// The findings, each a rule a program's teardown breaks.
const (
	// DestroyedWithOutstanding: a QP destroyed while WRs it was given had
	// not completed (no completion was ever polled for them).
	DestroyedWithOutstanding Kind = "destroyed-with-outstanding"
	// SRQDestroyedBeforeLastWQE: a QP on an SRQ destroyed before the
	// program had its Last WQE Reached event, on a device that raises it.
	SRQDestroyedBeforeLastWQE Kind = "srq-destroyed-before-last-wqe"
	// CompletionForDestroyedQP: a completion polled for a QP already destroyed.
	CompletionForDestroyedQP Kind = "completion-for-destroyed-qp"
	// CQOverSize: a CQ held more outstanding completions than its size.
	CQOverSize Kind = "cq-over-size"
	// CQOverrun: a CQ overran (IBV_EVENT_CQ_ERR, or ibv_poll_cq failed).
	CQOverrun Kind = "cq-overrun"
	// EventNotAcked: an async event the program got and never acknowledged.
	EventNotAcked Kind = "async-event-not-acked"
	// PostedInErrorNotFlushed: WRs posted to a QP in ERROR that the
	// provider never flushed while the QP lived.
	PostedInErrorNotFlushed Kind = "posted-in-error-not-flushed"
)

// rules cites what each finding breaks.
var rules = map[Kind]string{
	DestroyedWithOutstanding:  "IBTA vol. 1 §10.3.1 (QP error state): a QP's outstanding WRs complete with WR_FLUSH_ERR once it enters ERROR, and ibv_destroy_qp(3) releases the WRs of a QP destroyed earlier without completions: move it to ERROR and poll every flush before destroying it (the kernel's ib_drain_qp(), drivers/infiniband/core/verbs.c)",
	SRQDestroyedBeforeLastWQE: "IBTA vol. 1 o11-5.2.5: an SRQ-attached QP entering ERROR raises IBV_EVENT_QP_LAST_WQE_REACHED; until then it may still consume SRQ WQEs, so it is destroyed only after the event (ib_drain_qp(), ipoib_cm.c's rx_drain_list)",
	CompletionForDestroyedQP:  "a QP's completions are polled before it is destroyed: providers differ on what a destroy does to those still in its CQs (libmlx5's mlx5_destroy_qp removes them, __mlx5_cq_clean; rxe leaves them), so the program gets a WC whose QP and buffers are gone",
	CQOverSize:                "ibv_create_cq(3), ibv_get_async_event(3) (IBV_EVENT_CQ_ERR: CQ overrun): a CQ holds every completion that can be outstanding at once, and a QP entering ERROR completes every outstanding WR with WR_FLUSH_ERR (IBTA vol. 1 §10.3.1), so more outstanding WRs than cqe is an overrun waiting to happen",
	CQOverrun:                 "ibv_get_async_event(3) (IBV_EVENT_CQ_ERR: \"CQ is in error (CQ overrun)\"): completions were lost",
	EventNotAcked:             "ibv_get_async_event(3): every event it returns is acknowledged with ibv_ack_async_event; ibv_destroy_qp, ibv_destroy_cq and ibv_destroy_srq wait for their object's events to be acknowledged and block forever without it",
	PostedInErrorNotFlushed:   "IBTA vol. 1 §10.3.1 (a send posted in ERROR completes with WR_FLUSH_ERR), C10-42 (a receive posted in ERROR too): one that never completes is the provider's flush bug, and a drain that waits for it waits forever",
}

// Rule is the rule a finding of kind k breaks, with its citation.
func Rule(k Kind) string { return rules[k] }

// Kinds lists every finding kind, in report order.
func Kinds() []Kind {
	return []Kind{DestroyedWithOutstanding, SRQDestroyedBeforeLastWQE, CompletionForDestroyedQP, CQOverSize, CQOverrun, EventNotAcked, PostedInErrorNotFlushed}
}

// Finding is one rule broken, with its evidence.
type Finding struct {
	Kind Kind `json:"kind"`
	PID  int  `json:"pid"`
	// Device is the device the object's context was opened on.
	Device string `json:"device"`
	// Object names the QP ("qpn 17"), CQ ("cq 0x...") or event.
	Object string `json:"object"`
	// Queue is "send", "recv" or "srq" when the finding is about one.
	Queue string `json:"queue,omitempty"`
	// Count is how many WRs, completions or events the finding is about.
	Count int `json:"count"`
	// At is when it happened, from the trace's first record.
	At       time.Duration `json:"at_ns"`
	Evidence string        `json:"evidence"`
	Rule     string        `json:"rule"`
}

// LastWQE says whether a device raises Last WQE Reached, as the flush check
// (or an operator) knows it.
type LastWQE struct {
	Raises bool
	// Source says where the knowledge comes from ("qpdrain check's
	// last-wqe-reached probe", "--last-wqe raises").
	Source string
}

// Options tune Analyze.
type Options struct {
	// FlushWait is how long a WR posted in ERROR is given to be flushed
	// before it counts as never flushed (default DefaultFlushWait).
	FlushWait time.Duration
	// LastWQE tells Analyze, per device name, whether it raises Last WQE
	// Reached; a device the trace itself saw raise it needs no entry. Nil
	// or missing entries mean unknown: an SRQ QP destroyed too early on
	// such a device is a note, not a finding. (Analyzer.Report takes it as
	// its argument instead.)
	LastWQE func(device string) (LastWQE, bool)
}

// DefaultFlushWait is Options.FlushWait's default: far longer than any
// provider takes to flush (rxe flushes within microseconds), short enough
// for a test program's wait.
const DefaultFlushWait = 250 * time.Millisecond

// Process sums up what one traced process did.
type Process struct {
	PID     int      `json:"pid"`
	Devices []string `json:"devices"`
	QPs     int      `json:"qps"`
	CQs     int      `json:"cqs"`
	SRQs    int      `json:"srqs"`
	Posted  int      `json:"wrs_posted"`
	Polled  int      `json:"completions_polled"`
	Events  int      `json:"async_events"`
	// Exited is true when the process exited normally (it wrote its exit record).
	Exited bool `json:"exited"`
}

// Report is what Analyze found.
type Report struct {
	Processes []Process `json:"processes"`
	Findings  []Finding `json:"findings"`
	// Notes are what the trace cannot judge (paths the shim does not see,
	// devices whose Last WQE behaviour is unknown, completions of unknown QPs).
	Notes []string `json:"notes"`
}

// Clean reports whether the report has no finding.
func (r *Report) Clean() bool { return len(r.Findings) == 0 }

// Analyzer judges a trace's records as they are read, so that a long trace
// is never held in memory: Add each record in order, then Report. It is
// not safe for concurrent use.
type Analyzer struct{ a *analysis }

// NewAnalyzer starts an analysis with o (o.LastWQE is not used: Report takes it).
func NewAnalyzer(o Options) *Analyzer {
	if o.FlushWait <= 0 {
		o.FlushWait = DefaultFlushWait
	}
	return &Analyzer{a: newAnalysis(o)}
}

// Add judges the next record.
func (z *Analyzer) Add(r Record) {
	a := z.a
	if a.n == 0 {
		a.t0 = r.T
	}
	a.n++
	p := a.proc(r.PID)
	if r.T > p.end {
		p.end = r.T
	}
	a.step(p, r)
}

// NeedsLastWQE lists the devices on which an SRQ QP was destroyed before its
// Last WQE Reached and whose behaviour the trace itself does not show (the
// device raised it for no QP of the trace): the ones to run the flush
// check's last-wqe-reached probe on before Report.
func (z *Analyzer) NeedsLastWQE() []string {
	seen := map[string]bool{}
	var devs []string
	for _, d := range z.a.earlySRQ {
		if _, shown := z.a.raisesSeen[d.q.dev]; !shown && !seen[d.q.dev] {
			seen[d.q.dev] = true
			devs = append(devs, d.q.dev)
		}
	}
	sort.Strings(devs)
	return devs
}

// Report ends the analysis: what is left outstanding at the end of each
// process is judged, and the SRQ QPs destroyed early with lastWQE (per
// device; nil means unknown everywhere). It never fails: records it cannot
// place (a completion of a QP it never saw created) become notes. Call it
// once.
func (z *Analyzer) Report(lastWQE func(device string) (LastWQE, bool)) *Report {
	a := z.a
	if lastWQE == nil {
		lastWQE = func(string) (LastWQE, bool) { return LastWQE{}, false }
	}
	for _, d := range a.earlySRQ {
		a.judgeSRQ(d, lastWQE)
	}
	for _, pid := range a.order {
		a.finish(a.procs[pid])
	}
	return a.report()
}

// Analyze judges a trace's records held in memory (Analyzer, with
// o.LastWQE for Report).
func Analyze(recs []Record, o Options) *Report {
	z := NewAnalyzer(o)
	for _, r := range recs {
		z.Add(r)
	}
	return z.Report(o.LastWQE)
}

// wr is one posted WR that has not completed.
type wr struct {
	id       uint64
	postedAt int64
	inError  bool // posted while its QP was in ERROR
	signaled bool // a send that completes with a WC on success (IBV_SEND_SIGNALED or sq_sig_all)
}

type queue struct {
	name string // "send", "recv", "srq"
	wrs  []wr
	cq   *cq // whose completions these become; nil when not one CQ
}

type qp struct {
	ptr, ctx    uint64
	qpn         uint32
	typ         ibv.QPType
	dev         string
	sq, rq      queue
	srq         *srq
	ex          bool
	sigAll      bool
	reachedRTR  bool
	errAt       int64 // when it entered ERROR; 0 when not in ERROR
	lastWQE     bool  // the program got Last WQE Reached for it
	destroyedAt int64 // 0 while it lives
	lateWCs     int   // completions polled after the destroy
	lateFirst   int64
}

type cq struct {
	ptr, ctx    uint64
	cqe         int64
	ex          bool
	outstanding int
	maxOut      int
	maxAt       int64
	overrun     string
}

type srq struct {
	ptr, ctx uint64
	q        queue
	bound    bool // some QP uses it: q.cq is that QP's receive CQ, or nil for several
}

type proc struct {
	pid       int
	ctxDev    map[uint64]string
	qps       map[uint64]*qp // live, by pointer
	byQPN     map[[2]uint64]*qp
	destroyed map[[2]uint64]*qp // the latest destroyed QP of each (ctx, qpn)
	all       []*qp
	cqs       map[uint64]*cq
	allCQs    []*cq
	srqs      map[uint64]*srq
	pending   map[string]int // unacknowledged events by "type obj"
	pendDesc  map[string]string
	sum       Process
	end       int64
}

type analysis struct {
	o          Options
	t0         int64
	n          int                  // records added
	ctxDev     map[[2]uint64]string // (pid, ctx) -> device
	earlySRQ   []earlyDestroy
	procs      map[int]*proc
	order      []int
	notes      []string
	findings   []Finding
	raisesSeen map[string]int // device -> a qpn it raised Last WQE Reached for
	unknownQPN map[int]int
}

// earlyDestroy is an SRQ QP destroyed without its Last WQE Reached, judged
// at the end, once the whole trace has shown whether its device raises it.
type earlyDestroy struct {
	p  *proc
	q  *qp
	at int64
}

func newAnalysis(o Options) *analysis {
	if o.FlushWait <= 0 {
		o.FlushWait = DefaultFlushWait
	}
	return &analysis{o: o, procs: map[int]*proc{}, ctxDev: map[[2]uint64]string{}, raisesSeen: map[string]int{}, unknownQPN: map[int]int{}}
}

func (a *analysis) proc(pid int) *proc {
	p := a.procs[pid]
	if p == nil {
		p = &proc{pid: pid, ctxDev: map[uint64]string{}, qps: map[uint64]*qp{}, byQPN: map[[2]uint64]*qp{},
			destroyed: map[[2]uint64]*qp{}, cqs: map[uint64]*cq{}, srqs: map[uint64]*srq{},
			pending: map[string]int{}, pendDesc: map[string]string{}, sum: Process{PID: pid}}
		a.procs[pid] = p
		a.order = append(a.order, pid)
	}
	return p
}

func (a *analysis) at(t int64) time.Duration { return time.Duration(t - a.t0) }

func (a *analysis) add(f Finding) {
	f.Rule = rules[f.Kind]
	a.findings = append(a.findings, f)
}

func (a *analysis) step(p *proc, r Record) {
	switch r.Kind {
	case "open":
		p.ctxDev[r.Uint("ctx")] = r.Str("dev")
		a.ctxDev[[2]uint64{uint64(p.pid), r.Uint("ctx")}] = r.Str("dev")
		p.sum.Devices = appendUnique(p.sum.Devices, r.Str("dev"))
		if r.Has("traced") && r.Uint("traced") == 0 {
			a.notes = append(a.notes, fmt.Sprintf("pid %d: a context on %s was not traced (more than the shim's 64 open contexts)", p.pid, r.Str("dev")))
		}
	case "cq":
		c := &cq{ptr: r.Uint("cq"), ctx: r.Uint("ctx"), cqe: r.Int("cqe"), ex: r.Uint("ex") == 1}
		p.cqs[c.ptr] = c
		p.allCQs = append(p.allCQs, c)
		p.sum.CQs++
		if c.ex {
			a.notes = append(a.notes, fmt.Sprintf("pid %d: a CQ (0x%x) was created with ibv_create_cq_ex: completions read with ibv_start_poll/ibv_next_poll are not traced, so its QPs' outstanding WRs are not judged", p.pid, c.ptr))
		}
	case "cqd":
		if !r.Has("begin") && r.Int("ret") == 0 {
			delete(p.cqs, r.Uint("cq"))
		}
	case "srq":
		s := &srq{ptr: r.Uint("srq"), ctx: r.Uint("ctx"), q: queue{name: "srq"}}
		p.srqs[s.ptr] = s
		p.sum.SRQs++
	case "srqd":
		if !r.Has("begin") && r.Int("ret") == 0 {
			delete(p.srqs, r.Uint("srq"))
		}
	case "qp":
		a.create(p, r)
	case "mod":
		q := p.qps[r.Uint("qp")]
		if q == nil || r.Int("ret") != 0 {
			return
		}
		switch st := ibv.QPState(r.Uint("state")); {
		case st == ibv.QPSErr:
			if q.errAt == 0 {
				q.errAt = r.T
			}
		case st == ibv.QPSReset:
			// RESET empties the work queues without completions (IBTA vol. 1 §10.3.1).
			dropQueue(&q.sq)
			dropQueue(&q.rq)
			q.errAt = 0
		case st >= ibv.QPSRTR && st <= ibv.QPSSQE:
			q.reachedRTR = true
		}
	case "qpd":
		a.destroy(p, r)
	case "send", "recv":
		q := p.qps[r.Uint("qp")]
		if q == nil || r.Uint("ok") != 1 {
			return
		}
		p.sum.Posted++
		w := wr{id: r.Uint("wr"), postedAt: r.T, inError: q.errAt != 0, signaled: q.sigAll || r.Uint("sig") == 1}
		if r.Kind == "send" {
			push(&q.sq, w, r.T)
		} else {
			push(&q.rq, w, r.T)
		}
	case "srecv":
		s := p.srqs[r.Uint("srq")]
		if s == nil || r.Uint("ok") != 1 {
			return
		}
		p.sum.Posted++
		push(&s.q, wr{id: r.Uint("wr"), postedAt: r.T}, r.T)
	case "wc":
		p.sum.Polled++
		a.completion(p, r)
	case "pollerr":
		if c := p.cqs[r.Uint("cq")]; c != nil && c.overrun == "" {
			c.overrun = fmt.Sprintf("ibv_poll_cq returned %d at %s", r.Int("ret"), fmtDur(int64(a.at(r.T))))
		}
	case "ev":
		p.sum.Events++
		key, desc := eventKey(r)
		p.pending[key]++
		p.pendDesc[key] = desc
		switch t := ibv.EventType(r.Uint("type")); t {
		case ibv.EventQPLastWQEReached:
			if q := p.qps[r.Uint("qp")]; q != nil {
				q.lastWQE = true
			}
			if d, ok := a.ctxDev[[2]uint64{uint64(p.pid), r.Uint("ctx")}]; ok {
				if _, seen := a.raisesSeen[d]; !seen {
					a.raisesSeen[d] = int(r.Uint("qpn"))
				}
			}
		case ibv.EventQPFatal, ibv.EventQPReqErr, ibv.EventQPAccessErr:
			if q := p.qps[r.Uint("qp")]; q != nil && q.errAt == 0 {
				q.errAt = r.T
			}
		case ibv.EventCQErr:
			if c := p.cqs[r.Uint("cq")]; c != nil && c.overrun == "" {
				c.overrun = fmt.Sprintf("IBV_EVENT_CQ_ERR at %s", fmtDur(int64(a.at(r.T))))
			}
		}
	case "ack":
		key, _ := eventKey(r)
		if p.pending[key] > 0 {
			p.pending[key]--
		}
	case "qpxlost":
		// a batch of more WRs than the shim holds between ibv_wr_start and
		// ibv_wr_complete: its send queue can no longer be judged
		if q := p.qps[r.Uint("qp")]; q != nil && !q.ex {
			q.ex = true
			a.notes = append(a.notes, fmt.Sprintf("pid %d: qpn %d posted more than 256 WRs in one ibv_wr_start/ibv_wr_complete batch, more than the shim records: its send queue is not judged", p.pid, q.qpn))
		}
	case "exit":
		p.sum.Exited = true
	}
}

func (a *analysis) create(p *proc, r Record) {
	ptr := r.Uint("qp")
	if old := p.qps[ptr]; old != nil && old.destroyedAt == 0 {
		return // the same QP recorded twice (a provider's create_qp calling another)
	}
	q := &qp{ptr: ptr, ctx: r.Uint("ctx"), qpn: uint32(r.Uint("qpn")), typ: ibv.QPType(r.Uint("type")),
		dev: p.ctxDev[r.Uint("ctx")], ex: r.Uint("ex") == 1, sigAll: r.Uint("sig_all") == 1,
		sq: queue{name: "send", cq: p.cqs[r.Uint("scq")]}, rq: queue{name: "recv", cq: p.cqs[r.Uint("rcq")]}}
	if s := p.srqs[r.Uint("srq")]; s != nil {
		q.srq = s
		q.rq.cq = nil
		a.bind(s, p.cqs[r.Uint("rcq")])
	}
	p.qps[ptr] = q
	p.byQPN[[2]uint64{q.ctx, uint64(q.qpn)}] = q
	p.all = append(p.all, q)
	p.sum.QPs++
	if q.ex {
		a.notes = append(a.notes, fmt.Sprintf("pid %d: qpn %d uses ibv_qp_ex send operations the shim does not take over (bind_mw, send_tso, atomic_write, or its table of 1024 such QPs was full): its send queue is not judged", p.pid, q.qpn))
	}
}

// bind attributes an SRQ's WRs to the receive CQ of the QPs that use it,
// while they all use the same one.
func (a *analysis) bind(s *srq, c *cq) {
	switch {
	case !s.bound:
		s.bound, s.q.cq = true, c
		if c != nil {
			c.add(len(s.q.wrs), 0)
		}
	case s.q.cq != c && s.q.cq != nil:
		s.q.cq.add(-len(s.q.wrs), 0)
		s.q.cq = nil
	}
}

func (c *cq) add(n int, t int64) {
	c.outstanding += n
	if c.outstanding > c.maxOut {
		c.maxOut, c.maxAt = c.outstanding, t
	}
}

func push(q *queue, w wr, t int64) {
	q.wrs = append(q.wrs, w)
	if q.cq != nil {
		q.cq.add(1, t)
	}
}

func dropQueue(q *queue) {
	if q.cq != nil {
		q.cq.add(-len(q.wrs), 0)
	}
	q.wrs = nil
}

// retire removes WR i from q: on a send queue with the unsignaled WRs
// before it, which complete with it (completions are ordered within a work queue,
// IBTA vol. 1 ch. 10); on a receive queue or SRQ that WR only.
func retire(q *queue, i int, countCQ bool) {
	n := 1
	if q.name == "send" {
		n = i + 1
		q.wrs = q.wrs[n:]
	} else {
		q.wrs = append(q.wrs[:i], q.wrs[i+1:]...)
	}
	if countCQ && q.cq != nil {
		q.cq.add(-n, 0)
	}
}

// indexOf finds the WR a completion of id is for: the first one with that
// id, on a send queue the first signaled one when the completion is a
// success (an unsignaled send has none then; programs such as perftest give
// every WR the same id and signal one in many).
func indexOf(q *queue, id uint64, success bool) int {
	for i, w := range q.wrs {
		if w.id == id && (q.name != "send" || !success || w.signaled) {
			return i
		}
	}
	return -1
}

func (a *analysis) completion(p *proc, r Record) {
	c := p.cqs[r.Uint("cq")]
	if c == nil {
		return
	}
	key := [2]uint64{c.ctx, r.Uint("qpn")}
	q, late := p.byQPN[key], false
	if q == nil {
		if q = p.destroyed[key]; q == nil {
			a.unknownQPN[p.pid]++
			return
		}
		late = true
		if q.lateWCs == 0 {
			q.lateFirst = r.T
		}
		q.lateWCs++
	}
	status, op, id := ibv.WCStatus(r.Uint("st")), ibv.WCOpcode(r.Uint("op")), r.Uint("wr")
	if status != ibv.WCSuccess && status != ibv.WCWRFlushErr && q.errAt == 0 && q.typ != ibv.QPTUD {
		q.errAt = r.T // a completion in error moves a connected QP to ERROR (IBTA vol. 1 §10.3.1)
	}
	var cands []*queue
	if q.sq.cq == c {
		cands = append(cands, &q.sq)
	}
	recvQ := &q.rq
	if q.srq != nil {
		recvQ = &q.srq.q
	}
	if q.srq != nil || q.rq.cq == c {
		cands = append(cands, recvQ)
	}
	if status == ibv.WCSuccess {
		// opcode is valid on success only (ibv_poll_cq(3)).
		if op&ibv.WCOpcode(128) != 0 {
			cands = []*queue{recvQ}
		} else {
			cands = []*queue{&q.sq}
		}
	}
	best, bi := (*queue)(nil), -1
	for _, cand := range cands {
		if i := indexOf(cand, id, status == ibv.WCSuccess); i >= 0 && (bi < 0 || i < bi) {
			best, bi = cand, i
		}
	}
	if best != nil {
		retire(best, bi, !late)
	}
}

func (a *analysis) destroy(p *proc, r Record) {
	q := p.qps[r.Uint("qp")]
	if q == nil || r.Has("begin") || r.Int("ret") != 0 {
		return
	}
	q.destroyedAt = r.T
	delete(p.qps, q.ptr)
	key := [2]uint64{q.ctx, uint64(q.qpn)}
	delete(p.byQPN, key)
	p.destroyed[key] = q
	// Whatever it still had outstanding no longer counts against its CQs.
	for _, qq := range []*queue{&q.sq, &q.rq} {
		if qq.cq != nil {
			qq.cq.add(-len(qq.wrs), 0)
		}
	}
	if q.srq != nil && q.reachedRTR && !q.lastWQE {
		a.earlySRQ = append(a.earlySRQ, earlyDestroy{p: p, q: q, at: r.T})
	}
}

// judgeSRQ judges an SRQ QP destroyed before its Last WQE Reached.
func (a *analysis) judgeSRQ(d earlyDestroy, lastWQE func(string) (LastWQE, bool)) {
	p, q := d.p, d.q
	know, ok := lastWQE(q.dev)
	if qpn, seen := a.raisesSeen[q.dev]; seen {
		know, ok = LastWQE{Raises: true, Source: fmt.Sprintf("this trace: %s raised it for qpn %d", q.dev, qpn)}, true
	}
	switch {
	case !ok:
		a.notes = append(a.notes, fmt.Sprintf("pid %d: qpn %d on an SRQ was destroyed without its Last WQE Reached; whether %s raises it is unknown (run qpdrain check on it)", p.pid, q.qpn, q.dev))
	case !know.Raises:
		a.notes = append(a.notes, fmt.Sprintf("pid %d: qpn %d on an SRQ was destroyed without its Last WQE Reached, which %s does not raise (%s): a drain there needs another proof that the QP consumes no more SRQ WQEs", p.pid, q.qpn, q.dev, know.Source))
	default:
		ev := "was destroyed without ever being moved to ERROR, so"
		if q.errAt != 0 {
			ev = fmt.Sprintf("was destroyed %v after ERROR,", fmtDur(d.at-q.errAt))
		}
		a.add(Finding{Kind: SRQDestroyedBeforeLastWQE, PID: p.pid, Device: q.dev, Object: fmt.Sprintf("qpn %d", q.qpn), Queue: "srq", At: a.at(d.at),
			Evidence: fmt.Sprintf("qpn %d (on SRQ 0x%x) %s before the program got IBV_EVENT_QP_LAST_WQE_REACHED for it; %s raises it (%s)", q.qpn, q.srq.ptr, ev, q.dev, know.Source)})
	}
}

// finish judges what is left when a process's records end.
func (a *analysis) finish(p *proc) {
	for _, q := range p.all {
		end := p.end
		if q.destroyedAt != 0 {
			end = q.destroyedAt
		}
		for _, qq := range []*queue{&q.sq, &q.rq} {
			if q.ex && qq == &q.sq || qq.cq != nil && qq.cq.ex {
				continue // completions or posts the shim does not see
			}
			a.leftover(p, q, qq, end)
		}
		if q.lateWCs > 0 {
			a.add(Finding{Kind: CompletionForDestroyedQP, PID: p.pid, Device: q.dev, Object: fmt.Sprintf("qpn %d", q.qpn), Count: q.lateWCs, At: a.at(q.lateFirst),
				Evidence: fmt.Sprintf("%d completion(s) of qpn %d polled after it was destroyed, the first %v after ibv_destroy_qp", q.lateWCs, q.qpn, fmtDur(q.lateFirst-q.destroyedAt))})
		}
	}
	for _, c := range p.allCQs {
		if c.ex {
			continue
		}
		if c.maxOut > int(c.cqe) {
			a.add(Finding{Kind: CQOverSize, PID: p.pid, Device: p.ctxDev[c.ctx], Object: fmt.Sprintf("cq 0x%x", c.ptr), Count: c.maxOut, At: a.at(c.maxAt),
				Evidence: fmt.Sprintf("up to %d WRs outstanding whose completions go to this CQ of cqe %d", c.maxOut, c.cqe)})
		}
		if c.overrun != "" {
			a.add(Finding{Kind: CQOverrun, PID: p.pid, Device: p.ctxDev[c.ctx], Object: fmt.Sprintf("cq 0x%x", c.ptr),
				Evidence: fmt.Sprintf("the CQ (cqe %d) overran: %s", c.cqe, c.overrun)})
		}
	}
	var keys []string
	for k, n := range p.pending {
		if n > 0 {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		a.add(Finding{Kind: EventNotAcked, PID: p.pid, Device: strings.Join(p.sum.Devices, ","), Object: p.pendDesc[k], Count: p.pending[k],
			Evidence: fmt.Sprintf("%d %s never acknowledged with ibv_ack_async_event before the process ended: destroying its object would block", p.pending[k], p.pendDesc[k])})
	}
	if n := a.unknownQPN[p.pid]; n > 0 {
		a.notes = append(a.notes, fmt.Sprintf("pid %d: %d completion(s) of QPs the trace never saw created (created before the shim, or through a path it does not see)", p.pid, n))
	}
}

// leftover judges the WRs still outstanding on one queue at the end of the
// QP (its destroy, or the end of the process).
func (a *analysis) leftover(p *proc, q *qp, qq *queue, end int64) {
	var stale, other []wr
	for _, w := range qq.wrs {
		if w.inError && time.Duration(end-w.postedAt) >= a.o.FlushWait {
			stale = append(stale, w)
		} else {
			other = append(other, w)
		}
	}
	obj := fmt.Sprintf("qpn %d", q.qpn)
	if len(stale) > 0 {
		how := "the process ended"
		if q.destroyedAt != 0 {
			how = "it was destroyed"
		}
		a.add(Finding{Kind: PostedInErrorNotFlushed, PID: p.pid, Device: q.dev, Object: obj, Queue: qq.name, Count: len(stale), At: a.at(stale[0].postedAt),
			Evidence: fmt.Sprintf("%d WR(s) posted to the %s queue of qpn %d in ERROR (first wr_id 0x%x, %v after ERROR) had no completion %v later, when %s", len(stale), qq.name, q.qpn, stale[0].id, fmtDur(stale[0].postedAt-q.errAt), fmtDur(end-stale[0].postedAt), how)})
	}
	if len(other) > 0 && q.destroyedAt != 0 {
		when := "it never entered ERROR"
		if q.errAt != 0 {
			when = fmt.Sprintf("%v after ERROR", fmtDur(q.destroyedAt-q.errAt))
		}
		a.add(Finding{Kind: DestroyedWithOutstanding, PID: p.pid, Device: q.dev, Object: obj, Queue: qq.name, Count: len(other), At: a.at(q.destroyedAt),
			Evidence: fmt.Sprintf("qpn %d destroyed with %d WR(s) outstanding on its %s queue (first wr_id 0x%x), %s; no completion of them was ever polled", q.qpn, len(other), qq.name, other[0].id, when)})
	}
}

func (a *analysis) report() *Report {
	rep := &Report{Findings: a.findings, Notes: a.notes}
	for _, pid := range a.order {
		if p := a.procs[pid]; len(p.sum.Devices) > 0 {
			rep.Processes = append(rep.Processes, p.sum)
		}
	}
	if rep.Findings == nil {
		rep.Findings = []Finding{}
	}
	if rep.Notes == nil {
		rep.Notes = []string{}
	}
	if rep.Processes == nil {
		rep.Processes = []Process{}
	}
	return rep
}

// eventKey identifies an event for matching its acknowledgement, and names it.
func eventKey(r Record) (key, desc string) {
	t := "IBV_EVENT_" + ibv.EventType(r.Uint("type")).String()
	switch {
	case r.Has("qp"):
		return t + " qp " + r.Str("qp"), fmt.Sprintf("%s of qpn %d", t, r.Uint("qpn"))
	case r.Has("cq"):
		return t + " cq " + r.Str("cq"), t + " of cq " + r.Str("cq")
	case r.Has("srq"):
		return t + " srq " + r.Str("srq"), t + " of srq " + r.Str("srq")
	case r.Has("port"):
		return t + " port " + r.Str("port"), t + " of port " + r.Str("port")
	}
	return t, t
}

func appendUnique(s []string, v string) []string {
	for _, x := range s {
		if x == v {
			return s
		}
	}
	return append(s, v)
}

// fmtDur prints a duration to the millisecond's tenth, as an operator reads it.
func fmtDur(ns int64) string {
	return fmt.Sprintf("%.1f ms", float64(ns)/1e6)
}

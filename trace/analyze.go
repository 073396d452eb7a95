package trace

import (
	"errors"
	"fmt"
	"slices"
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
	// Program is the executable of the process (from the shim's start
	// record; empty in records of older shims).
	Program string `json:"program,omitempty"`
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
	// Site is the call site of the verb the finding is about: the destroy
	// of the QP (its create when it was never destroyed), the create of the
	// CQ, the post of the first WR posted in ERROR, the
	// ibv_get_async_event of the event; nil when the records have none.
	Site *Site `json:"site,omitempty"`
	// SuppressedBy is the suppressions file line ("FILE:LINE") that
	// matched it, in Report.Suppressed.
	SuppressedBy string `json:"suppressed_by,omitempty"`
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
	PID int `json:"pid"`
	// Program is its executable, when the shim recorded it.
	Program string   `json:"program,omitempty"`
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
	// Suppressed are the findings Suppress moved out of Findings: counted
	// in the report, not against the program.
	Suppressed []Finding `json:"suppressed"`
}

// Clean reports whether the report has no finding (suppressed ones aside).
func (r *Report) Clean() bool { return len(r.Findings) == 0 }

// ErrUnknownKind is ParseKind's error for a name that is not a finding's kind.
var ErrUnknownKind = errors.New("not a kind of finding")

// ParseKind returns the kind of finding named s; its error wraps
// ErrUnknownKind and names the kinds.
func ParseKind(s string) (Kind, error) {
	for _, k := range Kinds() {
		if string(k) == s {
			return k, nil
		}
	}
	var names []string
	for _, k := range Kinds() {
		names = append(names, string(k))
	}
	return "", fmt.Errorf("%q is %w: want one of %s", s, ErrUnknownKind, strings.Join(names, ", "))
}

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
	switch r.Kind {
	case "fork":
		// the child's first record: it shares its parent's objects
		if parent := a.procs[int(r.Uint("ppid"))]; parent != nil {
			c := a.newProc(r.PID, parent.objects)
			c.sum.Devices, c.forked = append([]string(nil), parent.sum.Devices...), true
			c.sum.Program = parent.sum.Program
			c.mods = slices.Clone(parent.mods) // the same mappings, until it loads its own
		}
	case "start":
		// a new program image opened a device (exec closed the uverbs
		// file of the image before it: close-on-exec)
		if a.procs[r.PID] != nil {
			a.newProc(r.PID, nil)
		}
		a.proc(r.PID).sum.Program = r.Str("exe")
	}
	p := a.proc(r.PID)
	p.records++
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
	for _, set := range a.sets {
		a.finish(set)
	}
	for _, p := range a.order {
		a.finishProc(p)
	}
	// in the order they happened: a forked child's findings among its parent's
	sort.SliceStable(a.findings, func(i, j int) bool { return a.findings[i].At < a.findings[j].At })
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
	site     *Site
	// tid posted it; prevMax and prevAt are its CQ's most outstanding
	// before it, for unpost
	tid     int
	prevMax int
	prevAt  int64
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
	destroyedBy *proc // the process that destroyed it
	created     *Site // where it was created, and destroyed
	destroySite *Site
	lateWCs     int // completions polled after the destroy
	lateFirst   int64
	// amb counts, by wr_id, the flushed completions that could have come
	// from the send queue or the receive queue (both complete to their CQ
	// and held a WR with that wr_id): the opcode of a completion in error
	// is undefined (ibv_poll_cq(3)), so only the counts at the end decide.
	amb map[uint64]int
	// unjudged are the wr_ids amb left undecided: no finding about them.
	unjudged map[uint64]bool
}

// recvQueue is where q's receives are: its SRQ's queue or its own.
func (q *qp) recvQueue() *queue {
	if q.srq != nil {
		return &q.srq.q
	}
	return &q.rq
}

type cq struct {
	ptr, ctx    uint64
	creator     *proc
	created     *Site
	cqe         int64
	ex          bool
	outstanding int
	maxOut      int
	maxAt       int64
	overrun     string
	overrunAt   int64
}

type srq struct {
	ptr, ctx uint64
	q        queue
	bound    bool // some QP uses it: q.cq is that QP's receive CQ, or nil for several
}

// objects are the verbs objects of one process, shared with the children
// it forks after opening a device: they inherit its uverbs file, so a
// child's verbs act on the same kernel objects (a QP the child destroys is
// gone for the parent too), and the kernel destroys what is left only when
// the last of them closes the file.
type objects struct {
	ctxDev    map[uint64]string
	qps       map[uint64]*qp // live, by pointer
	byQPN     map[[2]uint64]*qp
	destroyed map[[2]uint64]*qp // the latest destroyed QP of each (ctx, qpn)
	all       []*qp
	cqs       map[uint64]*cq
	allCQs    []*cq
	srqs      map[uint64]*srq
	holders   []*proc // the processes sharing them, the creator first
}

type proc struct {
	pid int
	*objects
	pending  map[string]int // unacknowledged events by "type obj"
	pendDesc map[string]string
	pendAt   map[string]int64 // when the first of them came
	pendSite map[string]*Site // where the first of them was got
	mods     []module         // the objects it loaded, in order (map records)
	sites    map[siteKey]*Site
	sum      Process
	end      int64
	forked   bool // its first record was its fork
	records  int
}

type analysis struct {
	o          Options
	t0         int64
	n          int                  // records added
	ctxDev     map[[2]uint64]string // (pid, ctx) -> device
	earlySRQ   []earlyDestroy
	procs      map[int]*proc // the current process of each pid
	order      []*proc       // every process (a pid that exec'd is two), in order
	sets       []*objects    // every object set, in order
	notes      []string
	findings   []Finding
	raisesSeen map[string]int // device -> a qpn it raised Last WQE Reached for
	unknownQPN map[int]int
	lastPost   map[int]*queue // tid -> the queue of the thread's latest WR record (for unposted)
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
	return &analysis{o: o, procs: map[int]*proc{}, ctxDev: map[[2]uint64]string{}, raisesSeen: map[string]int{}, unknownQPN: map[int]int{}, lastPost: map[int]*queue{}}
}

func (a *analysis) proc(pid int) *proc {
	if p := a.procs[pid]; p != nil {
		return p
	}
	return a.newProc(pid, nil)
}

// newProc starts the records of pid: a new process, or a new program image
// in it (exec), with objects of its own, or shared with the process it was
// forked from.
func (a *analysis) newProc(pid int, shared *objects) *proc {
	if shared == nil {
		shared = &objects{ctxDev: map[uint64]string{}, qps: map[uint64]*qp{}, byQPN: map[[2]uint64]*qp{},
			destroyed: map[[2]uint64]*qp{}, cqs: map[uint64]*cq{}, srqs: map[uint64]*srq{}}
		a.sets = append(a.sets, shared)
	}
	p := &proc{pid: pid, objects: shared, pending: map[string]int{}, pendDesc: map[string]string{}, pendAt: map[string]int64{}, pendSite: map[string]*Site{}, sum: Process{PID: pid}}
	shared.holders = append(shared.holders, p)
	a.procs[pid] = p
	a.order = append(a.order, p)
	return p
}

func (a *analysis) at(t int64) time.Duration { return time.Duration(t - a.t0) }

// add records f, a finding in process p.
func (a *analysis) add(p *proc, f Finding) {
	f.PID, f.Program, f.Rule = p.pid, p.sum.Program, rules[f.Kind]
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
	case "map":
		p.mods = append(p.mods, module{path: r.Str("path"), base: r.Uint("base"), lo: r.Uint("lo"), hi: r.Uint("hi")})
	case "cq":
		c := &cq{ptr: r.Uint("cq"), ctx: r.Uint("ctx"), creator: p, created: p.site(r, "ibv_create_cq"), cqe: r.Int("cqe"), ex: r.Uint("ex") == 1}
		p.cqs[c.ptr] = c
		p.allCQs = append(p.allCQs, c)
		p.sum.CQs++
		if c.ex {
			a.notes = append(a.notes, fmt.Sprintf("pid %d: a CQ (0x%x) made by ibv_create_cq_ex could not be traced (the provider refused IBV_WC_EX_WITH_QP_NUM, or the shim's table of 1024 such CQs was full): its completions are not seen, so its QPs' outstanding WRs are not judged", p.pid, c.ptr))
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
		delete(a.lastPost, r.TID) // until post: a WR of a QP not traced
		q := p.qps[r.Uint("qp")]
		if q == nil || notPosted(r) {
			return
		}
		w := wr{id: r.Uint("wr"), postedAt: r.T, inError: q.errAt != 0, signaled: q.sigAll || r.Uint("sig") == 1, site: p.site(r, "ibv_post_"+r.Kind)}
		if r.Kind == "send" {
			a.post(p, r, &q.sq, w)
		} else {
			a.post(p, r, &q.rq, w)
		}
	case "srecv":
		delete(a.lastPost, r.TID)
		s := p.srqs[r.Uint("srq")]
		if s == nil || notPosted(r) {
			return
		}
		a.post(p, r, &s.q, wr{id: r.Uint("wr"), postedAt: r.T, site: p.site(r, "ibv_post_srq_recv")})
	case "unposted":
		if q := a.lastPost[r.TID]; q != nil {
			p.sum.Posted -= unpost(q, r.TID, int(r.Uint("wrs")))
		}
	case "wc":
		p.sum.Polled++
		a.completion(p, r)
	case "pollerr":
		if c := p.cqs[r.Uint("cq")]; c != nil && c.overrun == "" {
			c.overrun, c.overrunAt = fmt.Sprintf("ibv_poll_cq returned %d at %s", r.Int("ret"), fmtDur(int64(a.at(r.T)))), r.T
		}
	case "ev":
		p.sum.Events++
		key, desc := eventKey(r)
		if p.pending[key] == 0 {
			p.pendAt[key], p.pendSite[key] = r.T, p.site(r, "ibv_get_async_event")
		}
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
				c.overrun, c.overrunAt = fmt.Sprintf("IBV_EVENT_CQ_ERR at %s", fmtDur(int64(a.at(r.T)))), r.T
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
		dev: p.ctxDev[r.Uint("ctx")], ex: r.Uint("ex") == 1, sigAll: r.Uint("sig_all") == 1, created: p.site(r, "ibv_create_qp"),
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
		a.notes = append(a.notes, fmt.Sprintf("pid %d: qpn %d uses ibv_qp_ex send operations the shim does not take over (newer than ATOMIC_WRITE and FLUSH, or its table of 1024 such QPs was full): its send queue is not judged", p.pid, q.qpn))
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
	if q.cq != nil {
		w.prevMax, w.prevAt = q.cq.maxOut, q.cq.maxAt
	}
	q.wrs = append(q.wrs, w)
	if q.cq != nil {
		q.cq.add(1, t)
	}
}

// notPosted: a WR record of an older shim, written after the post, that
// says the WR was not posted (ok=0).
func notPosted(r Record) bool { return r.Has("ok") && r.Uint("ok") != 1 }

// post adds a WR the thread of r is posting to q. The shim records a
// post's WRs before the provider sees them, so they count at once (a
// completion may be polled before the post returns); an unposted record
// from the same thread takes back those that were not posted.
func (a *analysis) post(p *proc, r Record, q *queue, w wr) {
	p.sum.Posted++
	w.tid = r.TID
	a.lastPost[r.TID] = q
	push(q, w, r.T)
}

// unpost takes back the last n WRs thread tid recorded for q, whose post
// failed (bad_wr and those after it); it returns how many it found. Their
// CQ's most outstanding, when they raised it, is lowered by them, never
// below what it was before the first of them.
func unpost(q *queue, tid, n int) int {
	var first wr
	k := 0
	for i := len(q.wrs) - 1; i >= 0 && k < n; i-- {
		if q.wrs[i].tid == tid {
			first = q.wrs[i]
			q.wrs = append(q.wrs[:i], q.wrs[i+1:]...)
			k++
		}
	}
	if c := q.cq; c != nil && k > 0 {
		c.outstanding -= k
		if c.maxOut > first.prevMax {
			c.maxOut = max(c.maxOut-k, c.outstanding)
			if c.maxOut <= first.prevMax {
				c.maxOut, c.maxAt = first.prevMax, first.prevAt
			}
		}
	}
	return k
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
	recvQ := q.recvQueue()
	var cands []*queue
	switch {
	case status == ibv.WCSuccess && op&ibv.WCOpcode(128) != 0:
		// opcode is valid on success only (ibv_poll_cq(3))
		cands = []*queue{recvQ}
	case status == ibv.WCSuccess:
		cands = []*queue{&q.sq}
	default:
		if q.sq.cq == c {
			cands = append(cands, &q.sq)
		}
		if q.srq != nil || q.rq.cq == c {
			cands = append(cands, recvQ)
		}
	}
	var found []*queue
	var at []int
	for _, cand := range cands {
		if i := indexOf(cand, id, status == ibv.WCSuccess); i >= 0 {
			found, at = append(found, cand), append(at, i)
		}
	}
	switch len(found) {
	case 1:
		retire(found[0], at[0], !late)
	case 2:
		// both queues hold a WR with this wr_id: which one completed is
		// decided at the end, by the counts (resolve)
		if q.amb == nil {
			q.amb = map[uint64]int{}
		}
		q.amb[id]++
		if !late {
			c.add(-1, 0)
		}
	}
}

// resolve attributes q's ambiguous flushed completions where the counts
// allow only one answer: when one queue has no WR left with that wr_id, they
// were the other queue's; when they are as many as the WRs left with it on
// both queues, they retire them all. Otherwise the wr_id is unjudged.
func resolve(q *qp) {
	ids := make([]uint64, 0, len(q.amb))
	for id := range q.amb {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	recvQ := q.recvQueue()
	for _, id := range ids {
		k, s, r := q.amb[id], count(&q.sq, id), count(recvQ, id)
		switch {
		case s == 0 || r == 0 || k >= s+r:
			for _, qq := range []*queue{&q.sq, recvQ} {
				for ; k > 0; k-- {
					i := indexOf(qq, id, false)
					if i < 0 {
						break
					}
					retire(qq, i, false)
				}
			}
		default:
			if q.unjudged == nil {
				q.unjudged = map[uint64]bool{}
			}
			q.unjudged[id] = true
		}
	}
	q.amb = nil
}

func count(q *queue, id uint64) int {
	n := 0
	for _, w := range q.wrs {
		if w.id == id {
			n++
		}
	}
	return n
}

func (a *analysis) destroy(p *proc, r Record) {
	q := p.qps[r.Uint("qp")]
	if q == nil || r.Has("begin") || r.Int("ret") != 0 {
		return
	}
	q.destroyedAt, q.destroyedBy, q.destroySite = r.T, p, p.site(r, "ibv_destroy_qp")
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
		a.add(p, Finding{Kind: SRQDestroyedBeforeLastWQE, Device: q.dev, Object: fmt.Sprintf("qpn %d", q.qpn), Queue: "srq", At: a.at(d.at), Site: q.destroySite,
			Evidence: fmt.Sprintf("qpn %d (on SRQ 0x%x) %s before the program got IBV_EVENT_QP_LAST_WQE_REACHED for it; %s raises it (%s)", q.qpn, q.srq.ptr, ev, q.dev, know.Source)})
	}
}

// finish judges a set of objects when the last process holding them has
// ended: what its QPs and CQs left.
func (a *analysis) finish(set *objects) {
	last := set.holders[0] // whose end closed the uverbs file last
	for _, h := range set.holders[1:] {
		if h.end > last.end {
			last = h
		}
	}
	for _, q := range set.all {
		resolve(q)
		for _, qq := range []*queue{&q.sq, &q.rq} {
			if q.ex && qq == &q.sq || qq.cq != nil && qq.cq.ex {
				continue // completions or posts the shim does not see
			}
			a.leftover(q, qq, last)
		}
		if len(q.unjudged) > 0 {
			var ids []string
			for id := range q.unjudged {
				ids = append(ids, fmt.Sprintf("0x%x", id))
			}
			sort.Strings(ids)
			a.notes = append(a.notes, fmt.Sprintf("pid %d: qpn %d: flushed completions with wr_id %s came while its send and its receive queue both held WRs with that wr_id, and fewer than those WRs: a completion in error does not say its queue (its opcode is undefined, ibv_poll_cq(3)), so the WRs left with that wr_id are not judged", set.holders[0].pid, q.qpn, strings.Join(ids, ", ")))
		}
		if q.lateWCs > 0 {
			a.add(q.destroyedBy, Finding{Kind: CompletionForDestroyedQP, Device: q.dev, Object: fmt.Sprintf("qpn %d", q.qpn), Count: q.lateWCs, At: a.at(q.lateFirst), Site: q.destroySite,
				Evidence: fmt.Sprintf("%d completion(s) of qpn %d polled after it was destroyed, the first %v after ibv_destroy_qp", q.lateWCs, q.qpn, fmtDur(q.lateFirst-q.destroyedAt))})
		}
	}
	for _, c := range set.allCQs {
		if c.ex {
			continue
		}
		if c.maxOut > int(c.cqe) {
			a.add(c.creator, Finding{Kind: CQOverSize, Device: set.ctxDev[c.ctx], Object: fmt.Sprintf("cq 0x%x", c.ptr), Count: c.maxOut, At: a.at(c.maxAt), Site: c.created,
				Evidence: fmt.Sprintf("up to %d WRs outstanding whose completions go to this CQ of cqe %d", c.maxOut, c.cqe)})
		}
		if c.overrun != "" {
			a.add(c.creator, Finding{Kind: CQOverrun, Device: set.ctxDev[c.ctx], Object: fmt.Sprintf("cq 0x%x", c.ptr), At: a.at(c.overrunAt), Site: c.created,
				Evidence: fmt.Sprintf("the CQ (cqe %d) overran: %s", c.cqe, c.overrun)})
		}
	}
}

// finishProc judges what a process left of its own: events it did not
// acknowledge, completions of QPs it never saw.
func (a *analysis) finishProc(p *proc) {
	var keys []string
	for k, n := range p.pending {
		if n > 0 {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		a.add(p, Finding{Kind: EventNotAcked, Device: strings.Join(p.sum.Devices, ","), Object: p.pendDesc[k], Count: p.pending[k], At: a.at(p.pendAt[k]), Site: p.pendSite[k],
			Evidence: fmt.Sprintf("%d %s never acknowledged with ibv_ack_async_event before the process ended: destroying its object would block", p.pending[k], p.pendDesc[k])})
	}
	if n := a.unknownQPN[p.pid]; n > 0 {
		a.notes = append(a.notes, fmt.Sprintf("pid %d: %d completion(s) of QPs the trace never saw created (created before the shim, or through a path it does not see)", p.pid, n))
	}
}

// leftover judges the WRs still outstanding on one queue at the end of the
// QP: its destroy or, never destroyed, the end of last, the last process
// holding it (the kernel destroys the QP then, discarding its WRs as
// ibv_destroy_qp does).
func (a *analysis) leftover(q *qp, qq *queue, last *proc) {
	end, p, site := q.destroyedAt, q.destroyedBy, q.destroySite
	if end == 0 {
		end, p, site = last.end, last, q.created
	}
	var stale, other []wr
	for _, w := range qq.wrs {
		switch {
		case q.unjudged[w.id]:
		case w.inError && time.Duration(end-w.postedAt) >= a.o.FlushWait:
			stale = append(stale, w)
		default:
			other = append(other, w)
		}
	}
	obj := fmt.Sprintf("qpn %d", q.qpn)
	if len(stale) > 0 {
		how := "the process ended"
		if q.destroyedAt != 0 {
			how = "it was destroyed"
		}
		a.add(p, Finding{Kind: PostedInErrorNotFlushed, Device: q.dev, Object: obj, Queue: qq.name, Count: len(stale), At: a.at(stale[0].postedAt), Site: stale[0].site,
			Evidence: fmt.Sprintf("%d WR(s) posted to the %s queue of qpn %d in ERROR (first wr_id 0x%x, %v after ERROR) had no completion %v later, when %s", len(stale), qq.name, q.qpn, stale[0].id, fmtDur(stale[0].postedAt-q.errAt), fmtDur(end-stale[0].postedAt), how)})
	}
	if len(other) == 0 {
		return
	}
	when := "it never entered ERROR"
	if q.errAt != 0 {
		when = fmt.Sprintf("%v after ERROR", fmtDur(end-q.errAt))
	}
	ev := fmt.Sprintf("qpn %d destroyed with %d WR(s) outstanding on its %s queue (first wr_id 0x%x), %s; no completion of them was ever polled", q.qpn, len(other), qq.name, other[0].id, when)
	if q.destroyedAt == 0 {
		how := "exited"
		if !last.sum.Exited {
			how = "ended without exiting normally (killed, or _exit)"
		}
		ev = fmt.Sprintf("qpn %d was never destroyed: pid %d %s with %d WR(s) outstanding on its %s queue (first wr_id 0x%x), %s; the kernel destroys the QP when the process's last descriptor of the device closes, discarding those WRs as ibv_destroy_qp does", q.qpn, p.pid, how, len(other), qq.name, other[0].id, when)
	}
	a.add(p, Finding{Kind: DestroyedWithOutstanding, Device: q.dev, Object: obj, Queue: qq.name, Count: len(other), At: a.at(end), Site: site, Evidence: ev})
}

func (a *analysis) report() *Report {
	rep := &Report{Findings: a.findings, Notes: a.notes}
	for _, p := range a.order {
		// a forked child that did nothing (exec'd, say) is left out
		if len(p.sum.Devices) > 0 && (!p.forked || p.records > 1) {
			rep.Processes = append(rep.Processes, p.sum)
		}
	}
	if rep.Findings == nil {
		rep.Findings = []Finding{}
	}
	if rep.Notes == nil {
		rep.Notes = []string{}
	}
	rep.Suppressed = []Finding{}
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

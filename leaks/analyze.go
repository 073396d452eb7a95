package leaks

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Reason names why a finding was made.
type Reason string

// The reasons, in the order reports list them (docs/LEAKS.md explains each).
const (
	// StuckInError: user QPs of a live owner in ERR or SQE in every sample.
	StuckInError Reason = "stuck-in-error"
	// Orphaned: user QPs whose creator is gone in every sample; other
	// processes (the holders) keep their context alive.
	Orphaned Reason = "orphaned"
	// Growing: an owner whose QP count rises in every sample while more
	// and more of its QPs stay in error (QPs in error only for a moment, a
	// host creating and destroying them by the thousand, do not count).
	Growing Reason = "growing"
	// NearLimit: a device's QP count at or above the threshold of its
	// max_qp, or kernel IPoIB-CM QPs near the non-SRQ connection limit.
	NearLimit Reason = "near-limit"
	// Kernel: kernel-owned QPs in ERR or SQE in every sample.
	Kernel Reason = "kernel"
)

// Reasons lists every reason in report order.
func Reasons() []Reason { return []Reason{StuckInError, Orphaned, Growing, NearLimit, Kernel} }

func (r Reason) rank() int { return slices.Index(Reasons(), r) }

// Defaults of Options.
const (
	DefaultNearLimit = 0.9
	// DefaultIPoIBNonSRQLimit is ib_ipoib's max_nonsrq_conn_qp default
	// (drivers/infiniband/ulp/ipoib/ipoib_cm.c): without an SRQ, connected
	// mode rejects connections past it with IB_CM_REJ_NO_QP.
	DefaultIPoIBNonSRQLimit = 128
	// MinSamples is how many samples stuck-in-error, kernel and growing
	// need: one sample shows no dwell and no growth.
	MinSamples = 2
	// MinGrowingSamples is how many samples growing needs: two samples
	// can catch any busy process creating QPs.
	MinGrowingSamples = 3
)

// ipoibKernName is the kern_name of kernel IPoIB's QPs (KBUILD_MODNAME).
const ipoibKernName = "ib_ipoib"

// Options tune Analyze.
type Options struct {
	// NearLimit is the fraction of max_qp at which a device is near its
	// limit; 0 means DefaultNearLimit.
	NearLimit float64
	// Limits are the devices' max_qp, by device name.
	Limits map[string]Limit
	// IPoIBNonSRQLimit is ib_ipoib's max_nonsrq_conn_qp; 0 means
	// DefaultIPoIBNonSRQLimit.
	IPoIBNonSRQLimit int
}

// QPRef names one QP of a finding, with its state in the last sample.
type QPRef struct {
	Port  uint32 `json:"port,omitempty"`
	LQPN  uint32 `json:"lqpn"`
	Type  string `json:"type"`
	State string `json:"state"`
}

// Finding is one leak: a reason, the QPs it is about (none for a device
// near its limit), the evidence the samples show and what to do.
type Finding struct {
	Reason   Reason    `json:"reason"`
	Device   string    `json:"ifname"`
	Owner    *Process  `json:"owner,omitempty"`
	KernName string    `json:"kern_name,omitempty"`
	Holders  []Process `json:"holders,omitempty"`
	// HoldersCertain, on an orphaned finding, says whether Holders are
	// exactly the processes keeping its QPs, or the candidates.
	HoldersCertain *bool   `json:"holders_certain,omitempty"`
	QPs            []QPRef `json:"qps"`
	Evidence       string  `json:"evidence"`
	Remedy         string  `json:"remedy"`
}

// DeviceSummary is a device as the last sample saw it.
type DeviceSummary struct {
	Name string `json:"ifname"`
	// QPs is the device's QP count in the last sample.
	QPs int `json:"qps"`
	// MaxQP is the device's max_qp, 0 when unknown.
	MaxQP int `json:"max_qp,omitempty"`
	// MaxQPUnknown says why max_qp is not known.
	MaxQPUnknown string `json:"max_qp_unknown,omitempty"`
}

// Report is what Analyze found over a sequence of samples.
type Report struct {
	Samples  int             `json:"samples"`
	Start    time.Time       `json:"start"`
	End      time.Time       `json:"end"`
	Devices  []DeviceSummary `json:"devices"`
	Findings []Finding       `json:"findings"`
	// Notes say what the samples could not show (too few samples for a
	// reason, a max_qp that could not be read, the samples' own notes).
	Notes []string `json:"notes"`
}

// Window is the time the samples span: a lower bound of every dwell the
// report states.
func (r *Report) Window() time.Duration { return r.End.Sub(r.Start) }

// QPCount is the number of QPs the report's findings name, by reason.
func (r *Report) QPCount(reason Reason, device string) int {
	n := 0
	for _, f := range r.Findings {
		if f.Reason == reason && f.Device == device {
			n += len(f.QPs)
		}
	}
	return n
}

// qpKey identifies a QP across samples. The type is part of it because the
// kernel reuses QP numbers.
type qpKey struct {
	lqpn uint32
	typ  string
}

// track is one QP across the samples of a device.
type track struct {
	seen    int  // samples it was in
	errAll  bool // ERR or SQE in every sample it was in
	orphAll bool // no owner in every sample it was in
	last    *QP
	lastAt  int // the last sample it was in
	// errFrom is the first sample of its run in error up to lastAt, in
	// every sample from it on; -1 when it was not in error at lastAt.
	errFrom int
}

func inError(state string) bool { return state == "ERR" || state == "SQE" }

// Analyze reads a sequence of samples, oldest first, and reports the
// leaks they show. It never reports a QP only because it is busy or idle
// in RTS: every QP finding is backed by its state or its owner in every
// sample, and growth by the owner's counts in every sample.
func Analyze(samples []Sample, o Options) Report {
	if o.NearLimit <= 0 {
		o.NearLimit = DefaultNearLimit
	}
	if o.IPoIBNonSRQLimit <= 0 {
		o.IPoIBNonSRQLimit = DefaultIPoIBNonSRQLimit
	}
	r := Report{Samples: len(samples), Devices: []DeviceSummary{}, Findings: []Finding{}, Notes: []string{}}
	if len(samples) == 0 {
		return r
	}
	r.Start, r.End = samples[0].At, samples[len(samples)-1].At
	n := len(samples)
	if n < MinSamples {
		r.Notes = append(r.Notes, fmt.Sprintf("%d sample: stuck-in-error, kernel and growing need at least %d", n, MinSamples))
	} else if n < MinGrowingSamples {
		r.Notes = append(r.Notes, fmt.Sprintf("%d samples: growing needs at least %d", n, MinGrowingSamples))
	}

	for _, s := range samples {
		for _, note := range s.Notes {
			if !slices.Contains(r.Notes, note) {
				r.Notes = append(r.Notes, note)
			}
		}
	}
	for _, dev := range deviceNames(samples) {
		a := newDeviceAnalysis(dev, samples)
		r.Devices = append(r.Devices, a.summary(o.Limits[dev]))
		if lim, ok := o.Limits[dev]; ok && lim.MaxQP == 0 && lim.Unknown != "" {
			r.Notes = append(r.Notes, fmt.Sprintf("%s: max_qp unknown (%s): near-limit checks only IPoIB-CM", dev, lim.Unknown))
		}
		r.Findings = append(r.Findings, a.findings(&r, o)...)
	}
	slices.SortStableFunc(r.Findings, func(a, b Finding) int {
		return cmp.Or(cmp.Compare(a.Reason.rank(), b.Reason.rank()), cmp.Compare(a.Device, b.Device),
			cmp.Compare(ownerPID(a), ownerPID(b)), cmp.Compare(a.KernName, b.KernName), cmp.Compare(firstLQPN(a), firstLQPN(b)))
	})
	return r
}

func ownerPID(f Finding) int {
	if f.Owner == nil {
		return 0
	}
	return f.Owner.PID
}

func firstLQPN(f Finding) uint32 {
	if len(f.QPs) == 0 {
		return 0
	}
	return f.QPs[0].LQPN
}

// deviceNames lists the devices of every sample, in first-seen order.
func deviceNames(samples []Sample) []string {
	var names []string
	for _, s := range samples {
		for _, d := range s.Devices {
			if !slices.Contains(names, d.Name) {
				names = append(names, d.Name)
			}
		}
	}
	return names
}

// ownerCounts are an owner's QPs and QPs in error, one entry per sample,
// and settled: in entry i, its QPs in error in sample i and in every later
// one (by the owner of their last sample).
type ownerCounts struct {
	owner               Process
	qps, inErr, settled []int
}

// deviceAnalysis is one device across the samples.
type deviceAnalysis struct {
	name    string
	n       int // samples
	tracks  map[qpKey]*track
	order   []qpKey // first-seen order
	owners  map[int]*ownerCounts
	maxQPs  int // the most QPs any sample saw
	lastQPs int
	ipoibRC int // kernel IPoIB RC QPs, the most any sample saw
}

func newDeviceAnalysis(name string, samples []Sample) *deviceAnalysis {
	a := &deviceAnalysis{name: name, n: len(samples), tracks: map[qpKey]*track{}, owners: map[int]*ownerCounts{}}
	for i, s := range samples {
		var qps []QP
		for _, d := range s.Devices {
			if d.Name == name {
				qps = d.QPs
				break
			}
		}
		a.maxQPs = max(a.maxQPs, len(qps))
		a.lastQPs = len(qps)
		ipoib := 0
		for j := range qps {
			q := &qps[j]
			k := qpKey{q.LQPN, q.Type}
			t := a.tracks[k]
			if t == nil {
				t = &track{errAll: true, orphAll: true, lastAt: -1, errFrom: -1}
				a.tracks[k] = t
				a.order = append(a.order, k)
			}
			if t.seen == i { // present in every sample so far
				t.seen++
			}
			switch {
			case !inError(q.State):
				t.errFrom = -1
			case t.errFrom < 0 || t.lastAt != i-1:
				t.errFrom = i
			}
			t.lastAt = i
			t.errAll = t.errAll && inError(q.State)
			// Orphaned needs the creator proven gone, not unknown.
			t.orphAll = t.orphAll && !q.Kernel() && q.Owner.PID == 0 && !q.OwnerUncertain
			t.last = q
			if q.KernName == ipoibKernName && q.Type == "RC" {
				ipoib++
			}
			if q.Kernel() || q.Owner.PID == 0 {
				continue
			}
			oc := a.owners[q.Owner.PID]
			if oc == nil {
				oc = &ownerCounts{owner: q.Owner, qps: make([]int, len(samples)), inErr: make([]int, len(samples)), settled: make([]int, len(samples))}
				a.owners[q.Owner.PID] = oc
			}
			oc.qps[i]++
			if inError(q.State) {
				oc.inErr[i]++
			}
		}
		a.ipoibRC = max(a.ipoibRC, ipoib)
	}
	for _, t := range a.tracks {
		q := t.last
		if t.lastAt != a.n-1 || t.errFrom < 0 || q.Kernel() || a.owners[q.Owner.PID] == nil {
			continue
		}
		for i := t.errFrom; i < a.n; i++ {
			a.owners[q.Owner.PID].settled[i]++
		}
	}
	return a
}

func (a *deviceAnalysis) summary(lim Limit) DeviceSummary {
	return DeviceSummary{Name: a.name, QPs: a.lastQPs, MaxQP: lim.MaxQP, MaxQPUnknown: lim.Unknown}
}

// growing reports whether the owner's QP count rose between every two
// samples and more of its QPs stayed in error from the next-to-last sample
// to the last than from the first: QPs that are in error in the last
// sample alone may be on their way to ibv_destroy_qp, and counting them
// made a finding of churn alone.
func (oc *ownerCounts) growing() bool {
	n := len(oc.qps)
	if n < MinGrowingSamples {
		return false
	}
	for i := 1; i < n; i++ {
		if oc.qps[i] <= oc.qps[i-1] {
			return false
		}
	}
	return oc.settled[n-2] > oc.settled[0]
}

// group collects the QPs of one finding.
type group struct{ f Finding }

func (a *deviceAnalysis) findings(r *Report, o Options) []Finding {
	window := r.Window().Round(time.Millisecond)
	growing := map[int]bool{}
	var out []Finding
	for pid, oc := range a.owners {
		if oc.growing() {
			growing[pid] = true
		}
	}
	groups := map[string]*group{}
	var order []string
	add := func(key string, f Finding, q *QP) {
		g := groups[key]
		if g == nil {
			g = &group{f: f}
			groups[key] = g
			order = append(order, key)
		}
		g.f.QPs = append(g.f.QPs, QPRef{Port: q.Port, LQPN: q.LQPN, Type: q.Type, State: q.State})
	}
	for _, k := range a.order {
		t := a.tracks[k]
		if t.seen != a.n {
			continue // not in every sample: it came or went during the window
		}
		q := t.last
		switch {
		case t.orphAll:
			// One finding per holder set: each is freed by its own holders.
			certain := q.HoldersCertain
			add(fmt.Sprintf("o%v:%s", certain, pidList(q.Holders)), Finding{Reason: Orphaned, Device: a.name, Holders: q.Holders, HoldersCertain: &certain}, q)
		case !t.errAll || a.n < MinSamples:
		case q.Kernel():
			add("k"+q.KernName, Finding{Reason: Kernel, Device: a.name, KernName: q.KernName}, q)
		case q.Owner.PID != 0 && growing[q.Owner.PID]:
			// Part of the owner's growing finding.
		case q.Owner.PID != 0:
			owner := q.Owner
			add("s"+strconv.Itoa(owner.PID), Finding{Reason: StuckInError, Device: a.name, Owner: &owner}, q)
		}
	}
	for _, key := range order {
		g := groups[key]
		f := g.f
		states := stateCounts(f.QPs)
		switch f.Reason {
		case Orphaned:
			f.Evidence = fmt.Sprintf("%d QPs (%s) had no live creator in each of %d samples over %v", len(f.QPs), states, a.n, window)
			switch {
			case len(f.Holders) > 0 && *f.HoldersCertain:
				f.Evidence += "; their context is held by " + procList(f.Holders)
				f.Remedy = "the QPs go when the last holder closes the device: stop the holders (" + reapCmds(f.Holders) + ")"
			case len(f.Holders) > 0:
				f.Evidence += "; their context is held by one or more of " + procList(f.Holders) + " (which one is not provable here)"
				f.Remedy = "the QPs go when the last holder closes the device; qpdrain qps -j lists each QP's candidates; stop the holder (" + reapCmds(f.Holders) + ")"
			default:
				f.Evidence += "; no process visible here holds the device"
				f.Remedy = "run qpdrain in the host's PID namespace (hostPID) to see the holders; the QPs go when the last one closes the device"
			}
		case StuckInError:
			f.Evidence = fmt.Sprintf("%d QPs (%s) in each of %d samples: in error for at least %v, where a drain takes milliseconds", len(f.QPs), states, a.n, window)
			f.Remedy = fmt.Sprintf("%s must drain and destroy them (ibv_destroy_qp); to free them now: qpdrain reap --pid %d", procList([]Process{*f.Owner}), f.Owner.PID)
		case Kernel:
			f.Evidence = fmt.Sprintf("%d %s QPs (%s) in each of %d samples: in error for at least %v", len(f.QPs), f.KernName, states, a.n, window)
			f.Remedy = kernelRemedy(a.name, f.KernName)
		}
		out = append(out, f)
	}
	for pid := range growing {
		oc := a.owners[pid]
		owner := oc.owner
		f := Finding{Reason: Growing, Device: a.name, Owner: &owner, QPs: []QPRef{}}
		for _, k := range a.order {
			t := a.tracks[k]
			if q := t.last; t.seen == a.n && t.errAll && q.Owner.PID == pid {
				f.QPs = append(f.QPs, QPRef{Port: q.Port, LQPN: q.LQPN, Type: q.Type, State: q.State})
			}
		}
		f.Evidence = fmt.Sprintf("QPs of %s in %d samples over %v: %s; in error: %s; %d in error throughout",
			procList([]Process{owner}), a.n, window, intList(oc.qps), intList(oc.inErr), len(f.QPs))
		f.Remedy = fmt.Sprintf("the owner creates QPs and leaves failed ones in error (a connect that fails without ibv_destroy_qp): fix its error path; to free them now: qpdrain reap --pid %d", pid)
		out = append(out, f)
	}
	if lim := o.Limits[a.name]; lim.MaxQP > 0 {
		if at := int(math.Ceil(o.NearLimit * float64(lim.MaxQP))); a.maxQPs >= at {
			out = append(out, Finding{Reason: NearLimit, Device: a.name, QPs: []QPRef{},
				Evidence: fmt.Sprintf("up to %d QPs in %d samples; max_qp %d; threshold %d (%g of max_qp)", a.maxQPs, a.n, lim.MaxQP, at, o.NearLimit),
				Remedy:   fmt.Sprintf("new QPs will fail with ENOMEM at max_qp: find the owners with the most QPs (qpdrain qps --summary, rdma resource show qp link %s) and the leaks above", a.name)})
		}
	}
	if at := int(math.Ceil(o.NearLimit * float64(o.IPoIBNonSRQLimit))); a.ipoibRC > 0 && a.ipoibRC >= at {
		out = append(out, Finding{Reason: NearLimit, Device: a.name, KernName: ipoibKernName, QPs: []QPRef{},
			Evidence: fmt.Sprintf("up to %d IPoIB-CM RC QPs in %d samples; without an SRQ, ib_ipoib rejects connections past max_nonsrq_conn_qp %d (threshold %d)", a.ipoibRC, a.n, o.IPoIBNonSRQLimit, at),
			Remedy:   kernelRemedy(a.name, ipoibKernName)})
	}
	return out
}

// kernelRemedy is what frees the QPs of a kernel module on a device.
func kernelRemedy(dev, kern string) string {
	if kern == ipoibKernName {
		return fmt.Sprintf("take the IPoIB interface of %s down and up (ls /sys/class/infiniband/%s/device/net; ip link set dev IF down; ip link set dev IF up): ipoib_cm_dev_stop reaps its connected-mode QPs in error after at most 5 s", dev, dev)
	}
	return fmt.Sprintf("the kernel module %s owns them: no process can free them; unloading the module or removing the device (rdma link delete %s, for rxe) does", kern, dev)
}

func procList(ps []Process) string {
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = fmt.Sprintf("pid %d (%s%s)", p.PID, p.Comm, p.in())
	}
	return strings.Join(parts, ", ")
}

func pidList(ps []Process) string {
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = strconv.Itoa(p.PID)
	}
	return strings.Join(parts, ",")
}

func reapCmds(ps []Process) string {
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = fmt.Sprintf("qpdrain reap --pid %d", p.PID)
	}
	return strings.Join(parts, "; ")
}

func intList(v []int) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = strconv.Itoa(x)
	}
	return strings.Join(parts, ", ")
}

// stateCounts is "3 ERR, 1 RTS" for a finding's QPs.
func stateCounts(qps []QPRef) string {
	counts := map[string]int{}
	var states []string
	for _, q := range qps {
		if counts[q.State] == 0 {
			states = append(states, q.State)
		}
		counts[q.State]++
	}
	slices.Sort(states)
	parts := make([]string, len(states))
	for i, s := range states {
		parts[i] = fmt.Sprintf("%d %s", counts[s], s)
	}
	return strings.Join(parts, ", ")
}

// Package reap frees the QPs a process keeps alive by ending it, and proves
// through RDMA netlink that they went. No call destroys another process's
// QP: a QP is freed when the last holder of its device context closes it
// (process exit) or the device goes away. So reap plans from one sample of
// the host (package leaks, read through rdmanl/inventory) which QPs the
// target alone provably holds, signals it, and samples again until those
// QPs have left netlink or the wait is over. The QPs it may keep alive
// (shared with other holders, or as one of a context's unproven candidate
// holders) are not waited for, but a result says which of them went too.
//
// qpdrain reap is this package behind flags; an operator's controller can
// call it with its own leaks.Sampler and signaller.
package reap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/qpdrain/qpdrain/leaks"
	"github.com/qpdrain/qpdrain/rdmanl/inventory"
)

// ErrRefused is a target reap will not act on; the error's text says why.
var ErrRefused = errors.New("refused")

// Poll is how often Wait samples the host.
const Poll = 100 * time.Millisecond

// QP is one QP a reap acts on.
type QP struct {
	Device string `json:"ifname"`
	leaks.QPRef
	// Held: the target keeps it alive without owning it.
	Held bool `json:"held,omitempty"`
	// Why a QP the target may keep alive is not waited for.
	Why string `json:"why,omitempty"`
	// owner is the QP's live owner when planned, 0 for none.
	owner int
}

// NewQP is q of device dev as reap lists it.
func NewQP(dev string, q leaks.QP) QP {
	return QP{Device: dev, QPRef: leaks.QPRef{Port: q.Port, LQPN: q.LQPN, Type: q.Type, State: q.State}, owner: q.Owner.PID}
}

// Plan is what signalling a process would free.
type Plan struct {
	Process leaks.Process
	// QPs are the user QPs whose context the process alone provably
	// holds: they go when it exits.
	QPs []QP
	// MayKeep are the user QPs it may keep alive: it shares their context
	// with other holders, or is one of the candidate holders of a context
	// whose holders are not proven. Why says which.
	MayKeep []QP
}

// Empty reports whether the process holds no QP's context.
func (p *Plan) Empty() bool { return len(p.QPs) == 0 && len(p.MayKeep) == 0 }

// PlanPID splits the user QPs of s that p keeps alive into those it alone
// provably holds and those it may keep alive.
func PlanPID(s leaks.Sample, p leaks.Process) Plan {
	plan := Plan{Process: p, QPs: []QP{}, MayKeep: []QP{}}
	for _, d := range s.Devices {
		for _, q := range d.QPs {
			if q.Kernel() || !slices.ContainsFunc(q.Holders, func(h leaks.Process) bool { return h.PID == p.PID }) {
				continue
			}
			r := NewQP(d.Name, q)
			r.Held = q.Owner.PID != p.PID
			switch {
			case q.HoldersCertain && len(q.Holders) == 1:
				plan.QPs = append(plan.QPs, r)
			case q.HoldersCertain:
				r.Why = "also held by " + otherHolders(q.Holders, p.PID)
				plan.MayKeep = append(plan.MayKeep, r)
			default:
				r.Why = "held by one or more of " + otherHolders(q.Holders, 0)
				plan.MayKeep = append(plan.MayKeep, r)
			}
		}
	}
	return plan
}

// otherHolders is "pid 20 (child), pid 30 (other)" without pid.
func otherHolders(hs []leaks.Process, pid int) string {
	var parts []string
	for _, h := range hs {
		if h.PID != pid {
			parts = append(parts, fmt.Sprintf("pid %d (%s)", h.PID, h.Comm))
		}
	}
	return strings.Join(parts, ", ")
}

// Remaining are the QPs of qps still in s: the same QP, owned by no live
// process, by pid or by its owner when planned (the kernel reuses QP
// numbers: a new QP of another process is not the one planned).
func Remaining(s leaks.Sample, qps []QP, pid int) []QP {
	type key struct {
		dev  string
		lqpn uint32
		typ  string
	}
	now := map[key]int{}
	for _, d := range s.Devices {
		for _, q := range d.QPs {
			now[key{d.Name, q.LQPN, q.Type}] = q.Owner.PID
		}
	}
	out := []QP{}
	for _, t := range qps {
		if o, ok := now[key{t.Device, t.LQPN, t.Type}]; ok && (o == 0 || o == pid || o == t.owner) {
			out = append(out, t)
		}
	}
	return out
}

// Gone are the QPs of qps not in rest.
func gone(qps, rest []QP) []QP {
	out := []QP{}
	for _, q := range qps {
		if !slices.ContainsFunc(rest, func(r QP) bool { return r.Device == q.Device && r.LQPN == q.LQPN && r.Type == q.Type }) {
			out = append(out, q)
		}
	}
	return out
}

// Proof is what the samples after an action showed.
type Proof struct {
	// Remaining are the QPs waited for that the last sample still showed
	// (all of them when no sample was read before the wait ended).
	Remaining []QP
	// Last is the last sample read: empty when the host was left without
	// RDMA devices, nil when none was read.
	Last *leaks.Sample
	// Waited is from the start of the wait to its end.
	Waited time.Duration
}

// Wait samples src every Poll until left reports nothing or wait has
// passed. A host left without RDMA devices has none of the QPs left; a
// wait over before any sample was read leaves all of qps.
func Wait(ctx context.Context, src leaks.Sampler, wait time.Duration, qps []QP, left func(leaks.Sample) []QP) (Proof, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	p := Proof{Remaining: qps}
	for {
		s, err := src.Sample(ctx)
		switch {
		case errors.Is(err, leaks.ErrNoRDMA):
			p.Remaining, p.Last, p.Waited = []QP{}, &leaks.Sample{At: time.Now()}, time.Since(start)
			return p, nil
		case err != nil && ctx.Err() != nil:
			// The wait is over; Remaining is what the last sample showed.
			p.Waited = time.Since(start)
			return p, nil
		case err != nil:
			return Proof{}, fmt.Errorf("reading the host's QPs: %w", err)
		}
		p.Remaining, p.Last = left(s), &s
		if len(p.Remaining) == 0 {
			p.Remaining, p.Waited = []QP{}, time.Since(start)
			return p, nil
		}
		select {
		case <-ctx.Done():
			p.Waited = time.Since(start)
			return p, nil
		case <-time.After(Poll):
		}
	}
}

// Signaller sends a signal to a process.
type Signaller interface {
	Signal(pid int, sig syscall.Signal) error
}

// Result is what signalling a planned process did.
type Result struct {
	// Freed is how many of the plan's QPs left RDMA netlink.
	Freed int
	// Remaining are the plan's QPs still there when the wait ended.
	Remaining []QP
	// MayKeepGone are the QPs of the plan's MayKeep that left too, seen
	// in the last sample: they were not waited for, so this is what the
	// wait happened to see, not all that went.
	MayKeepGone []QP
	Waited      time.Duration
}

// Signal sends sig to the plan's process, then samples src until the QPs
// it alone held have left RDMA netlink or wait has passed.
func Signal(ctx context.Context, src leaks.Sampler, sig Signaller, plan *Plan, signal syscall.Signal, wait time.Duration) (Result, error) {
	pid := plan.Process.PID
	if err := sig.Signal(pid, signal); err != nil {
		return Result{}, err
	}
	p, err := Wait(ctx, src, wait, plan.QPs, func(s leaks.Sample) []QP { return Remaining(s, plan.QPs, pid) })
	if err != nil {
		return Result{}, err
	}
	r := Result{Freed: len(plan.QPs) - len(p.Remaining), Remaining: p.Remaining, MayKeepGone: []QP{}, Waited: p.Waited}
	if p.Last != nil {
		r.MayKeepGone = gone(plan.MayKeep, Remaining(*p.Last, plan.MayKeep, pid))
	}
	return r, nil
}

// pfKthread is PF_KTHREAD (include/linux/sched.h), bit of /proc/<pid>/stat's
// flags field.
const pfKthread = 0x00200000

// kernelThread reports whether pid is a kernel thread.
func kernelThread(procRoot string, pid int) (bool, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return false, err
	}
	// Fields after the parenthesised comm, which may hold spaces: state is
	// field 3, flags field 9 (proc_pid_stat(5)).
	i := strings.LastIndexByte(string(b), ')')
	fields := strings.Fields(string(b[i+1:]))
	if i < 0 || len(fields) < 7 {
		return false, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	flags, err := strconv.ParseUint(fields[6], 10, 64)
	if err != nil {
		return false, fmt.Errorf("/proc/%d/stat: flags %q: %w", pid, fields[6], err)
	}
	return flags&pfKthread != 0, nil
}

// CheckPID refuses, with ErrRefused, the pids reap must never signal
// (init, the calling process, a thread that is not its process's leader,
// a kernel thread), reading /proc under procRoot ("/proc" when empty), and
// names the process.
func CheckPID(procRoot string, pid int) (leaks.Process, error) {
	if procRoot == "" {
		procRoot = "/proc"
	}
	switch {
	case pid == 1:
		return leaks.Process{}, fmt.Errorf("pid 1 is init, and ending it ends the host: %w", ErrRefused)
	case pid == os.Getpid():
		return leaks.Process{}, fmt.Errorf("pid %d is qpdrain itself: %w", pid, ErrRefused)
	}
	t, err := inventory.Proc{Root: procRoot}.Task(uint32(pid))
	if err != nil {
		return leaks.Process{}, err
	}
	if int(t.TGID) != pid {
		return leaks.Process{}, fmt.Errorf("pid %d is a thread of process %d (%s): signal the process (--pid %d): %w", pid, t.TGID, t.Comm, t.TGID, ErrRefused)
	}
	kt, err := kernelThread(procRoot, pid)
	if err != nil {
		return leaks.Process{}, err
	}
	if kt {
		return leaks.Process{}, fmt.Errorf("pid %d (%s) is a kernel thread: its QPs are kernel QPs, which only their module frees (see qpdrain leaks): %w", pid, t.Comm, ErrRefused)
	}
	return leaks.Process{PID: pid, Comm: t.Comm}, nil
}

package leaks

import "github.com/qpdrain/qpdrain/workload"

// Workload is the workload the QP belongs to: its owner's, else (its
// creator gone) the first of its holders' that is known; nil for a kernel
// QP and when no cgroup was read.
func (q *QP) Workload() *workload.Workload {
	if q.Kernel() {
		return nil
	}
	return firstWorkload(q.Owner, q.Holders)
}

// Workload is the workload whose QPs the finding names, chosen as
// QP.Workload chooses.
func (f *Finding) Workload() *workload.Workload {
	if f.KernName != "" {
		return nil
	}
	var owner Process
	if f.Owner != nil {
		owner = *f.Owner
	}
	return firstWorkload(owner, f.Holders)
}

func firstWorkload(owner Process, holders []Process) *workload.Workload {
	if owner.PID != 0 {
		return owner.Workload
	}
	for _, h := range holders {
		if h.Workload != nil {
			return h.Workload
		}
	}
	return nil
}

// in names the process's pod (", pod <uid>") or, outside Kubernetes, its
// systemd unit, for evidence text; empty when unknown.
func (p Process) in() string {
	switch w := p.Workload; {
	case w == nil:
		return ""
	case w.PodUID != "":
		return ", pod " + w.PodUID
	case w.Unit != "":
		return ", " + w.Unit
	}
	return ""
}

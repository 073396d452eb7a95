package inventory

import "github.com/qpdrain/qpdrain/workload"

// fillWorkloads sets the workload of every owner and holder in snap,
// reading each process's /proc/<pid>/cgroup once. A process whose cgroup
// cannot be read (it exited, or this reader may not see it) has none. The
// QPs' holders share their device's slice, so setting the devices' sets
// theirs.
func fillWorkloads(snap *Snapshot, p Proc) {
	cache := map[uint32]*workload.Workload{}
	get := func(pid uint32) *workload.Workload {
		w, ok := cache[pid]
		if !ok {
			if v, err := workload.Read(p.Root, pid); err == nil {
				w = &v
			}
			cache[pid] = w
		}
		return w
	}
	for i := range snap.QPs {
		if o := snap.QPs[i].Owner; o != nil && o.Via != FromKernel {
			o.Workload = get(o.PID)
		}
	}
	for i := range snap.Devices {
		for j := range snap.Devices[i].Holders {
			h := &snap.Devices[i].Holders[j]
			h.Workload = get(h.PID)
		}
	}
}

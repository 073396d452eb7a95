package main

import (
	"fmt"
	"path"
	"strings"

	"github.com/qpdrain/qpdrain/rdmanl/inventory"
	"github.com/qpdrain/qpdrain/workload"
)

// workloadQPFilters are qps's filters on a QP's workload, beyond rdma's:
// cgroup PATH (the cgroup or one below it) and pod UID (the dashes or the
// systemd driver's underscores), each a comma-separated list. A QP's
// workload is its owner's; a QP whose creator is gone has those of the
// processes that hold its device.
var workloadQPFilters = map[string]func(val string) (func(*inventory.QP) bool, error){
	"cgroup": func(val string) (func(*inventory.QP) bool, error) {
		paths, err := filterList("cgroup", val)
		if err != nil {
			return nil, err
		}
		for i, p := range paths {
			if !strings.HasPrefix(p, "/") {
				return nil, fmt.Errorf("filter cgroup %q: %q is not a cgroup path (/system.slice, /kubepods/...)", val, p)
			}
			paths[i] = path.Clean(p)
		}
		return anyWorkload(func(w *workload.Workload) bool {
			for _, p := range paths {
				if w.Path == p || p == "/" || strings.HasPrefix(w.Path, p+"/") {
					return true
				}
			}
			return false
		}), nil
	},
	"pod": func(val string) (func(*inventory.QP) bool, error) {
		uids, err := filterList("pod", val)
		if err != nil {
			return nil, err
		}
		for i, u := range uids {
			uids[i] = strings.ToLower(strings.ReplaceAll(u, "_", "-"))
		}
		return anyWorkload(func(w *workload.Workload) bool { return w.PodUID != "" && contains(uids, w.PodUID) }), nil
	},
}

func filterList(name, val string) ([]string, error) {
	list := strings.Split(val, ",")
	for _, v := range list {
		if v == "" {
			return nil, fmt.Errorf("filter %s %q: empty word in the list", name, val)
		}
	}
	return list, nil
}

// anyWorkload matches a QP one of whose workloads passes ok.
func anyWorkload(ok func(*workload.Workload) bool) func(*inventory.QP) bool {
	return func(q *inventory.QP) bool {
		for _, w := range qpWorkloads(q) {
			if ok(w) {
				return true
			}
		}
		return false
	}
}

// qpWorkloads are the workloads a QP belongs to: its owner's, else (its
// creator gone, or a zombie that closed its files) its holders'. A kernel
// QP has none.
func qpWorkloads(q *inventory.QP) []*workload.Workload {
	if q.Owner != nil && q.Owner.Via == inventory.FromKernel {
		return nil
	}
	if q.Owner != nil && !q.Owner.Zombie && q.Owner.Workload != nil {
		return []*workload.Workload{q.Owner.Workload}
	}
	var out []*workload.Workload
	for _, h := range q.Holders {
		if h.Workload != nil {
			out = append(out, h.Workload)
		}
	}
	return out
}

// appendWorkload adds a workload to a text line: the pod where the path
// names one, else the cgroup path, then the container (as Kubernetes
// spells containerID). -j has the whole path and the rest.
func appendWorkload(b []byte, w *workload.Workload) []byte {
	if w == nil {
		return b
	}
	if w.PodUID != "" {
		b = append(b, " pod "...)
		b = append(b, w.PodUID...)
	} else {
		b = append(b, " cgroup "...)
		b = append(b, w.Path...)
	}
	if c := w.Container(); c != "" {
		b = append(b, " container "...)
		b = append(b, c...)
	}
	return b
}

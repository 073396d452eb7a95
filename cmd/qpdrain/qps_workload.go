package main

import (
	"github.com/qpdrain/qpdrain/workload"
)

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

// Package workload names the workload a process runs in from its cgroup:
// the cgroup path of /proc/PID/cgroup (cgroup v2, or the unified hierarchy
// of a v1 host), and where the path's shape says so the systemd unit and
// slice, the container and its runtime, and the Kubernetes pod and its QoS
// class.
//
// The shapes are the ones the kubelet and the runtimes write, for both
// cgroup drivers:
//
//	systemd:  /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid, - as _>.slice/cri-containerd-<id>.scope
//	cgroupfs: /kubepods/burstable/pod<uid>/<id>
//
// (kubelet pkg/kubelet/cm/cgroup_manager_linux.go: CgroupName.ToSystemd
// joins the names with "-" after escaping each "-" to "_"; a Guaranteed
// pod's cgroup sits directly under kubepods, the others under burstable or
// besteffort). The runtimes name a container's scope cri-containerd-<id>
// (containerd), crio-<id> (CRI-O) and docker-<id> (Docker) under the
// systemd driver; under cgroupfs the container's cgroup is its bare id
// (containerd, cri-dockerd), crio-<id> (CRI-O), or /docker/<id> for Docker
// outside Kubernetes.
//
// Paths are as the reading process's cgroup namespace shows them
// (cgroup_namespaces(7)): a reader in a container with its own cgroup
// namespace sees others' paths relative to its root, with a leading "/.."
// per ancestor level; their pod and container still parse, but the levels
// above the common ancestor are not named.
package workload

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Runtime is a container runtime, spelled as Kubernetes prefixes a
// container ID with it (containerStatuses[].containerID "containerd://<id>").
type Runtime string

// The runtimes whose cgroup names say who they are.
const (
	Containerd Runtime = "containerd"
	CRIO       Runtime = "cri-o"
	Docker     Runtime = "docker"
)

// QoS is a pod's QoS class, spelled as Kubernetes' status.qosClass.
type QoS string

// The QoS classes, each with its own level of the kubelet's cgroups.
const (
	Guaranteed QoS = "Guaranteed"
	Burstable  QoS = "Burstable"
	BestEffort QoS = "BestEffort"
)

// Workload is what a cgroup path says about the processes in it. Fields
// the path does not show are empty.
type Workload struct {
	// Path is the cgroup path ("/system.slice/sshd.service").
	Path string `json:"path"`
	// Slice is the systemd slice that holds Unit ("system.slice").
	Slice string `json:"slice,omitempty"`
	// Unit is the systemd unit, the first service or scope on the path,
	// as sd_pid_get_unit(3) names it.
	Unit string `json:"unit,omitempty"`
	// ContainerID is the container's 64-hex-digit id.
	ContainerID string `json:"container_id,omitempty"`
	// Runtime is the container's runtime when the path names it (a bare id
	// under cgroupfs does not).
	Runtime Runtime `json:"runtime,omitempty"`
	// PodUID is the Kubernetes pod's UID (metadata.uid), with its dashes.
	PodUID string `json:"pod_uid,omitempty"`
	// QoS is the pod's QoS class; set with PodUID.
	QoS QoS `json:"qos_class,omitempty"`
}

// Top is the path's first segment ("/system.slice", "/kubepods"): the
// top-level cgroup, a label that stays bounded outside Kubernetes. The root
// cgroup's is "/".
func (w *Workload) Top() string {
	segs := segments(w.Path)
	for len(segs) > 0 && segs[0] == ".." {
		segs = segs[1:]
	}
	if len(segs) == 0 {
		return "/"
	}
	return "/" + segs[0]
}

// Container is the container as Kubernetes names it ("containerd://<id>"),
// the bare id when the runtime is unknown, or empty.
func (w *Workload) Container() string {
	if w.ContainerID == "" || w.Runtime == "" {
		return w.ContainerID
	}
	return string(w.Runtime) + "://" + w.ContainerID
}

// ErrNoCgroup means a /proc/PID/cgroup file has neither a cgroup v2 line
// ("0::PATH") nor a v1 name=systemd line to take the path from.
var ErrNoCgroup = errors.New("no cgroup v2 or name=systemd hierarchy")

// Read parses the cgroup file of process pid in the /proc tree proc
// ("/proc" when empty). Errors wrap the read's (fs.ErrNotExist when the
// process is gone) or ParseProcCgroup's.
func Read(proc string, pid uint32) (Workload, error) {
	if proc == "" {
		proc = "/proc"
	}
	b, err := os.ReadFile(filepath.Join(proc, strconv.FormatUint(uint64(pid), 10), "cgroup"))
	if err != nil {
		return Workload{}, fmt.Errorf("reading the cgroup of pid %d: %w", pid, err)
	}
	w, err := ParseProcCgroup(b)
	if err != nil {
		return Workload{}, fmt.Errorf("the cgroup of pid %d: %w", pid, err)
	}
	return w, nil
}

// ParseProcCgroup reads the content of a /proc/PID/cgroup file
// (cgroups(7): "hierarchy-ID:controller-list:cgroup-path" lines) and
// parses the cgroup v2 path: the "0::" line, present on v2 and on hybrid
// v1 hosts; a v1-only host's name=systemd line instead, which systemd and
// the kubelet's systemd driver lay out alike. It fails with ErrNoCgroup
// when there is neither, and on a malformed line.
func ParseProcCgroup(b []byte) (Workload, error) {
	var v1 string // the name=systemd line's path: never "", it starts with "/"
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		id, rest, ok1 := strings.Cut(line, ":")
		ctrl, p, ok2 := strings.Cut(rest, ":")
		if !ok1 || !ok2 || !strings.HasPrefix(p, "/") {
			return Workload{}, fmt.Errorf("cgroup line %q: want ID:CONTROLLERS:/PATH", line)
		}
		// The kernel marks a removed cgroup v2 with this suffix
		// (kernel/cgroup/cgroup.c, proc_cgroup_show).
		p = strings.TrimSuffix(p, " (deleted)")
		if id == "0" && ctrl == "" {
			return Parse(p), nil
		}
		if ctrl == "name=systemd" {
			v1 = p
		}
	}
	if err := sc.Err(); err != nil {
		return Workload{}, fmt.Errorf("reading cgroup lines: %w", err)
	}
	if v1 != "" {
		return Parse(v1), nil
	}
	return Workload{}, ErrNoCgroup
}

// Parse says what a cgroup path shows of its workload. Every path parses;
// one of no known shape has only Path (and Slice and Unit where systemd
// named them).
func Parse(path string) Workload {
	w := Workload{Path: path}
	// A path outside the reader's cgroup namespace starts with "..": the
	// kubepods level may be among the unnamed ancestors.
	kube := strings.HasPrefix(path, "/..")
	var qos QoS
	segs := segments(path)
	for i, seg := range segs {
		switch {
		case w.Unit == "" && (strings.HasSuffix(seg, ".service") || strings.HasSuffix(seg, ".scope")):
			w.Unit = seg
		case w.Unit == "" && strings.HasSuffix(seg, ".slice"):
			w.Slice = seg
		}
		if name, ok := strings.CutSuffix(seg, ".slice"); ok {
			// A systemd slice's name is its parents' joined with "-":
			// the innermost kubepods slice says it all.
			parts := strings.Split(name, "-")
			for i, part := range parts {
				if part != "kubepods" {
					continue
				}
				kube = true
				for _, p := range parts[i+1:] {
					if q, ok := qosLevel(p); ok {
						qos = q
					} else if uid, ok := podUID(p, true); ok {
						w.PodUID = uid
					}
				}
			}
			continue
		}
		if seg == "kubepods" {
			kube = true
			continue
		}
		if kube && w.PodUID == "" {
			if q, ok := qosLevel(seg); ok {
				qos = q
				continue
			}
			if uid, ok := podUID(seg, false); ok {
				w.PodUID = uid
				continue
			}
		}
		if w.ContainerID == "" {
			w.ContainerID, w.Runtime = container(seg)
			// Docker outside Kubernetes under cgroupfs: /docker/<id>.
			if w.ContainerID != "" && w.Runtime == "" && i > 0 && segs[i-1] == "docker" {
				w.Runtime = Docker
			}
		}
	}
	if w.PodUID != "" {
		w.QoS = cmp.Or(qos, Guaranteed)
	}
	return w
}

func segments(path string) []string {
	var out []string
	for s := range strings.SplitSeq(path, "/") {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

func qosLevel(s string) (QoS, bool) {
	switch s {
	case "burstable":
		return Burstable, true
	case "besteffort":
		return BestEffort, true
	}
	return "", false
}

// podUID reads "pod<uid>"; the systemd driver's names carry the UID's
// dashes as underscores. A UID is a UUID, or a static pod's 32 hex digits.
func podUID(s string, systemd bool) (string, bool) {
	uid, ok := strings.CutPrefix(s, "pod")
	if !ok {
		return "", false
	}
	if systemd {
		uid = strings.ReplaceAll(uid, "_", "-")
	}
	if len(uid) < 32 || len(uid) > 36 || !isHex(strings.ReplaceAll(uid, "-", "")) {
		return "", false
	}
	return uid, true
}

// container reads a container's cgroup name: a runtime's scope
// (cri-containerd-<id>.scope, crio-<id>.scope, docker-<id>.scope), CRI-O's
// cgroupfs crio-<id>, or a bare id (containerd and cri-dockerd under
// cgroupfs; the runtime is not in the name). CRI-O's crio-conmon-<id>.scope
// is its monitor, not the container.
func container(seg string) (string, Runtime) {
	name := strings.TrimSuffix(seg, ".scope")
	for _, r := range []struct {
		prefix string
		rt     Runtime
	}{{"cri-containerd-", Containerd}, {"crio-", CRIO}, {"docker-", Docker}} {
		if id, ok := strings.CutPrefix(name, r.prefix); ok && isContainerID(id) {
			return id, r.rt
		}
	}
	if isContainerID(seg) {
		return seg, ""
	}
	return "", ""
}

func isContainerID(s string) bool { return len(s) == 64 && isHex(s) }

func isHex(s string) bool {
	for _, c := range []byte(s) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return s != ""
}

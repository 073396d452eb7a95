package inventory

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/qpdrain/qpdrain/workload"
)

// Proc reads a /proc tree. Root is the directory that holds it ("/proc" when
// empty); tests point it at a recorded or synthetic tree.
type Proc struct {
	Root string
	// SameFile tells whether two processes' fds are one open file; nil
	// means kcmp(2) on the real /proc (Root "" or "/proc"), and no way to
	// tell on another tree.
	SameFile SameFileFunc
}

func (p Proc) sameFile() SameFileFunc {
	if p.SameFile != nil {
		return p.SameFile
	}
	if p.Root == "" || filepath.Clean(p.Root) == "/proc" {
		return kcmpSameFile
	}
	return nil
}

func (p Proc) path(elem ...string) string {
	root := p.Root
	if root == "" {
		root = "/proc"
	}
	return filepath.Join(append([]string{root}, elem...)...)
}

// Task is what /proc/<id>/status says about a thread or process.
type Task struct {
	// TGID is the process the task belongs to (its thread group leader).
	TGID uint32
	// Comm is the process's command name (/proc/<tgid>/comm).
	Comm string
	// Name is the task's own name: a thread's may differ from its process's.
	Name string
	// Zombie is set when the process has exited and not been reaped.
	Zombie bool
}

// ErrNoTask means no process or thread with that id exists (any more).
var ErrNoTask = errors.New("no such process or thread")

// Task describes the thread or process id, resolving a thread to its
// process: /proc/<tid> exists for every thread although readdir of /proc
// lists only processes.
func (p Proc) Task(id uint32) (Task, error) {
	b, err := os.ReadFile(p.path(strconv.FormatUint(uint64(id), 10), "status"))
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, os.ErrNotExist) {
		return Task{}, fmt.Errorf("reading task %d: %w", id, ErrNoTask)
	}
	if err != nil {
		return Task{}, fmt.Errorf("reading task %d: %w", id, err)
	}
	t := Task{TGID: id}
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "Tgid":
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return Task{}, fmt.Errorf("reading task %d: Tgid %q: %w", id, v, err)
			}
			t.TGID = uint32(n)
		case "State":
			t.Zombie = strings.HasPrefix(v, "Z")
		case "Name":
			t.Name, t.Comm = v, v
		}
	}
	// The status Name of a thread is the thread's; the process's comm is
	// what operators know it by, as rdma prints it.
	if t.TGID != id {
		if c, err := os.ReadFile(p.path(strconv.FormatUint(uint64(t.TGID), 10), "comm")); err == nil {
			t.Comm = strings.TrimSpace(string(c))
		}
	}
	return t, nil
}

// Holder is a process that holds an RDMA device's uverbs char device open
// (an fd on it) or mapped (its queues mmapped after the fd was closed):
// either keeps the device context, and every QP of it, alive.
type Holder struct {
	PID  uint32 `json:"pid"`
	Comm string `json:"comm"`
	// FDs are the process's file descriptors on the char device.
	FDs []int `json:"fds,omitempty"`
	// Mapped is set when the process holds the char device only through
	// mappings (/proc/<pid>/maps): it closed its fds but keeps the queues.
	// The maps of a process with an fd on a wanted device are not read.
	Mapped bool `json:"mapped,omitempty"`
	// Workload is what the process's cgroup says of it; nil when it could
	// not be read.
	Workload *workload.Workload `json:"cgroup,omitempty"`
}

// Holders scans every process for fds on, else mappings of, the char
// devices in paths ("/dev/infiniband/uverbs0"), and returns the holders of each
// path, by pid. Processes that vanish during the scan, or whose fds the
// caller may not read, are skipped: an unprivileged caller sees its own.
func (p Proc) Holders(paths []string) (map[string][]Holder, error) {
	want := make(map[string]bool, len(paths))
	for _, s := range paths {
		want[s] = true
	}
	ents, err := os.ReadDir(p.path())
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	out := map[string][]Holder{}
	for _, e := range ents {
		pid, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil {
			continue
		}
		held := map[string]*Holder{}
		get := func(path string) *Holder {
			h := held[path]
			if h == nil {
				h = &Holder{PID: uint32(pid)}
				held[path] = h
			}
			return h
		}
		fdDir := p.path(e.Name(), "fd")
		if fds, err := os.ReadDir(fdDir); err == nil {
			for _, fd := range fds {
				target, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
				if err != nil || !want[target] {
					continue
				}
				n, err := strconv.Atoi(fd.Name())
				if err != nil {
					continue
				}
				h := get(target)
				h.FDs = append(h.FDs, n)
			}
		}
		// A process with an fd on a wanted device holds it already; its maps
		// (two mappings per rxe QP: megabytes for a process with thousands)
		// are read only when it has none.
		if len(held) == 0 {
			if maps, err := os.ReadFile(p.path(e.Name(), "maps")); err == nil {
				for _, path := range mappedPaths(maps, want) {
					get(path).Mapped = true
				}
			}
		}
		if len(held) == 0 {
			continue
		}
		comm := ""
		if c, err := os.ReadFile(p.path(e.Name(), "comm")); err == nil {
			comm = strings.TrimSpace(string(c))
		}
		for path, h := range held {
			h.Comm = comm
			out[path] = append(out[path], *h)
		}
	}
	return out, nil
}

// mappedPaths returns the wanted paths that maps (a /proc/<pid>/maps file)
// maps, each once.
func mappedPaths(maps []byte, want map[string]bool) []string {
	var out []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(maps))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		i := bytes.IndexByte(line, '/')
		if i < 0 {
			continue
		}
		path := string(line[i:])
		if want[path] && !seen[path] {
			seen[path] = true
			out = append(out, path)
		}
	}
	return out
}

// Sys reads a sysfs tree. Root is the directory that holds it ("/sys" when
// empty).
type Sys struct {
	Root string
}

// UverbsDevices maps each uverbs char device ("uverbs0") to the RDMA
// device it belongs to ("rxe0"), from /sys/class/infiniband_verbs/*/ibdev.
func (s Sys) UverbsDevices() (map[string]string, error) {
	root := s.Root
	if root == "" {
		root = "/sys"
	}
	dir := filepath.Join(root, "class", "infiniband_verbs")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing uverbs devices: %w", err)
	}
	out := map[string]string{}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "uverbs") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "ibdev"))
		if err != nil {
			continue
		}
		out[e.Name()] = strings.TrimSpace(string(b))
	}
	return out, nil
}

// Package inventory is the host's view of RDMA: every QP on the machine,
// read through RDMA netlink (package rdmanl), with the process that owns
// it and the processes that hold its device open, read from /proc and
// sysfs.
//
// A QP's owner is found in three steps, because the kernel's QP row loses
// it: the row's pid, which is the creating thread's id (mapped to its
// process); when the row has none (that thread exited, or the process is a
// zombie or gone), the PD row of the QP's PDN; then the context row of the
// PD's CTXN. A context is one open uverbs file; a forked child or a process
// the fd was passed to keeps it, and its QPs, alive after the creator
// exits, and so does a process that closed the fd but still maps the
// device's queues. Those processes are the device's holders, found through
// /proc/*/fd and /proc/*/maps. A QP whose creator is gone but whose device
// is held says so (QP.CreatorGone, QP.Holders).
package inventory

import (
	"context"
	"errors"
	"fmt"
	"path"

	"github.com/qpdrain/qpdrain/rdmanl"
	"github.com/qpdrain/qpdrain/workload"
)

// Source is what a snapshot reads from RDMA netlink; *rdmanl.Conn is one.
type Source interface {
	Devices(ctx context.Context) ([]rdmanl.Device, error)
	AppendQPs(ctx context.Context, dst []rdmanl.QP, dev rdmanl.Device) ([]rdmanl.QP, error)
	PDs(ctx context.Context, dev rdmanl.Device) ([]rdmanl.PD, error)
	Contexts(ctx context.Context, dev rdmanl.Device) ([]rdmanl.Ctx, error)
	UverbsChardev(ctx context.Context, dev rdmanl.Device) (rdmanl.Chardev, error)
}

var _ Source = (*rdmanl.Conn)(nil)

// OwnerSource says which row named a QP's owner.
type OwnerSource string

// Where an owner was found.
const (
	FromQP     OwnerSource = "qp"     // the QP row's pid
	FromPD     OwnerSource = "pd"     // the PD row of the QP's pdn
	FromCtx    OwnerSource = "ctx"    // the context row of that PD's ctxn
	FromKernel OwnerSource = "kernel" // a kernel QP (kern_name)
)

// Owner is the process that created a QP, or the kernel module for a
// kernel QP.
type Owner struct {
	// PID is the process (thread group) id; 0 for a kernel QP.
	PID uint32 `json:"pid,omitempty"`
	// TID is the thread the kernel reported, when it is not PID itself.
	TID  uint32 `json:"tid,omitempty"`
	Comm string `json:"comm"`
	// Zombie: the process has exited and is waiting to be reaped.
	Zombie bool        `json:"zombie,omitempty"`
	Via    OwnerSource `json:"via"`
	// Workload is what the process's cgroup says of it; nil when it could
	// not be read.
	Workload *workload.Workload `json:"cgroup,omitempty"`
}

// QP is one QP with its owner and the holders of its device.
type QP struct {
	rdmanl.QP
	// Comm is what rdma prints as comm: the kernel module of a kernel QP, or
	// the name of the task the row's pid names (a thread's own name).
	Comm string
	// Owner is nil when no row names a live owner.
	Owner *Owner
	// CreatorGone: no row names a live process (the creator and whoever
	// the PD and context rows named have exited); the QP lives on because
	// Holders keep its device context.
	CreatorGone bool
	// Holders are the processes holding the QP's device open or mapped
	// (shared with every QP of the device): the kernel does not say which
	// of a device's files a context is.
	Holders []Holder
}

// Device is one RDMA device with its uverbs char device and its holders.
type Device struct {
	rdmanl.Device
	// Chardev is the uverbs char device's name ("uverbs0"), empty when the
	// device has none.
	Chardev string
	Holders []Holder
}

// Snapshot is the host's QPs at one moment (each device dumped once).
type Snapshot struct {
	Devices []Device
	QPs     []QP
}

// Options configure Take.
type Options struct {
	// Proc and Sys are the /proc and sysfs trees to read.
	Proc Proc
	Sys  Sys
	// Devices, when not empty, restricts the snapshot to these device names.
	Devices []string
	// NoHolders skips the /proc scan for holders.
	NoHolders bool
	// DevDir is where char devices live ("/dev" when empty).
	DevDir string
	// Progress, when set, is called after each device's QPs are read.
	Progress func(dev string, qps int)
}

// ErrNoDevices means the host (this network namespace) has no RDMA devices.
var ErrNoDevices = errors.New("no RDMA devices")

// ErrNoSuchDevice means Options.Devices names a device the host lacks.
var ErrNoSuchDevice = errors.New("no such RDMA device")

// Take reads every device's QPs and resolves their owners and holders. It
// fails with ErrNoDevices when there are no devices at all. The PD and
// context tables are read only for devices with a QP whose row names no
// live process.
func Take(ctx context.Context, src Source, opts Options) (*Snapshot, error) {
	devs, err := src.Devices(ctx)
	if err != nil {
		return nil, err
	}
	if len(devs) == 0 {
		return nil, ErrNoDevices
	}
	if len(opts.Devices) > 0 {
		byName := map[string]rdmanl.Device{}
		for _, d := range devs {
			byName[d.Name] = d
		}
		var sel []rdmanl.Device
		for _, n := range opts.Devices {
			d, ok := byName[n]
			if !ok {
				return nil, fmt.Errorf("%q: %w", n, ErrNoSuchDevice)
			}
			sel = append(sel, d)
		}
		devs = sel
	}
	snap := &Snapshot{}
	tasks := taskCache{proc: opts.Proc, m: map[uint32]*taskEntry{}}
	var raw []rdmanl.QP
	for _, d := range devs {
		dev := Device{Device: d}
		if !opts.NoHolders {
			dev.Chardev = chardevName(ctx, src, d, opts.Sys)
		}
		snap.Devices = append(snap.Devices, dev)
		start := len(raw)
		if raw, err = src.AppendQPs(ctx, raw, d); err != nil {
			return nil, err
		}
		if opts.Progress != nil {
			opts.Progress(d.Name, len(raw)-start)
		}
	}
	if !opts.NoHolders {
		if err := findHolders(snap.Devices, opts); err != nil {
			return nil, err
		}
	}
	holders := map[uint32][]Holder{}
	for _, d := range snap.Devices {
		holders[d.Index] = d.Holders
	}
	snap.QPs = make([]QP, len(raw))
	var orphaned map[uint32]bool
	for i := range raw {
		q := &snap.QPs[i]
		q.QP = raw[i]
		switch {
		case q.Has&rdmanl.HasKernName != 0:
			// A kernel QP lives as long as its module; no file holds it.
			q.Owner = &Owner{Comm: q.KernName, Via: FromKernel}
			q.Comm = q.KernName
		case q.Has&rdmanl.HasPID != 0:
			q.Owner = tasks.owner(q.PID, FromQP)
			q.Comm = tasks.name(q.PID)
		}
		if q.Has&rdmanl.HasKernName == 0 {
			q.Holders = holders[q.Device]
		}
		if q.Owner == nil {
			if orphaned == nil {
				orphaned = map[uint32]bool{}
			}
			orphaned[q.Device] = true
		}
	}
	if orphaned != nil {
		if err := ownersByPD(ctx, src, snap, orphaned, &tasks); err != nil {
			return nil, err
		}
	}
	fillWorkloads(snap, opts.Proc)
	return snap, nil
}

// ownersByPD resolves the owners of the QPs whose rows name no live
// process through the PD and context tables of their devices.
func ownersByPD(ctx context.Context, src Source, snap *Snapshot, devs map[uint32]bool, tasks *taskCache) error {
	type key struct{ dev, n uint32 }
	pds := map[key]rdmanl.PD{}
	ctxs := map[key]rdmanl.Ctx{}
	for _, d := range snap.Devices {
		if !devs[d.Index] {
			continue
		}
		ps, err := src.PDs(ctx, d.Device)
		if err != nil {
			return err
		}
		for _, p := range ps {
			pds[key{d.Index, p.PDN}] = p
		}
		cs, err := src.Contexts(ctx, d.Device)
		if err != nil {
			return err
		}
		for _, c := range cs {
			ctxs[key{d.Index, c.CtxN}] = c
		}
	}
	for i := range snap.QPs {
		q := &snap.QPs[i]
		if q.Owner != nil {
			continue
		}
		if q.Has&rdmanl.HasPDN != 0 {
			if pd, ok := pds[key{q.Device, q.PDN}]; ok {
				if pd.Has&rdmanl.HasPID != 0 {
					q.Owner = tasks.owner(pd.PID, FromPD)
				}
				if q.Owner == nil && pd.Has&rdmanl.HasCtxN != 0 {
					if c, ok := ctxs[key{q.Device, pd.CtxN}]; ok && c.Has&rdmanl.HasPID != 0 {
						q.Owner = tasks.owner(c.PID, FromCtx)
					}
				}
			}
		}
		q.CreatorGone = q.Owner == nil
	}
	return nil
}

// chardevName names dev's uverbs char device: GET_CHARDEV, else sysfs.
func chardevName(ctx context.Context, src Source, d rdmanl.Device, sys Sys) string {
	if cd, err := src.UverbsChardev(ctx, d); err == nil && cd.Name != "" {
		return cd.Name
	}
	m, err := sys.UverbsDevices()
	if err != nil {
		return ""
	}
	for cdev, ib := range m {
		if ib == d.Name {
			return cdev
		}
	}
	return ""
}

func findHolders(devs []Device, opts Options) error {
	devDir := opts.DevDir
	if devDir == "" {
		devDir = "/dev"
	}
	var paths []string
	for _, d := range devs {
		if d.Chardev != "" {
			paths = append(paths, path.Join(devDir, "infiniband", d.Chardev))
		}
	}
	if len(paths) == 0 {
		return nil
	}
	byPath, err := opts.Proc.Holders(paths)
	if err != nil {
		return err
	}
	for i := range devs {
		if devs[i].Chardev != "" {
			devs[i].Holders = byPath[path.Join(devDir, "infiniband", devs[i].Chardev)]
		}
	}
	return nil
}

// taskCache resolves each reported id once: 10,000 QPs of one process
// cost one /proc read.
type taskCache struct {
	proc Proc
	m    map[uint32]*taskEntry
}

type taskEntry struct {
	t   Task
	err error
}

// owner is the live process behind a reported thread or process id, or
// nil when there is none.
func (c *taskCache) owner(id uint32, via OwnerSource) *Owner {
	e, ok := c.m[id]
	if !ok {
		t, err := c.proc.Task(id)
		e = &taskEntry{t: t, err: err}
		c.m[id] = e
	}
	if e.err != nil {
		return nil
	}
	o := &Owner{PID: e.t.TGID, Comm: e.t.Comm, Zombie: e.t.Zombie, Via: via}
	if e.t.TGID != id {
		o.TID = id
	}
	return o
}

// name is the reported task's own name, empty when it is gone.
func (c *taskCache) name(id uint32) string {
	if e := c.m[id]; e != nil && e.err == nil {
		return e.t.Name
	}
	return ""
}

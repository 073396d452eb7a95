// Package inventory is the host's view of RDMA: every QP on the machine,
// read through RDMA netlink (package rdmanl), with the process that owns
// it and the processes that hold its device open, read from /proc and
// sysfs.
//
// A QP's owner is found in three steps, because the kernel's QP row loses
// it: the row's pid, which is the creating thread's id (mapped to its
// process); when the row has none (that thread exited, or the process is a
// zombie or gone), the PD row of the QP's PDN; then the context row of the
// PD's CTXN. A context is one open file description of the device's uverbs
// char device; a forked child or a process the fd was passed to shares it
// and keeps it, and its QPs, alive after the creator exits, and so does a
// process that closed the fd but still maps the device's queues. Those
// processes are the holders, found through /proc/*/fd and /proc/*/maps;
// kcmp(2) groups their fds into open files, and each context is tied to
// its file through its live creator, or by elimination (QP.Holders,
// QP.HoldersCertain; docs/LEAKS.md states the premises). A QP whose
// creator is gone or a zombie says so (QP.CreatorGone).
package inventory

import (
	"context"
	"errors"
	"fmt"
	"path"
	"syscall"

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
	LookupQP(ctx context.Context, q rdmanl.QP) (rdmanl.QP, error)
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
	// Owner is nil when no row names a live owner. QPs with the same owner
	// share one: treat it as read-only.
	Owner *Owner
	// CreatorGone: no row names a live process that is not a zombie (the
	// creator and whoever the PD and context rows named have exited); the
	// QP lives on because Holders keep its context.
	CreatorGone bool
	// OwnerUncertain: the QP and PD rows name no live process that is not
	// a zombie, and the context row, which may name one, could not be read
	// (a kernel before 5.11 has no RES_CTX_GET; Snapshot.Notes says so):
	// the creator may be gone or alive. CreatorGone is false then.
	OwnerUncertain bool
	// Holders are the processes holding the QP's context (its open uverbs
	// file) by an fd or by mappings; when HoldersCertain is false they are
	// the candidates, any of which may hold it. Empty for a kernel QP.
	Holders []Holder
	// HoldersCertain: Holders are exactly the context's holders (one
	// process holds the device, or the context was tied to its file).
	HoldersCertain bool
}

// Device is one RDMA device with its uverbs char device and its holders.
type Device struct {
	rdmanl.Device
	// Chardev is the uverbs char device's name ("uverbs0"), empty when the
	// device has none.
	Chardev string
	// Holders are the processes holding the char device open or mapped.
	Holders []Holder
	// Files are the holders' fds grouped into open files (kcmp), read only
	// for a device with user QPs and more than one holder.
	Files []File
}

// Snapshot is the host's QPs at one moment (each device dumped once).
type Snapshot struct {
	Devices []Device
	QPs     []QP
	// Notes say what the kernel could not tell and what that leaves
	// unknown ("rxe0: the kernel has no RES_CTX_GET ...").
	Notes []string
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
	// Previous, when set, is the snapshot before this one: each of its QPs
	// this one's dump does not list is asked for by number (LookupQP), or,
	// where the kernel cannot look it up (a QP without a port), sought in a
	// second dump, and kept when the kernel still has it. A dump resumes each message at a
	// count of rows, and a QP destroyed meanwhile below that count shifts a
	// live one out of it (rdmanl.Conn.AppendQPs): without Previous, a host
	// creating and destroying QPs may have one missing from a snapshot.
	Previous *Snapshot
}

// ErrNoDevices means the host (this network namespace) has no RDMA devices.
var ErrNoDevices = errors.New("no RDMA devices")

// ErrNoSuchDevice means Options.Devices names a device the host lacks.
var ErrNoSuchDevice = errors.New("no such RDMA device")

// Take reads every device's QPs and resolves their owners and holders. It
// fails with ErrNoDevices when there are no devices at all. The PD and
// context tables are read only for devices with a QP whose row names no
// live process, or a zombie, and for devices more than one process holds.
// A kernel without the context table (RES_CTX_GET, before 5.11) fails
// nothing: the QPs it leaves without a known owner are OwnerUncertain, and
// Snapshot.Notes says why.
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
		if opts.Previous != nil {
			if raw, err = confirmMissing(ctx, src, raw, start, d, opts.Previous); err != nil {
				return nil, err
			}
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
	snap.QPs = make([]QP, len(raw))
	multi := map[uint32]bool{} // devices held by more than one process
	byIndex := map[uint32]*Device{}
	for i := range snap.Devices {
		d := &snap.Devices[i]
		byIndex[d.Index] = d
		multi[d.Index] = len(d.Holders) > 1
	}
	need := map[uint32]bool{} // devices whose PD and context tables are read
	for i := range raw {
		q := &snap.QPs[i]
		q.QP = raw[i]
		switch {
		case q.Has&rdmanl.HasKernName != 0:
			// A kernel QP lives as long as its module; no file holds it.
			q.Owner = &Owner{Comm: q.KernName, Via: FromKernel}
			q.Comm = q.KernName
			q.HoldersCertain = true
			continue
		case q.Has&rdmanl.HasPID != 0:
			q.Owner = tasks.owner(q.PID, FromQP)
			q.Comm = tasks.name(q.PID)
		}
		// One process holding the device holds every context of it.
		if d := byIndex[q.Device]; d != nil {
			q.Holders, q.HoldersCertain = d.Holders, len(d.Holders) == 1
		}
		if q.Owner == nil || q.Owner.Zombie || multi[q.Device] {
			need[q.Device] = true
		}
	}
	var tabs map[uint32]*tables
	if len(need) > 0 {
		if tabs, err = readTables(ctx, src, snap.Devices, need); err != nil {
			return nil, err
		}
		for _, d := range snap.Devices {
			if t := tabs[d.Index]; t != nil && t.noCtx {
				snap.Notes = append(snap.Notes, fmt.Sprintf("%s: the kernel has no RES_CTX_GET (Linux 5.11 added it): "+
					"a QP whose QP and PD rows name no live process has an unknown owner, not a gone one, "+
					"and its holders are the candidates where more than one process holds the device", d.Name))
			}
		}
		ownersByPD(snap, tabs, &tasks)
		holdersByContext(snap, tabs, &tasks, opts.Proc.sameFile())
	}
	for i := range snap.QPs {
		q := &snap.QPs[i]
		// A zombie has closed its files: it can destroy nothing.
		gone := q.Has&rdmanl.HasKernName == 0 && (q.Owner == nil || q.Owner.Zombie)
		if t := tabs[q.Device]; gone && t != nil && t.noCtx {
			q.OwnerUncertain = true
			continue
		}
		q.CreatorGone = gone
	}
	fillWorkloads(snap, opts.Proc)
	return snap, nil
}

// confirmMissing appends to raw, whose rows from start are dev's dump, each
// QP of dev in prev that the dump missed and the kernel still has: looked
// up by number, or, for a QP the kernel cannot look up, found in a second
// dump. A QP without a port (in RESET) is such a QP: res_get_common_doit
// (drivers/infiniband/core/nldev.c) wants a port for a QP, and
// fill_res_qp_entry refuses one on another port. A QP missing from two
// dumps is gone: a second shift past the same QP is what would hide it.
func confirmMissing(ctx context.Context, src Source, raw []rdmanl.QP, start int, dev rdmanl.Device, prev *Snapshot) ([]rdmanl.QP, error) {
	listed := make(map[uint32]bool, len(raw)-start)
	for i := range raw[start:] {
		listed[raw[start+i].ID()] = true
	}
	again := map[uint32]bool{} // to find in a second dump
	for i := range prev.QPs {
		q := &prev.QPs[i].QP
		if q.Device != dev.Index || q.DeviceName != dev.Name || listed[q.ID()] {
			continue
		}
		if q.Has&rdmanl.HasPort == 0 {
			again[q.ID()] = true
			continue
		}
		got, err := src.LookupQP(ctx, *q)
		switch {
		case err == nil:
			raw = append(raw, got)
		case errors.Is(err, rdmanl.ErrNoSuchQP):
			// destroyed since the last snapshot
		case unsupportedDump(err) || errors.Is(err, syscall.EAGAIN):
			again[q.ID()] = true
		default:
			return raw, err
		}
	}
	if len(again) == 0 {
		return raw, nil
	}
	second, err := src.AppendQPs(ctx, nil, dev)
	if err != nil {
		return raw, err
	}
	for _, q := range second {
		if again[q.ID()] {
			raw = append(raw, q)
		}
	}
	return raw, nil
}

// tables are a device's PD table, by PDN, and its context table.
type tables struct {
	pds    map[uint32]rdmanl.PD
	ctxs   []rdmanl.Ctx
	ctxByN map[uint32]rdmanl.Ctx
	// noCtx: the kernel has no context table (no RES_CTX_GET).
	noCtx bool
}

// unsupportedDump reports whether err, of the context dump, is the kernel
// refusing a command it does not have: one past its table is EINVAL
// (rdma_nl_rcv_msg in drivers/infiniband/core/netlink.c), one it knows
// but cannot serve EOPNOTSUPP. The device's PD dump has just succeeded,
// so EINVAL is not the device gone in between.
func unsupportedDump(err error) bool {
	return errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.EOPNOTSUPP)
}

// readTables reads the PD and context tables of the devices in need.
func readTables(ctx context.Context, src Source, devs []Device, need map[uint32]bool) (map[uint32]*tables, error) {
	out := map[uint32]*tables{}
	for _, d := range devs {
		if !need[d.Index] {
			continue
		}
		ps, err := src.PDs(ctx, d.Device)
		if err != nil {
			return nil, err
		}
		t := &tables{pds: make(map[uint32]rdmanl.PD, len(ps))}
		for _, p := range ps {
			t.pds[p.PDN] = p
		}
		t.ctxs, err = src.Contexts(ctx, d.Device)
		switch {
		case unsupportedDump(err):
			t.noCtx = true
		case err != nil:
			return nil, err
		}
		t.ctxByN = make(map[uint32]rdmanl.Ctx, len(t.ctxs))
		for _, c := range t.ctxs {
			t.ctxByN[c.CtxN] = c
		}
		out[d.Index] = t
	}
	return out, nil
}

// ctxOf is the context of a user QP, through its PD.
func (t *tables) ctxOf(q *QP) (uint32, bool) {
	if t == nil || q.Has&rdmanl.HasPDN == 0 {
		return 0, false
	}
	pd, ok := t.pds[q.PDN]
	return pd.CtxN, ok && pd.Has&rdmanl.HasCtxN != 0
}

// ownersByPD resolves the owners of the QPs whose rows name no live
// process (none, or a zombie) through the PD and context tables.
func ownersByPD(snap *Snapshot, tabs map[uint32]*tables, tasks *taskCache) {
	for i := range snap.QPs {
		q := &snap.QPs[i]
		t := tabs[q.Device]
		if q.Owner != nil && !q.Owner.Zombie || t == nil || q.Has&rdmanl.HasPDN == 0 {
			continue
		}
		pd, ok := t.pds[q.PDN]
		if !ok {
			continue
		}
		var by []*Owner
		if pd.Has&rdmanl.HasPID != 0 {
			by = append(by, tasks.owner(pd.PID, FromPD))
		}
		if c, ok := t.ctxByN[pd.CtxN]; ok && pd.Has&rdmanl.HasCtxN != 0 && c.Has&rdmanl.HasPID != 0 {
			by = append(by, tasks.owner(c.PID, FromCtx))
		}
		// A live owner wins over a zombie one, the first row over later.
		for _, o := range by {
			if o != nil && (q.Owner == nil || q.Owner.Zombie && !o.Zombie) {
				q.Owner = o
			}
		}
	}
}

// holdersByContext gives the user QPs of each device held by more than
// one process the holders of their own context (see tieContexts), where
// the device's fds can be grouped into open files (kcmp). Elsewhere they
// keep the device's holders, uncertain.
func holdersByContext(snap *Snapshot, tabs map[uint32]*tables, tasks *taskCache, same SameFileFunc) {
	held := map[uint32]map[uint32]heldBy{}
	for i := range snap.Devices {
		d := &snap.Devices[i]
		t := tabs[d.Index]
		if t == nil || len(d.Holders) < 2 {
			continue
		}
		files, ok := groupFiles(d.Holders, same)
		if !ok {
			continue
		}
		d.Files = files
		var mapped []Holder
		for _, h := range d.Holders {
			if h.Mapped {
				mapped = append(mapped, h)
			}
		}
		cs := make([]creator, len(t.ctxs))
		for j, c := range t.ctxs {
			cs[j].ctxn = c.CtxN
			if c.Has&rdmanl.HasPID == 0 {
				continue
			}
			if o := tasks.owner(c.PID, FromCtx); o != nil && !o.Zombie {
				cs[j].pid, cs[j].live = o.PID, true
			}
		}
		held[d.Index] = tieContexts(files, mapped, cs)
	}
	for i := range snap.QPs {
		q := &snap.QPs[i]
		m := held[q.Device]
		if m == nil || q.Has&rdmanl.HasKernName != 0 {
			continue
		}
		if c, ok := tabs[q.Device].ctxOf(q); ok {
			if h, ok := m[c]; ok {
				q.Holders, q.HoldersCertain = h.holders, h.certain
			}
		}
	}
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
	// owners are the Owners handed out, by source: the QPs of one
	// process share one.
	owners map[OwnerSource]*Owner
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
	if o := e.owners[via]; o != nil {
		return o
	}
	o := &Owner{PID: e.t.TGID, Comm: e.t.Comm, Zombie: e.t.Zombie, Via: via}
	if e.t.TGID != id {
		o.TID = id
	}
	if e.owners == nil {
		e.owners = map[OwnerSource]*Owner{}
	}
	e.owners[via] = o
	return o
}

// name is the reported task's own name, empty when it is gone.
func (c *taskCache) name(id uint32) string {
	if e := c.m[id]; e != nil && e.err == nil {
		return e.t.Name
	}
	return ""
}

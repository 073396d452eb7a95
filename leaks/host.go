package leaks

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/rdmanl"
	"github.com/qpdrain/qpdrain/rdmanl/inventory"
)

// HostSampler is the Sampler of a real host: each Sample is an inventory
// snapshot (inventory.Take) over RDMA netlink, so that metrics.NewExporter
// and Watch can run outside the CLI. It keeps its last snapshot, so that
// a QP the next dump misses while QPs are created and destroyed is looked
// up by number before it counts as gone (inventory.Options.Previous): use
// one HostSampler for the samples of a host, from one goroutine at a time.
type HostSampler struct {
	Conn    *rdmanl.Conn      // the RDMA netlink socket, which the caller closes
	Options inventory.Options // where /proc, sysfs and /dev are, which devices
	last    *inventory.Snapshot
}

// ErrNoConn is what a HostSampler without a Conn returns, such as one
// made with the nil Conn of a failed rdmanl.Dial (whose error says why:
// on a host without RDMA netlink it matches ibv.ErrNoDevice).
var ErrNoConn = errors.New("leaks.HostSampler has no RDMA netlink Conn")

// Sample takes one snapshot. A host without RDMA devices is an error
// matching ErrNoRDMA (and inventory.ErrNoDevices); a sampler without a
// Conn, ErrNoConn; any other failure of inventory.Take is returned as is.
func (h *HostSampler) Sample(ctx context.Context) (Sample, error) {
	if h.Conn == nil {
		return Sample{}, ErrNoConn
	}
	opts := h.Options
	opts.Previous = h.last
	snap, err := inventory.Take(ctx, h.Conn, opts)
	if errors.Is(err, inventory.ErrNoDevices) {
		return Sample{}, fmt.Errorf("%w: %w", ErrNoRDMA, err)
	}
	if err != nil {
		return Sample{}, err
	}
	h.last = snap
	return FromSnapshot(snap, time.Now()), nil
}

// FromSnapshot keeps what the leak analysis needs of a host-view snapshot
// taken at at, and its notes. A QP's owner
// is its live, non-zombie owning process; a zombie has closed its files, so
// what keeps its QPs is a holder. Every user QP keeps its own holders
// (inventory ties each context to its file), certain or the candidates.
func FromSnapshot(snap *inventory.Snapshot, at time.Time) Sample {
	s := Sample{At: at, Devices: make([]Device, len(snap.Devices)), Notes: snap.Notes}
	byIndex := make(map[uint32]int, len(snap.Devices))
	for i, d := range snap.Devices {
		s.Devices[i].Name = d.Name
		byIndex[d.Index] = i
	}
	// Sized first: growing 10,000 QPs one by one was a sixth of a sample.
	counts := make([]int, len(snap.Devices))
	for i := range snap.QPs {
		counts[byIndex[snap.QPs[i].Device]]++
	}
	for i, n := range counts {
		s.Devices[i].QPs = make([]QP, 0, n)
	}
	// The QPs of one context share one holder list: convert each once.
	converted := map[*inventory.Holder][]Process{}
	holders := func(hs []inventory.Holder) []Process {
		if len(hs) == 0 {
			return nil
		}
		if ps, ok := converted[&hs[0]]; ok {
			return ps
		}
		ps := make([]Process, len(hs))
		for i, h := range hs {
			ps[i] = Process{PID: int(h.PID), Comm: h.Comm, Workload: h.Workload}
		}
		converted[&hs[0]] = ps
		return ps
	}
	for i := range snap.QPs {
		q := &snap.QPs[i]
		d := byIndex[q.Device]
		lq := QP{Port: q.Port, LQPN: q.LQPN, Type: q.Type.String(), State: q.State.String(), KernName: q.KernName, OwnerUncertain: q.OwnerUncertain}
		if q.Owner != nil && q.Owner.Via != inventory.FromKernel && !q.Owner.Zombie {
			lq.Owner = Process{PID: int(q.Owner.PID), Comm: q.Owner.Comm, Workload: q.Owner.Workload}
		}
		if lq.KernName == "" {
			lq.Holders, lq.HoldersCertain = holders(q.Holders), q.HoldersCertain
		}
		s.Devices[d].QPs = append(s.Devices[d].QPs, lq)
	}
	return s
}

// MaxQPLimits asks each named device its max_qp through ibv.Open (the
// program must import a binding, package libibverbs), closing the device
// again at once; a Limit whose max_qp could not be read says why in Unknown.
func MaxQPLimits(devices []string) map[string]Limit {
	out := map[string]Limit{}
	for _, name := range devices {
		out[name] = maxQPLimit(name)
	}
	return out
}

func maxQPLimit(name string) Limit {
	ctx, err := ibv.Open(name)
	if errors.Is(err, ibv.ErrNotSupported) {
		return Limit{Unknown: "this build has no libibverbs"}
	}
	if err != nil {
		return Limit{Unknown: fmt.Sprintf("opening %s through libibverbs: %v", name, err)}
	}
	defer ctx.Close()
	attr, err := ctx.QueryDevice()
	if err != nil {
		return Limit{Unknown: fmt.Sprintf("ibv_query_device: %v", err)}
	}
	return Limit{MaxQP: attr.MaxQP}
}

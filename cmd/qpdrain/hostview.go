package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/qpdrain/qpdrain/leaks"
	"github.com/qpdrain/qpdrain/rdmanl"
	"github.com/qpdrain/qpdrain/rdmanl/inventory"
)

// realHost reads the host through RDMA netlink (package inventory) and
// acts on it through kill(2) and rxe DELLINK.
type realHost struct {
	conn *rdmanl.Conn
	opts hostOptions
	// log receives what reap's rxe delete waits for.
	log io.Writer
}

func openRealHost(opts hostOptions, log io.Writer) (host, error) {
	conn, err := dialRDMA()
	if err != nil {
		return nil, err
	}
	return &realHost{conn: conn, opts: opts, log: log}, nil
}

func (h *realHost) Close() error { return h.conn.Close() }

// Sample takes one inventory snapshot and turns it into a leaks.Sample.
func (h *realHost) Sample(ctx context.Context) (leaks.Sample, error) {
	snap, err := inventory.Take(ctx, h.conn, inventory.Options{
		Proc: inventory.Proc{Root: h.opts.proc}, Sys: inventory.Sys{Root: h.opts.sys}, DevDir: h.opts.dev,
	})
	if errors.Is(err, inventory.ErrNoDevices) {
		return leaks.Sample{}, fmt.Errorf("%w: %w", leaks.ErrNoRDMA, err)
	}
	if err != nil {
		return leaks.Sample{}, err
	}
	return toSample(snap, time.Now()), nil
}

// toSample keeps what the leak analysis needs of a snapshot. A QP's owner
// is its live, non-zombie owning process; a zombie has closed its files, so
// what keeps its QPs is a holder. Every user QP keeps its own holders
// (inventory ties each context to its file), certain or the candidates.
func toSample(snap *inventory.Snapshot, at time.Time) leaks.Sample {
	s := leaks.Sample{At: at, Devices: make([]leaks.Device, len(snap.Devices))}
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
		s.Devices[i].QPs = make([]leaks.QP, 0, n)
	}
	// The QPs of one context share one holder list: convert each once.
	converted := map[*inventory.Holder][]leaks.Process{}
	holders := func(hs []inventory.Holder) []leaks.Process {
		if len(hs) == 0 {
			return nil
		}
		if ps, ok := converted[&hs[0]]; ok {
			return ps
		}
		ps := make([]leaks.Process, len(hs))
		for i, h := range hs {
			ps[i] = leaks.Process{PID: int(h.PID), Comm: h.Comm, Workload: h.Workload}
		}
		converted[&hs[0]] = ps
		return ps
	}
	for i := range snap.QPs {
		q := &snap.QPs[i]
		d := byIndex[q.Device]
		lq := leaks.QP{Port: q.Port, LQPN: q.LQPN, Type: q.Type.String(), State: q.State.String(), KernName: q.KernName}
		if q.Owner != nil && q.Owner.Via != inventory.FromKernel && !q.Owner.Zombie {
			lq.Owner = leaks.Process{PID: int(q.Owner.PID), Comm: q.Owner.Comm, Workload: q.Owner.Workload}
		}
		if lq.KernName == "" {
			lq.Holders, lq.HoldersCertain = holders(q.Holders), q.HoldersCertain
		}
		s.Devices[d].QPs = append(s.Devices[d].QPs, lq)
	}
	return s
}

func (h *realHost) Limits(devices []string) map[string]leaks.Limit { return maxQPLimits(devices) }

func (h *realHost) Signal(pid int, sig syscall.Signal) error { return signalProcess(pid, sig) }

// rxeDevice finds the device name and makes sure it is an rxe link.
func (h *realHost) rxeDevice(ctx context.Context, name string) (rdmanl.Device, error) {
	dev, err := findDevice(ctx, h.conn, name)
	if err != nil {
		return dev, err
	}
	cd, err := h.conn.UverbsChardev(ctx, dev)
	if err != nil {
		return dev, fmt.Errorf("asking %s for its uverbs char device: %w", name, err)
	}
	if cd.DriverID != rdmanl.DriverRXE {
		return dev, fmt.Errorf("%s is not an rxe link (uverbs driver id %d): only rxe links can be deleted", name, cd.DriverID)
	}
	return dev, nil
}

func (h *realHost) CheckRxe(ctx context.Context, name string) error {
	_, err := h.rxeDevice(ctx, name)
	return err
}

// DeleteRxe deletes the rxe link name once no process holds it, waiting
// for that as long as ctx allows.
func (h *realHost) DeleteRxe(ctx context.Context, name string) error {
	dev, err := h.rxeDevice(ctx, name)
	if err != nil {
		return err
	}
	if err := waitUnheld(ctx, h.conn, dev, h.opts, h.log); err != nil {
		return err
	}
	return h.conn.DeleteLink(ctx, dev)
}

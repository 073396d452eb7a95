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
// what keeps its QPs is a holder. For a QP without one the holders are
// those of its device that own no live QP there (inventory cannot say
// which of a device's files a context is), or all of them when each owns
// QPs of its own.
func toSample(snap *inventory.Snapshot, at time.Time) leaks.Sample {
	s := leaks.Sample{At: at, Devices: make([]leaks.Device, len(snap.Devices))}
	byIndex := make(map[uint32]int, len(snap.Devices))
	for i, d := range snap.Devices {
		s.Devices[i].Name = d.Name
		byIndex[d.Index] = i
	}
	owner := func(q *inventory.QP) leaks.Process {
		if q.Owner == nil || q.Owner.Via == inventory.FromKernel || q.Owner.Zombie {
			return leaks.Process{}
		}
		return leaks.Process{PID: int(q.Owner.PID), Comm: q.Owner.Comm, Workload: q.Owner.Workload}
	}
	owners := make([]map[int]bool, len(snap.Devices))
	for i := range snap.QPs {
		q := &snap.QPs[i]
		if p := owner(q); p.PID != 0 {
			d := byIndex[q.Device]
			if owners[d] == nil {
				owners[d] = map[int]bool{}
			}
			owners[d][p.PID] = true
		}
	}
	holders := make([][]leaks.Process, len(snap.Devices))
	for i, d := range snap.Devices {
		var all, free []leaks.Process
		for _, h := range d.Holders {
			p := leaks.Process{PID: int(h.PID), Comm: h.Comm, Workload: h.Workload}
			all = append(all, p)
			if !owners[i][p.PID] {
				free = append(free, p)
			}
		}
		holders[i] = cmpOr(free, all)
	}
	for i := range snap.QPs {
		q := &snap.QPs[i]
		d := byIndex[q.Device]
		lq := leaks.QP{Port: q.Port, LQPN: q.LQPN, Type: q.Type.String(), State: q.State.String(), KernName: q.KernName, Owner: owner(q)}
		if lq.Owner.PID == 0 && lq.KernName == "" {
			lq.Holders = holders[d]
		}
		s.Devices[d].QPs = append(s.Devices[d].QPs, lq)
	}
	return s
}

// cmpOr is a if it is not empty, else b.
func cmpOr(a, b []leaks.Process) []leaks.Process {
	if len(a) > 0 {
		return a
	}
	return b
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

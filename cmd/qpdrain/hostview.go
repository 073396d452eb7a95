package main

import (
	"context"
	"fmt"
	"io"
	"syscall"

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
	// sampler keeps the last sample's snapshot: a QP the next dump misses
	// is looked up before it counts as gone.
	sampler *leaks.HostSampler
}

func openRealHost(opts hostOptions, log io.Writer) (host, error) {
	conn, err := rdmanl.Dial()
	if err != nil {
		return nil, err
	}
	return newRealHost(conn, opts, log), nil
}

// newRealHost is the host conn reads, with one sampler for its samples.
func newRealHost(conn *rdmanl.Conn, opts hostOptions, log io.Writer) *realHost {
	return &realHost{conn: conn, opts: opts, log: log, sampler: &leaks.HostSampler{Conn: conn, Options: inventory.Options{
		Proc: inventory.Proc{Root: opts.proc}, Sys: inventory.Sys{Root: opts.sys}, DevDir: opts.dev,
	}}}
}

func (h *realHost) Close() error { return h.conn.Close() }

// Sample takes one inventory snapshot as a leaks.Sample.
func (h *realHost) Sample(ctx context.Context) (leaks.Sample, error) { return h.sampler.Sample(ctx) }

func (h *realHost) Limits(devices []string) map[string]leaks.Limit { return leaks.MaxQPLimits(devices) }

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

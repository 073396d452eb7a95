package main

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/qpdrain/qpdrain/leaks"
)

// host is the machine as leaks, reap and exporter see it: samples of its
// QPs, the limits of its devices, and the two actions reap takes.
type host interface {
	leaks.Sampler
	// Limits returns the max_qp of each named device; a Limit's Unknown
	// says why it could not be read.
	Limits(devices []string) map[string]leaks.Limit
	// Signal sends sig to the process pid.
	Signal(pid int, sig syscall.Signal) error
	// CheckRxe fails unless the RDMA device name exists and is an rxe
	// link.
	CheckRxe(ctx context.Context, name string) error
	// DeleteRxe deletes the rxe link name once no process holds it,
	// bounded by ctx.
	DeleteRxe(ctx context.Context, name string) error
	// Close releases the host's netlink socket.
	Close() error
}

// openHost opens the host, reading /proc, sysfs and /dev under opts and
// telling what it waits for on log; tests replace it with a fake.
var openHost = openRealHost

// signalProcess sends sig to pid.
func signalProcess(pid int, sig syscall.Signal) error {
	p, err := os.FindProcess(pid)
	if err == nil {
		err = p.Signal(sig)
	}
	if err != nil {
		return fmt.Errorf("sending %v to pid %d: %w", sig, pid, err)
	}
	return nil
}

// boundedSampler bounds each sample of a host by a timeout.
type boundedSampler struct {
	host
	timeout time.Duration
}

func (b boundedSampler) Sample(ctx context.Context) (leaks.Sample, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	return b.host.Sample(ctx)
}

// hostDevices lists the device names of a sample.
func hostDevices(s leaks.Sample) []string {
	names := make([]string, len(s.Devices))
	for i, d := range s.Devices {
		names[i] = d.Name
	}
	return names
}

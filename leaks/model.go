package leaks

import (
	"context"
	"errors"
	"time"

	"github.com/qpdrain/qpdrain/workload"
)

// ErrNoRDMA is what a Sampler returns when the host has no RDMA device to
// sample; callers test it with errors.Is (qpdrain leaks exits 3 on it).
var ErrNoRDMA = errors.New("no RDMA devices on this host")

// Process is a process as /proc names it.
type Process struct {
	PID  int    `json:"pid"`
	Comm string `json:"comm"`
	// Workload is what the process's cgroup says of it (its pod,
	// container, unit); nil when unknown.
	Workload *workload.Workload `json:"cgroup,omitempty"`
}

// QP is one QP of one sample: what RDMA netlink's QP dump reports, with
// its owner already resolved (the kernel's pid mapped from a thread to its
// process, or found through the PD and context tables) and the processes
// that keep its context alive.
type QP struct {
	// Port is the port number, 0 when the kernel reports none (RESET).
	Port uint32
	// LQPN is the local QP number.
	LQPN uint32
	// Type and State are spelled as iproute2's rdma tool prints them
	// ("RC", "UD", "GSI"; "RTS", "ERR", "SQE").
	Type, State string
	// KernName is the kernel module that owns a kernel QP ("ib_core",
	// "ib_ipoib"); empty for user QPs.
	KernName string
	// Owner is the live process that created the QP's context; PID 0 when
	// none is known: the creator exited, leaving the context to holders,
	// or, with OwnerUncertain, the kernel could not tell.
	Owner Process
	// OwnerUncertain: no owner is known, and the creator may be alive (the
	// kernel has no context table to name it; Sample.Notes says so).
	OwnerUncertain bool
	// Holders are the processes that keep the QP's context alive by
	// holding its uverbs file open or mapped (the creator, a forked child,
	// a process an fd was passed to); when HoldersCertain is false, the
	// candidates, any of which may hold it.
	Holders []Process
	// HoldersCertain: Holders are exactly the processes holding the QP's
	// context.
	HoldersCertain bool
}

// Kernel reports whether the QP belongs to the kernel.
func (q *QP) Kernel() bool { return q.KernName != "" }

// Device is one RDMA device in a sample.
type Device struct {
	// Name is the RDMA device's name ("mlx5_0", "rxe0").
	Name string
	// QPs are the device's QPs at the time of the sample.
	QPs []QP
}

// Sample is the host's QPs at one moment.
type Sample struct {
	// At is when the sample was taken.
	At time.Time
	// Devices are the host's RDMA devices.
	Devices []Device
	// Notes say what the sample could not tell ("rxe0: the kernel has no
	// RES_CTX_GET ..."); Analyze passes them on in its report.
	Notes []string
}

// A Sampler reads the host's QPs. Sample returns ErrNoRDMA (wrapped) when
// the host has no RDMA device, the context's error when it is done, and
// any other error when the read failed; it must not change the host.
type Sampler interface {
	Sample(ctx context.Context) (Sample, error)
}

// Limit is what is known of a device's QP limit.
type Limit struct {
	// MaxQP is the device's max_qp (ibv_query_device); 0 when unknown.
	MaxQP int
	// Unknown says why MaxQP is not known ("this build has no
	// libibverbs"); empty when it is.
	Unknown string
}

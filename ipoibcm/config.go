package ipoibcm

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/qpdrain/qpdrain/clock"
	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/ibv"
)

// Policy says how a Manager drains the QPs of closed connections.
type Policy uint8

// Policies.
const (
	// Kernel is ipoib_cm.c exactly: Last WQE Reached moves a QP to the
	// flush list; one drain WR (IPOIB_CM_RX_DRAIN_WRID) at a time is posted
	// on the first QP of the flush list, which then moves whole to the drain
	// list; its completion moves the drain list to the reap list. Nothing
	// times out: a provider that never completes the drain WR leaves the
	// drain list, and every QP behind it, there for ever (the eHCA leak).
	Kernel Policy = iota
	// Bounded is qpdrain's: the same lists, but the drain goes through a
	// drain.Reaper whose every wait is bounded (Config.Drain), and a
	// disconnect moves the QP to the error list at once, with a deadline
	// for its Last WQE Reached. The reaper runs on Config.Clock, and a
	// stalled drain takes its policy: given up, destroyed, once a poll
	// after the stall found the CQ empty (the default here, EventGivenUp),
	// or kept in its bounded, counted quarantine (Config.QuarantinePolicy).
	Bounded
)

// String names the policy ("kernel", "bounded").
func (p Policy) String() string {
	switch p {
	case Kernel:
		return "kernel"
	case Bounded:
		return "bounded"
	}
	return "Policy(?)"
}

// MarshalText encodes the policy as its name, so that JSON (-j) carries
// the word the text output prints. It never fails.
func (p Policy) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText reads a policy's name ("kernel", "bounded") back, as
// --policy takes it; any other text is an error naming the two.
func (p *Policy) UnmarshalText(text []byte) error {
	for _, q := range [...]Policy{Kernel, Bounded} {
		if string(text) == q.String() {
			*p = q
			return nil
		}
	}
	return fmt.Errorf("policy %q: want kernel or bounded", text)
}

// The kernel's timers (ipoib_cm.c, with HZ ticks as seconds) and limits.
const (
	DefaultUpdateTime    = 256 * time.Second // IPOIB_CM_RX_UPDATE_TIME
	DefaultTimeout       = 2 * 256 * time.Second
	DefaultDelay         = 3 * 256 * time.Second // IPOIB_CM_RX_DELAY
	DefaultStopTimeout   = 5 * time.Second       // ipoib_cm_dev_stop's wait
	DefaultMaxNonSRQConn = 128                   // max_nonsrq_conn_qp
	MaxNonSRQConnLimit   = 4096                  // the module parameter's clamp
	// DefaultRecvQueueSize is ipoib_recvq_size's default (IPOIB_RX_RING_SIZE).
	DefaultRecvQueueSize = 256
	// KernelDrainWRID is IPOIB_CM_RX_DRAIN_WRID, the Kernel policy's drain WR.
	KernelDrainWRID uint64 = 0xffffffff
	// UpdateMask is IPOIB_CM_RX_UPDATE_MASK: only receives whose ring index
	// has these bits clear refresh a connection's time stamp.
	UpdateMask uint64 = 0x3
)

// Config configures a Manager.
type Config struct {
	// Context is the device; the Manager reads its async events
	// (Service). Required.
	Context ibv.Context
	// PD the QPs, SRQ and receive buffer are created in. Required.
	PD ibv.PD
	// NoSRQ gives each connection its own receive queue, as ipoib_cm.c does
	// on devices without SRQs, instead of one shared SRQ.
	NoSRQ bool
	// RecvQueueSize is ipoib_recvq_size: the SRQ's depth, or each
	// connection's receive ring without an SRQ (default
	// DefaultRecvQueueSize).
	RecvQueueSize int
	// MaxNonSRQConn is max_nonsrq_conn_qp: without an SRQ, connections past
	// it are rejected with RejNoQP (default 128, at most 4096).
	MaxNonSRQConn int
	// UpdateTime, Timeout and Delay are IPOIB_CM_RX_UPDATE_TIME,
	// IPOIB_CM_RX_TIMEOUT and IPOIB_CM_RX_DELAY (defaults 256 s, 512 s,
	// 768 s).
	UpdateTime, Timeout, Delay time.Duration
	// StopTimeout bounds Stop's wait for the drains (default 5 s).
	StopTimeout time.Duration
	// Policy is the drain policy (default Kernel).
	Policy Policy
	// Drain configures the Bounded policy's reaper. Its LastWQETimeout and
	// DrainTimeout (default 5 s each) run on Clock; its Policy is
	// drain.DestroyWhenEmpty unless QuarantinePolicy, and its Headroom
	// defaults to 16.
	Drain drain.Options
	// QuarantinePolicy makes the Bounded policy keep a stalled QP in the
	// reaper's quarantine (drain.Quarantine) instead of destroying it once
	// the CQ is proven empty.
	QuarantinePolicy bool
	// Clock runs every timer (default clock.Real; a clock.Virtual or a soft
	// device's fabric, soft.Fabric, in simulations).
	Clock clock.Clock
	// Trace, if set, sees every transition, in order, under the Manager's
	// lock: it must not call the Manager.
	Trace func(Event)
	// OnEvent receives the async events the Manager does not claim.
	OnEvent func(ibv.AsyncEvent)
	// Log receives warnings where ipoib_cm.c warns (ipoib_warn), with the
	// QP number as "lqpn"; nil logs nothing.
	Log *slog.Logger
}

func (c Config) withDefaults() (Config, error) {
	if c.Context == nil || c.PD == nil {
		return c, fmt.Errorf("config: Context and PD are required: %w", ibv.ErrInvalidArgument)
	}
	if c.RecvQueueSize == 0 {
		c.RecvQueueSize = DefaultRecvQueueSize
	}
	if c.MaxNonSRQConn == 0 {
		c.MaxNonSRQConn = DefaultMaxNonSRQConn
	}
	c.MaxNonSRQConn = min(c.MaxNonSRQConn, MaxNonSRQConnLimit)
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&c.UpdateTime, DefaultUpdateTime}, {&c.Timeout, DefaultTimeout}, {&c.Delay, DefaultDelay},
		{&c.StopTimeout, DefaultStopTimeout},
		{&c.Drain.LastWQETimeout, drain.DefaultLastWQETimeout}, {&c.Drain.DrainTimeout, drain.DefaultDrainTimeout},
	} {
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	switch {
	case c.RecvQueueSize < 1:
		return c, fmt.Errorf("config: receive queue size %d: want at least 1: %w", c.RecvQueueSize, ibv.ErrInvalidArgument)
	case c.MaxNonSRQConn < 1:
		return c, fmt.Errorf("config: max_nonsrq_conn_qp %d: want at least 1: %w", c.MaxNonSRQConn, ibv.ErrInvalidArgument)
	case c.UpdateTime < 0 || c.Timeout < 0 || c.Delay <= 0 || c.StopTimeout < 0 || c.Drain.LastWQETimeout < 0 || c.Drain.DrainTimeout < 0:
		return c, fmt.Errorf("config: a negative timer, or a zero stale-task delay: %w", ibv.ErrInvalidArgument)
	case c.Policy != Kernel && c.Policy != Bounded:
		return c, fmt.Errorf("config: %s: %w", c.Policy, ibv.ErrInvalidArgument)
	}
	return c, nil
}

// CQEntries is the depth of the CQ the Manager creates for c, whose
// RecvQueueSize and MaxNonSRQConn are set: every receive that can be
// outstanding, one spare slot for the drain WR (ipoib_cm.c reserves
// exactly one), and the Bounded policy's headroom. A caller compares it
// with DeviceAttr.MaxCQE before anything is created.
func (c Config) CQEntries() int {
	var reserved drain.Options // ipoib_cm.c's one spare slot: DefaultHeadroom
	if c.Policy == Bounded {
		reserved.Headroom = max(c.Drain.Headroom, boundedHeadroom)
	}
	if c.NoSRQ {
		return reserved.CQEntries(c.MaxNonSRQConn * c.RecvQueueSize)
	}
	return reserved.CQEntries(2 * c.RecvQueueSize)
}

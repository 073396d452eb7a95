package soft

import (
	"context"
	"fmt"

	"github.com/qpdrain/qpdrain/ibv"
)

// Config configures a soft device for Open.
type Config struct {
	// Name is the device name; default "soft0".
	Name string
	// Fabric connects devices: QPs of two devices on one Fabric can connect
	// to each other. Nil gives the device a private fabric.
	Fabric *Fabric
	// Limits caps the device's objects; zero fields take defaults.
	Limits Limits
	// Quirks switch on documented deviations of real providers; all off by default.
	Quirks Quirks
	// SRQPrefetch is how many receive WQEs an SRQ-attached RC QP takes ahead
	// from its SRQ once in RTR: the soft device's model of WQEs "taken but
	// not yet completed". 0 takes none ahead.
	SRQPrefetch int
}

// Limits caps the objects of one device. A zero field takes its default.
type Limits struct {
	MaxQP, MaxQPWR, MaxSGE, MaxCQ, MaxCQE, MaxSRQ, MaxSRQWR, MaxMR, MaxPD, MaxQPRdAtom int
}

// Quirks are named deviations of real providers from the IBTA semantics,
// each off by default. See the package documentation for their sources.
type Quirks struct {
	// SendInErrorNotFlushed: a send WR posted while the QP is in ERROR never
	// completes (IBM eHCA, the seed thread).
	SendInErrorNotFlushed bool
	// NoLastWQEReached: Last WQE Reached is never raised (cxgb4 before its 2025 fix).
	NoLastWQEReached bool
	// LastWQEReachedTwice: Last WQE Reached is raised twice.
	LastWQEReachedTwice bool
	// RecvInErrorFlushDeferred: a receive posted in ERROR is not flushed
	// until something else happens on the QP (its next post or modify).
	RecvInErrorFlushDeferred bool
	// DrainNeedsRTS: WRs posted in ERROR are flushed only if the QP was in
	// RTS before entering ERROR (Mellanox firmware, per ipoib_cm.c).
	DrainNeedsRTS bool
}

// Fabric connects soft devices in one process.
type Fabric struct{}

// NewFabric returns an empty fabric with auto-progress on.
func NewFabric() *Fabric { return &Fabric{} }

// SetAutoProgress chooses when posted sends execute: on (the default), a
// send executes synchronously inside PostSend; off, sends stay outstanding
// until Progress executes them.
func (f *Fabric) SetAutoProgress(on bool) {}

// Progress executes up to max queued send WRs in post order across the
// fabric (max <= 0: all) and returns how many it executed.
func (f *Fabric) Progress(max int) int { return 0 }

// Device is an open soft RDMA device; it implements ibv.Context.
type Device struct{}

// Open opens a soft device.
func Open(cfg Config) (*Device, error) { return &Device{}, nil }

// InjectSRQError puts srq in error: EventSRQErr on the SRQ, then every
// attached QP moves to ERROR with EventQPFatal, flushes and raises Last WQE
// Reached.
func (d *Device) InjectSRQError(srq ibv.SRQ) error { return ibv.ErrNotSupported }

// Name is the device name.
func (d *Device) Name() string { return "soft0" }

// QueryDevice returns the device's limits.
func (d *Device) QueryDevice() (ibv.DeviceAttr, error) { return ibv.DeviceAttr{}, ibv.ErrNotSupported }

// QueryPort returns the port's attributes.
func (d *Device) QueryPort(port uint8) (ibv.PortAttr, error) {
	return ibv.PortAttr{}, ibv.ErrNotSupported
}

// QueryGID returns a GID table entry.
func (d *Device) QueryGID(port uint8, index int) (ibv.GID, error) {
	return ibv.GID{}, ibv.ErrNotSupported
}

// QueryGIDTable returns the GID table.
func (d *Device) QueryGIDTable() ([]ibv.GIDEntry, error) { return nil, ibv.ErrNotSupported }

// AllocPD allocates a protection domain.
func (d *Device) AllocPD() (ibv.PD, error) { return nil, ibv.ErrNotSupported }

// CreateCompChannel creates a completion channel.
func (d *Device) CreateCompChannel() (ibv.CompChannel, error) { return nil, ibv.ErrNotSupported }

// CreateCQ creates a CQ.
func (d *Device) CreateCQ(cqe int, ch ibv.CompChannel) (ibv.CQ, error) {
	return nil, ibv.ErrNotSupported
}

// NextAsyncEvent waits for the next async event.
func (d *Device) NextAsyncEvent(ctx context.Context) (ibv.AsyncEvent, error) {
	return ibv.AsyncEvent{}, fmt.Errorf("waiting for async event: %w", ibv.ErrNotSupported)
}

// Close closes the device.
func (d *Device) Close() error { return nil }

var _ ibv.Context = (*Device)(nil)

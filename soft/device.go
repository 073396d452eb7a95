package soft

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/ibv/objtrace"
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
	// Transport is the device's personality: ibv.TransportIB (the zero
	// value: InfiniBand rules, a CA) or ibv.TransportIWARP (siw's rules,
	// an RNIC: QPs connect only through the RDMA CM, no Last WQE Reached;
	// the package documentation, "iWARP"). Any other is
	// ibv.ErrInvalidArgument.
	Transport ibv.TransportType
	// SRQPrefetch is how many receive WQEs an SRQ-attached RC QP takes ahead
	// from its SRQ once in RTR: the soft device's model of WQEs "taken but
	// not yet completed". 0 takes none ahead.
	SRQPrefetch int
	// Schedule makes the device adversarial when its Seed is non-zero
	// (package documentation, "Adversarial schedules"); the zero value is
	// orderly.
	Schedule Schedule
	// Trace, when set, is called for every state change, completion, async
	// event and SRQ take of the device, in the order they happen. It runs
	// with the fabric's lock held: it must not call back into the device.
	Trace func(TraceEntry)
}

// Limits caps the objects of one device. A zero field takes its default,
// which is rxe's value for the same limit; a negative one makes Open fail
// with ErrInvalidArgument.
type Limits struct {
	MaxQP       int // QPs on the device (default 65536)
	MaxQPWR     int // WRs per send or receive queue (default 16384)
	MaxSGE      int // SGEs per WR (default 32)
	MaxCQ       int // CQs (default 16384)
	MaxCQE      int // completions per CQ (default 32767)
	MaxSRQ      int // SRQs (default 16384)
	MaxSRQWR    int // WRs per SRQ (default 16384)
	MaxMR       int // memory regions (default 65536)
	MaxPD       int // protection domains (default 65536)
	MaxQPRdAtom int // outstanding RDMA READ/atomic per QP, both directions (default 128)
	// MaxInlineData is the most a QP's Cap.MaxInlineData may ask for
	// (default 512, rxe's RXE_MAX_INLINE_DATA: 32 SGEs of 16 bytes). Like
	// rxe, the device does not report it: ibv_device_attr has no field
	// for it, so QueryDevice does not either.
	MaxInlineData int
}

// limitField is one field of Limits, its name and its default.
type limitField struct {
	name string
	v    *int
	def  int
}

// fields lists every limit with its default, for withDefaults and check.
func (l *Limits) fields() []limitField {
	return []limitField{
		{"MaxQP", &l.MaxQP, 65536},
		{"MaxQPWR", &l.MaxQPWR, 16384},
		{"MaxSGE", &l.MaxSGE, 32},
		{"MaxCQ", &l.MaxCQ, 16384},
		{"MaxCQE", &l.MaxCQE, 32767},
		{"MaxSRQ", &l.MaxSRQ, 16384},
		{"MaxSRQWR", &l.MaxSRQWR, 16384},
		{"MaxMR", &l.MaxMR, 65536},
		{"MaxPD", &l.MaxPD, 65536},
		{"MaxQPRdAtom", &l.MaxQPRdAtom, 128},
		{"MaxInlineData", &l.MaxInlineData, 512},
	}
}

func (l Limits) withDefaults() Limits {
	for _, f := range l.fields() {
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	return l
}

// check names the first negative limit.
func (l Limits) check() error {
	for _, f := range l.fields() {
		if *f.v < 0 {
			return fmt.Errorf("limit %s is %d: %w", f.name, *f.v, ibv.ErrInvalidArgument)
		}
	}
	return nil
}

// Quirks are named deviations of real providers from the IBTA semantics,
// each off by default. The package documentation says where each comes from.
type Quirks struct {
	// SendInErrorNotFlushed: a send WR posted while the QP is in ERROR never
	// completes (IBM eHCA, the eHCA thread).
	SendInErrorNotFlushed bool
	// NoLastWQEReached: Last WQE Reached is never raised (cxgb4 before its 2025 fix).
	NoLastWQEReached bool
	// LastWQEReachedTwice: Last WQE Reached is raised twice (rxe on Linux
	// 6.12 raises it again after a send is posted in ERROR, docs/PROVIDERS.md).
	LastWQEReachedTwice bool
	// RecvInErrorFlushDeferred: a receive posted in ERROR is not flushed
	// until something else happens on the QP (its next post or modify).
	RecvInErrorFlushDeferred bool
	// DrainNeedsRTS: WRs posted in ERROR are flushed only if the QP was in
	// RTS before entering ERROR (Mellanox firmware, per ipoib_cm.c).
	DrainNeedsRTS bool
	// RecvInErrorNotFlushed: a receive posted in ERROR never completes
	// (rxe on Linux 6.1, docs/PROVIDERS.md).
	RecvInErrorNotFlushed bool
	// NoResponderErrorEvent: a responder error moves the responder to
	// ERROR without QP_ACCESS_ERR or QP_REQ_ERR (rxe on Linux 6.1 and
	// 6.12, docs/PROVIDERS.md).
	NoResponderErrorEvent bool
	// LastWQEReachedAgain: an SRQ QP in ERROR that has raised Last WQE
	// Reached raises it again on every later modify to ERROR and every
	// send posted (rxe on Linux 6.12, flushcheck's last-wqe-repeat,
	// docs/PROVIDERS.md).
	LastWQEReachedAgain bool
	// CQOverrunKeepsQPs: a full CQ raises CQ_ERR for each completion it
	// loses and keeps working; its QPs stay in their state without
	// QP_FATAL (rxe on Linux 6.1 and 6.12, rxe_cq_post; flushcheck's
	// cq-overrun, docs/PROVIDERS.md).
	CQOverrunKeepsQPs bool
	// FlushDeferred: a QP moved to ERROR by Modify generates its flushes
	// (and Last WQE Reached) later, when its CQ is next polled or the QP
	// is next posted to or modified, as hns does from a workqueue
	// (init_flush_work in drivers/infiniband/hw/hns). Flushes of QPs
	// sharing a CQ then come in the order the CQ is polled, not the order
	// the QPs entered ERROR (flushcheck's flush-order).
	FlushDeferred bool
	// SQDrainedEarly: a QP moved from RTS to SQD while its head send is
	// in flight and due for a retry (an RNR NAK, or a missing ACK with a
	// non-zero timeout) raises SQ_DRAINED at once, and the send does not
	// start again until the QP is back in RTS: rxe's req_retry rewinds it
	// to "posted", which its SQD drain check takes for drained (rxe on
	// Linux 6.1 and 6.12, flushcheck's sqd, docs/PROVIDERS.md).
	SQDrainedEarly bool
}

// Device is an open soft RDMA device; it implements ibv.Context. Its single
// port is port 1, with LID and GID given by the fabric (QueryPort, QueryGID).
type Device struct {
	fab    *Fabric
	name   string
	lid    uint16
	limits Limits
	quirks Quirks
	iwarp  bool // Config.Transport is ibv.TransportIWARP
	pref   int
	trace  func(TraceEntry)
	rec    *objtrace.Record
	adv    *adversary // nil in orderly mode

	// Everything below is guarded by fab.mu.
	closed   bool
	done     chan struct{} // closed by Close, wakes NextAsyncEvent
	evWake   chan struct{} // one token: an event was queued
	events   ring[ibv.AsyncEvent]
	qps      map[uint32]*QP
	mrs      []*MR // index key>>8 - 1; nil once closed
	nMR      int
	nextQPN  uint32
	nextID   uint32 // CQ and SRQ handles, for traces
	nextSeq  uint64 // creation order of QPs, for deterministic walks
	nPD      int
	nCQ      int
	nSRQ     int
	nChannel int
}

var _ ibv.Context = (*Device)(nil)

// firstQPN is the first QP number a device hands out; 0 and 1 are the
// special QPs of InfiniBand, and rxe also starts at 17.
const firstQPN = 17

// Open opens a soft device on cfg.Fabric (or a private fabric).
func Open(cfg Config) (*Device, error) {
	if cfg.Name == "" {
		cfg.Name = "soft0"
	}
	if cfg.SRQPrefetch < 0 {
		return nil, fmt.Errorf("opening soft device %s: SRQPrefetch %d: %w", cfg.Name, cfg.SRQPrefetch, ibv.ErrInvalidArgument)
	}
	if err := cfg.Limits.check(); err != nil {
		return nil, fmt.Errorf("opening soft device %s: %w", cfg.Name, err)
	}
	if cfg.Transport != ibv.TransportIB && cfg.Transport != ibv.TransportIWARP {
		return nil, fmt.Errorf("opening soft device %s: transport %s, want InfiniBand or iWARP: %w", cfg.Name, cfg.Transport, ibv.ErrInvalidArgument)
	}
	iwarp := cfg.Transport == ibv.TransportIWARP
	if iwarp {
		// siw raises IB_EVENT_QP_LAST_WQE_REACHED nowhere (package
		// documentation, "iWARP").
		cfg.Quirks.NoLastWQEReached = true
	}
	fab := cfg.Fabric
	if fab == nil {
		fab = NewFabric()
	}
	d := &Device{
		fab:     fab,
		name:    cfg.Name,
		limits:  cfg.Limits.withDefaults(),
		quirks:  cfg.Quirks,
		iwarp:   iwarp,
		pref:    cfg.SRQPrefetch,
		trace:   cfg.Trace,
		done:    make(chan struct{}),
		evWake:  make(chan struct{}, 1),
		qps:     map[uint32]*QP{},
		nextQPN: firstQPN,
	}
	if cfg.Schedule.Adversarial() {
		d.adv = newAdversary(cfg.Schedule.Seed, cfg.Name)
		// Devices hand out overlapping numbers, not from one base.
		d.nextQPN += uint32(d.adv.rng.IntN(advQPNBaseSpread))
	}
	fab.mu.Lock()
	defer fab.mu.Unlock()
	for _, o := range fab.devices {
		if o != nil && o.name == d.name {
			return nil, fmt.Errorf("opening soft device %s: name taken on this fabric: %w", d.name, ibv.ErrInvalidArgument)
		}
	}
	fab.devices = append(fab.devices, d)
	if d.adv != nil {
		fab.adv = append(fab.adv, d)
	}
	d.lid = uint16(len(fab.devices))
	d.rec = objtrace.Track("soft device %s", d.name)
	return d, nil
}

// Name is the device name.
func (d *Device) Name() string { return d.name }

// Info is the device as libibverbs would list it: a CA on the InfiniBand
// transport, or an RNIC on iWARP (Config.Transport).
func (d *Device) Info() ibv.DeviceInfo {
	info := ibv.DeviceInfo{Name: d.name, GUID: d.guid(), NodeType: ibv.NodeCA, Transport: ibv.TransportIB}
	if d.iwarp {
		info.NodeType, info.Transport = ibv.NodeRNIC, ibv.TransportIWARP
	}
	return info
}

// Fabric is the fabric the device is on, whose clock its timers run on.
func (d *Device) Fabric() *Fabric { return d.fab }

// LID is the LID of the device's port 1; a QP addresses a peer on this
// device with QPAttr.AH.DLID set to it.
func (d *Device) LID() uint16 { return d.lid }

// GID is the single GID of the device's port 1, fe80::<LID>; a QP may also
// address a peer on this device with a global route to it.
func (d *Device) GID() ibv.GID {
	g := ibv.GID{0: 0xfe, 1: 0x80}
	g[14], g[15] = byte(d.lid>>8), byte(d.lid)
	return g
}

func (d *Device) guid() uint64 { return 0x02_50_56_ff_fe_00_00_00 | uint64(d.lid) }

// QueryDevice returns the device's limits.
func (d *Device) QueryDevice() (ibv.DeviceAttr, error) {
	d.fab.mu.Lock()
	defer d.fab.mu.Unlock()
	if d.closed {
		return ibv.DeviceAttr{}, fmt.Errorf("querying device %s: %w", d.name, ibv.ErrClosed)
	}
	l := d.limits
	return ibv.DeviceAttr{
		FWVer:           "soft",
		NodeGUID:        d.guid(),
		SysImageGUID:    d.guid(),
		MaxMRSize:       ^uint64(0),
		PageSizeCap:     4096,
		MaxQP:           l.MaxQP,
		MaxQPWR:         l.MaxQPWR,
		MaxSGE:          l.MaxSGE,
		MaxCQ:           l.MaxCQ,
		MaxCQE:          l.MaxCQE,
		MaxMR:           l.MaxMR,
		MaxPD:           l.MaxPD,
		MaxQPRdAtom:     l.MaxQPRdAtom,
		MaxQPInitRdAtom: l.MaxQPRdAtom,
		MaxSRQ:          l.MaxSRQ,
		MaxSRQWR:        l.MaxSRQWR,
		MaxSRQSGE:       l.MaxSGE,
		AtomicCap:       ibv.AtomicHCA,
		PhysPortCnt:     1,
	}, nil
}

// QueryPort returns the attributes of port 1, the only port.
func (d *Device) QueryPort(port uint8) (ibv.PortAttr, error) {
	d.fab.mu.Lock()
	defer d.fab.mu.Unlock()
	if d.closed {
		return ibv.PortAttr{}, fmt.Errorf("querying port %d of %s: %w", port, d.name, ibv.ErrClosed)
	}
	if port != 1 {
		return ibv.PortAttr{}, fmt.Errorf("querying port %d of %s: %w", port, d.name, ibv.ErrInvalidArgument)
	}
	return ibv.PortAttr{
		State:     ibv.PortActive,
		MaxMTU:    ibv.MTU4096,
		ActiveMTU: ibv.MTU4096,
		GIDTblLen: 1,
		MaxMsgSz:  1 << 31,
		LID:       d.lid,
		PhysState: 5, // LinkUp
		LinkLayer: ibv.LinkLayerInfiniBand,
	}, nil
}

// QueryGID returns GID index 0 of port 1, the only entry.
func (d *Device) QueryGID(port uint8, index int) (ibv.GID, error) {
	d.fab.mu.Lock()
	defer d.fab.mu.Unlock()
	if d.closed {
		return ibv.GID{}, fmt.Errorf("querying GID %d of %s port %d: %w", index, d.name, port, ibv.ErrClosed)
	}
	if port != 1 || index != 0 {
		return ibv.GID{}, fmt.Errorf("querying GID %d of %s port %d: %w", index, d.name, port, ibv.ErrInvalidArgument)
	}
	return d.GID(), nil
}

// QueryGIDTable returns the device's one GID entry.
func (d *Device) QueryGIDTable() ([]ibv.GIDEntry, error) {
	g, err := d.QueryGID(1, 0)
	if err != nil {
		return nil, err
	}
	return []ibv.GIDEntry{{GID: g, Index: 0, Port: 1, Type: ibv.GIDTypeIB}}, nil
}

// NextAsyncEvent returns the device's oldest undelivered async event,
// waiting for one if there is none. Each event is delivered exactly once and
// counts as acknowledged when returned; an event of a QP, CQ or SRQ closed
// before it would be returned is dropped. It returns ctx.Err() when ctx ends
// first and ErrClosed once the device is closed.
func (d *Device) NextAsyncEvent(ctx context.Context) (ibv.AsyncEvent, error) {
	for {
		d.fab.mu.Lock()
		if d.closed {
			d.fab.mu.Unlock()
			return ibv.AsyncEvent{}, fmt.Errorf("waiting for an async event of %s: %w", d.name, ibv.ErrClosed)
		}
		if d.events.len() == 0 {
			// A waiting caller lets delayed events fall due, and time pass.
			d.fab.idle(func() bool {
				return d.events.len() > 0 || d.adv != nil && !d.adv.eventsComing() && len(d.fab.clk.timers) == 0
			})
		}
		if d.events.len() > 0 {
			ev := d.events.pop()
			stale := ofClosedObject(ev)
			d.fab.mu.Unlock()
			if stale {
				continue
			}
			return ev, nil
		}
		again := d.fab.idleWait()
		d.fab.mu.Unlock()
		select {
		case <-d.evWake:
		case <-d.done:
		case <-after(again):
		case <-ctx.Done():
			return ibv.AsyncEvent{}, ctx.Err()
		}
	}
}

// after is time.After for a waiter, or nil (never) for 0.
func after(d time.Duration) <-chan time.Time {
	if d == 0 {
		return nil
	}
	return time.After(d)
}

// ofClosedObject reports whether ev concerns a QP, CQ or SRQ closed since
// it was raised. Such an event is dropped, as the libibverbs implementation
// drops it: its owner has let go of the object. Called with fab.mu held.
func ofClosedObject(ev ibv.AsyncEvent) bool {
	switch {
	case ev.QP != nil:
		q, ok := ev.QP.(*QP)
		return ok && q.closed
	case ev.CQ != nil:
		c, ok := ev.CQ.(*CQ)
		return ok && c.closed
	case ev.SRQ != nil:
		s, ok := ev.SRQ.(*SRQ)
		return ok && s.closed
	}
	return false
}

// raise queues an async event: for delivery now in orderly mode, after a
// few device calls in adversarial mode. Called with fab.mu held.
func (d *Device) raise(ev ibv.AsyncEvent) {
	if q, ok := ev.QP.(*QP); ok {
		// Stamped now: an adversarial delay must not move it to a later
		// episode.
		ev.QPResets = q.resets.Load()
	}
	if a := d.adv; a != nil {
		if delay := a.rng.IntN(advMaxEventDelay + 1); delay > 0 || a.delayed.len() > 0 {
			a.delayed.push(delayedEvent{ev: ev, due: a.steps + uint64(delay)})
			d.wakeEvents()
			return
		}
	}
	d.deliver(ev)
}

// deliver makes ev the newest event NextAsyncEvent returns.
func (d *Device) deliver(ev ibv.AsyncEvent) {
	d.events.push(ev)
	d.emit(TraceEntry{Kind: TraceEvent, Event: ev})
	d.wakeEvents()
}

// wakeEvents wakes a caller waiting in NextAsyncEvent.
func (d *Device) wakeEvents() {
	select {
	case d.evWake <- struct{}{}:
	default:
	}
}

// Close closes the device. It fails with ErrBusy while PDs, CQs or
// completion channels are open; a second Close returns nil.
func (d *Device) Close() error {
	return d.fab.closeObject(&d.closed, d.rec, func() error {
		if d.nPD > 0 || d.nCQ > 0 || d.nChannel > 0 {
			return fmt.Errorf("closing device %s with %d PDs, %d CQs, %d completion channels open: %w",
				d.name, d.nPD, d.nCQ, d.nChannel, ibv.ErrBusy)
		}
		d.fab.gen++
		close(d.done)
		d.events.reset()
		return nil
	})
}

// InjectSRQError puts srq, an SRQ of this device, in error: the SRQ raises
// EventSRQErr, then every attached QP past RESET and not yet in ERROR moves
// to ERROR with its own EventQPFatal (IBTA Table 58, class A: a receive
// queue that cannot fetch from its SRQ), flushes and raises Last WQE
// Reached. Afterwards posting to the SRQ fails with ErrInvalidState.
func (d *Device) InjectSRQError(srq ibv.SRQ) error {
	s, ok := srq.(*SRQ)
	if !ok || s == nil || s.dev != d {
		return fmt.Errorf("injecting an SRQ error on %s: not an SRQ of this device: %w", d.name, ibv.ErrInvalidArgument)
	}
	d.fab.mu.Lock()
	defer d.fab.mu.Unlock()
	if s.closed {
		return fmt.Errorf("injecting an error on SRQ %d: %w", s.id, ibv.ErrClosed)
	}
	if s.errored {
		return nil
	}
	s.errored = true
	d.raise(ibv.AsyncEvent{Type: ibv.EventSRQErr, SRQ: s})
	for _, q := range s.qps {
		if q.state != ibv.QPSReset {
			q.moveToError(ibv.EventQPFatal)
		}
	}
	return nil
}

// waitingSenders returns the device's QPs, in QP number order, that hold
// sends they may still execute.
func (d *Device) waitingSenders() []*QP {
	var qps []*QP
	for _, q := range d.qps {
		if q.sq.len() > 0 && (q.state == ibv.QPSRTS || q.state == ibv.QPSSQD) {
			qps = append(qps, q)
		}
	}
	slices.SortFunc(qps, func(a, b *QP) int { return cmp.Compare(a.num, b.num) })
	return qps
}

// sortedQPs returns the QPs of set in creation order, so that walks over
// them are deterministic.
func sortedQPs(set map[*QP]struct{}) []*QP {
	qps := make([]*QP, 0, len(set))
	for q := range set {
		qps = append(qps, q)
	}
	slices.SortFunc(qps, func(a, b *QP) int { return cmp.Compare(a.seq, b.seq) })
	return qps
}

package soft

import (
	"context"
	"fmt"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/ibv/objtrace"
)

// CQ is a fixed-depth completion queue of a soft device. Its memory is
// allocated at creation, like a hardware CQ ring.
type CQ struct {
	dev   *Device
	id    uint32
	depth int
	ch    *CompChannel
	rec   *objtrace.Record
	// Guarded by dev.fab.mu.
	buf           []ibv.WC
	meta          []wcMeta // per entry of buf: the slots its poll frees
	head, n       int
	qps           map[*QP]struct{} // QPs completing into this CQ
	armed         bool
	solicitedOnly bool
	errored       bool // overflowed: completions are dropped from now on
	closed        bool
}

var _ ibv.CQ = (*CQ)(nil)

// wcMeta says which QP a completion belongs to and how many of its work
// queue slots polling it frees: a send completion frees its WR's slot and
// those of the unsignaled WRs that completed silently before it on the
// same send queue; a receive completion frees one slot of the QP's own
// receive queue or of its SRQ.
type wcMeta struct {
	qp     *QP
	sq, rq uint32
}

// free returns the slots the completion held: to the QP's send queue, and
// to its receive queue or its SRQ.
func (m *wcMeta) free() {
	q := m.qp
	q.sqUsed -= m.sq
	if q.srq != nil {
		q.srq.used -= m.rq
	} else {
		q.rqUsed -= m.rq
	}
}

// CreateCQ creates a CQ holding exactly cqe completions. With a non-nil
// channel (from this device), ReqNotify arms it to signal that channel.
func (d *Device) CreateCQ(cqe int, channel ibv.CompChannel) (ibv.CQ, error) {
	var ch *CompChannel
	if channel != nil {
		c, ok := channel.(*CompChannel)
		if !ok || c == nil || c.dev != d {
			return nil, fmt.Errorf("creating a CQ on %s: completion channel of another device: %w", d.name, ibv.ErrInvalidArgument)
		}
		ch = c
	}
	d.fab.mu.Lock()
	defer d.fab.mu.Unlock()
	switch {
	case d.closed:
		return nil, fmt.Errorf("creating a CQ on %s: %w", d.name, ibv.ErrClosed)
	case ch != nil && ch.closed:
		return nil, fmt.Errorf("creating a CQ on %s: completion channel: %w", d.name, ibv.ErrClosed)
	case cqe <= 0:
		return nil, fmt.Errorf("creating a CQ of %d entries: %w", cqe, ibv.ErrInvalidArgument)
	case cqe > d.limits.MaxCQE:
		return nil, fmt.Errorf("creating a CQ of %d entries on %s (max %d): %w", cqe, d.name, d.limits.MaxCQE, ibv.ErrInvalidArgument)
	case d.nCQ >= d.limits.MaxCQ:
		return nil, fmt.Errorf("creating a CQ on %s (max %d): %w", d.name, d.limits.MaxCQ, ibv.ErrResourceLimit)
	}
	d.nCQ++
	d.nextID++
	c := &CQ{dev: d, id: d.nextID, depth: cqe, ch: ch, buf: make([]ibv.WC, cqe), meta: make([]wcMeta, cqe), qps: map[*QP]struct{}{}}
	c.rec = objtrace.Track("soft CQ %d on %s", c.id, d.name)
	if ch != nil {
		ch.nCQ++
	}
	return c, nil
}

// ID is the CQ's handle on its device, counted from 1, as traces name it.
func (c *CQ) ID() uint32 { return c.id }

// CQE is the number of completions the CQ holds.
func (c *CQ) CQE() int { return c.depth }

// Poll moves up to len(wcs) completions into wcs, oldest first. A CQ that
// overflowed still returns the completions it held before the overflow.
func (c *CQ) Poll(wcs []ibv.WC) (int, error) {
	c.dev.fab.mu.Lock()
	defer c.dev.fab.mu.Unlock()
	if c.closed {
		return 0, fmt.Errorf("polling CQ %d: %w", c.id, ibv.ErrClosed)
	}
	f := c.dev.fab
	f.tickIdle()
	if c.dev.quirks.FlushDeferred {
		for _, q := range sortedQPs(c.qps) {
			if q.flushPending {
				q.flushDeferred()
			}
		}
	}
	if c.n == 0 {
		// A poller that finds nothing lets deferred work move on.
		f.idle(func() bool { return c.n > 0 })
	}
	if c.n > 0 {
		f.busy()
	}
	k := 0
	for k < len(wcs) && c.n > 0 {
		wcs[k] = c.buf[c.head]
		// m.qp stays behind until the entry is reused: clearing it would
		// cost the hot path a store for what a closed QP's bytes weigh.
		c.meta[c.head].free()
		c.head++
		if c.head == len(c.buf) {
			c.head = 0
		}
		c.n--
		k++
	}
	return k, nil
}

// ReqNotify arms the CQ: its next completion (with solicitedOnly, its next
// solicited or error completion) signals the CQ's channel once.
func (c *CQ) ReqNotify(solicitedOnly bool) error {
	c.dev.fab.mu.Lock()
	defer c.dev.fab.mu.Unlock()
	if c.closed {
		return fmt.Errorf("arming CQ %d: %w", c.id, ibv.ErrClosed)
	}
	if c.ch == nil {
		return fmt.Errorf("arming CQ %d: no completion channel: %w", c.id, ibv.ErrInvalidArgument)
	}
	c.armed, c.solicitedOnly = true, solicitedOnly
	return nil
}

// Close destroys the CQ. It fails with ErrBusy while a QP completes into it
// (IBTA C11-17).
func (c *CQ) Close() error {
	return c.dev.fab.closeObject(&c.closed, c.rec, func() error {
		if len(c.qps) > 0 {
			return fmt.Errorf("closing CQ %d used by %d QPs: %w", c.id, len(c.qps), ibv.ErrBusy)
		}
		c.buf, c.meta = nil, nil
		c.dev.nCQ--
		if c.ch != nil {
			c.ch.forget(c)
		}
		return nil
	})
}

// push adds a completion. A full CQ overflows instead: it raises CQ_ERR
// once, drops this and every later completion, and moves each QP that
// completes into it to ERROR with QP_FATAL, because their completions can no
// longer be delivered, as an SRQ error does (IBTA Table 58, class A), unless
// Quirks.CQOverrunKeepsQPs. Called with
// fab.mu held.
func (c *CQ) push(wc *ibv.WC, solicited bool, m wcMeta) {
	if c.errored {
		return
	}
	if c.n == len(c.buf) && c.dev.quirks.CQOverrunKeepsQPs {
		c.dev.raise(ibv.AsyncEvent{Type: ibv.EventCQErr, CQ: c})
		return
	}
	if c.n == len(c.buf) {
		c.errored = true
		c.dev.raise(ibv.AsyncEvent{Type: ibv.EventCQErr, CQ: c})
		for _, q := range sortedQPs(c.qps) {
			q.moveToError(ibv.EventQPFatal)
		}
		return
	}
	i := c.head + c.n
	if i >= len(c.buf) {
		i -= len(c.buf)
	}
	c.buf[i] = *wc
	c.meta[i] = m
	c.n++
	if c.dev.trace != nil { // checked here so the hot path builds no entry
		c.dev.emit(TraceEntry{Kind: TraceCompletion, CQ: c.id, QPNum: wc.QPNum, WC: *wc})
	}
	if c.armed && (!c.solicitedOnly || solicited || wc.Status != ibv.WCSuccess) {
		c.armed = false
		c.ch.signal(c)
	}
}

// CompChannel is a completion event channel of a soft device.
type CompChannel struct {
	dev  *Device
	rec  *objtrace.Record
	wake chan struct{} // one token: a CQ event was queued, or Wake called
	done chan struct{} // closed by Close
	// Guarded by dev.fab.mu.
	events ring[*CQ]
	nCQ    int
	closed bool
	woken  bool // Wake called, not yet taken by a WaitCQ
}

var _ ibv.CompChannel = (*CompChannel)(nil)

// CreateCompChannel creates a completion channel.
func (d *Device) CreateCompChannel() (ibv.CompChannel, error) {
	d.fab.mu.Lock()
	defer d.fab.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("creating a completion channel on %s: %w", d.name, ibv.ErrClosed)
	}
	d.nChannel++
	return &CompChannel{
		dev:  d,
		rec:  objtrace.Track("soft completion channel on %s", d.name),
		wake: make(chan struct{}, 1),
		done: make(chan struct{}),
	}, nil
}

// WaitCQ waits until an armed CQ of this channel gets a completion and
// returns that CQ; the event counts as acknowledged. It returns ctx.Err()
// when ctx ends first, ErrWoken when Wake ended it, and ErrClosed once the
// channel is closed.
func (ch *CompChannel) WaitCQ(ctx context.Context) (ibv.CQ, error) {
	mu := &ch.dev.fab.mu
	for {
		mu.Lock()
		if ch.closed {
			mu.Unlock()
			return nil, fmt.Errorf("waiting for a CQ event: %w", ibv.ErrClosed)
		}
		if ch.woken {
			ch.woken = false
			mu.Unlock()
			return nil, ibv.ErrWoken
		}
		if ch.events.len() == 0 {
			// A waiting caller lets deferred work move on.
			ch.dev.fab.idle(func() bool { return ch.events.len() > 0 })
		}
		if ch.events.len() > 0 {
			c := ch.events.pop()
			mu.Unlock()
			return c, nil
		}
		again := ch.dev.fab.idleWait()
		mu.Unlock()
		select {
		case <-ch.wake:
		case <-ch.done:
		case <-after(again):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Wake ends the WaitCQ in progress, or else the next one, with ErrWoken.
func (ch *CompChannel) Wake() {
	mu := &ch.dev.fab.mu
	mu.Lock()
	defer mu.Unlock()
	if !ch.closed {
		ch.woken = true
		ch.wakeUp()
	}
}

// Close destroys the channel. It fails with ErrBusy while a CQ uses it.
func (ch *CompChannel) Close() error {
	return ch.dev.fab.closeObject(&ch.closed, ch.rec, func() error {
		if ch.nCQ > 0 {
			return fmt.Errorf("closing a completion channel used by %d CQs: %w", ch.nCQ, ibv.ErrBusy)
		}
		close(ch.done)
		ch.dev.nChannel--
		return nil
	})
}

// signal queues a CQ event. Called with fab.mu held.
func (ch *CompChannel) signal(c *CQ) {
	ch.events.push(c)
	ch.wakeUp()
}

// wakeUp wakes a caller waiting in WaitCQ.
func (ch *CompChannel) wakeUp() {
	select {
	case ch.wake <- struct{}{}:
	default:
	}
}

// forget drops the pending events of a CQ being closed, so WaitCQ never
// returns a closed CQ. Called with fab.mu held.
func (ch *CompChannel) forget(c *CQ) {
	ch.nCQ--
	for i, n := 0, ch.events.len(); i < n; i++ {
		if e := ch.events.pop(); e != c {
			ch.events.push(e)
		}
	}
}

// discard removes every completion of q still in the CQ, keeping the order
// of the others, as a provider's modify to RESET does (mlx4, mlx5: see the
// package documentation). Called with fab.mu held.
func (c *CQ) discard(q *QP) {
	k := 0
	for i := 0; i < c.n; i++ {
		j := (c.head + i) % len(c.buf)
		if c.meta[j].qp == q {
			c.meta[j].free()
			continue
		}
		d := (c.head + k) % len(c.buf)
		c.buf[d], c.meta[d] = c.buf[j], c.meta[j]
		k++
	}
	c.n = k
}

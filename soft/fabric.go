package soft

import (
	"sync"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/ibv/objtrace"
)

// Fabric connects soft devices in one process. One mutex guards every
// device on the fabric, which keeps the transport deterministic: each verb
// runs to completion, alone, in the order callers reach the lock.
type Fabric struct {
	mu      sync.Mutex
	devices []*Device // index LID-1; closed devices stay, so LIDs are never reused
	manual  bool      // auto-progress off
	// pending holds one entry per send WR posted while auto-progress is
	// off, in post order; Progress executes them.
	pending ring[pendingSend]
	// blocked lists QPs whose head send waits for a receive WQE at the
	// responder (RNR with infinite retry) while auto-progress is on; any
	// receive posted on the fabric retries them.
	blocked []*QP
	// gen changes with every QP state or attribute change, QP close and
	// device close: a QP's cached responder is valid while gen is unchanged.
	gen uint64
	// adv lists the devices with an adversarial schedule; every device
	// call steps them.
	adv []*Device
	// held is a responder completion the adversarial schedule delivers
	// after the requester's (execHead).
	held heldWC
	// clk is the device time of every device on the fabric.
	clk devClock
}

// closeObject is the Close protocol every soft object shares, under f.mu.
// It is idempotent (nil once closed); otherwise destroy either fails,
// changing nothing (ErrBusy while the object is in use), or frees what the
// object holds, and then the object is closed and its leak record released.
func (f *Fabric) closeObject(closed *bool, rec *objtrace.Record, destroy func() error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if *closed {
		return nil
	}
	if err := destroy(); err != nil {
		return err
	}
	*closed = true
	rec.Release()
	return nil
}

// heldWC is a completion written to its CQ later in the same verb.
type heldWC struct {
	cq        *CQ
	wc        ibv.WC
	meta      wcMeta
	solicited bool
}

// lockTick takes f.mu and runs tick, the entry of every verb that posts or
// progresses work, and returns f for the caller's deferred f.mu.Unlock.
func (f *Fabric) lockTick() *Fabric {
	f.mu.Lock()
	f.tick()
	return f
}

// tick runs the deferred work one device call does. Called with f.mu held.
func (f *Fabric) tick() {
	f.tickIdle()
	f.busy()
}

// tickIdle is tick for a call that may turn out idle (a poll).
func (f *Fabric) tickIdle() {
	if len(f.adv) > 0 {
		f.stepFabric()
	}
}

// pushHeld writes the held responder completion, if any.
func (f *Fabric) pushHeld() {
	if f.held.cq != nil {
		f.pushHeldNow()
	}
}

func (f *Fabric) pushHeldNow() {
	h := &f.held
	c := h.cq
	h.cq = nil
	c.push(&h.wc, h.solicited, h.meta)
}

// pendingSend is one queued send WR: the next unexecuted WR of qp, valid
// while qp's epoch is unchanged (a RESET or ERROR drops the QP's queue).
type pendingSend struct {
	qp    *QP
	epoch uint32
}

// NewFabric returns an empty fabric with auto-progress on.
func NewFabric() *Fabric {
	now := time.Now()
	return &Fabric{gen: 1, clk: devClock{epoch: now, base: now}} // gen 1: no QP has a cached responder yet
}

// SetAutoProgress chooses when posted sends execute. On (the default), a
// send executes synchronously inside PostSend, so a test sees its
// completions as soon as PostSend returns. Off, sends stay outstanding
// until Progress executes them, which lets a test hold WRs in flight.
// Turning it on executes everything queued.
func (f *Fabric) SetAutoProgress(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if on == !f.manual {
		return
	}
	if !on {
		f.manual = true
		// Sends waiting (behind an RNR-blocked head, or in SQD) become
		// queued entries, device by device in QP number order.
		for _, q := range f.blocked {
			q.inBlocked = false
		}
		f.blocked = nil
		for _, d := range f.devices {
			for _, q := range d.waitingSenders() {
				for i := 0; i < q.sq.len(); i++ {
					f.pending.push(pendingSend{q, q.epoch})
				}
			}
		}
		return
	}
	f.progress(0)
	f.manual = false
	// What Progress could not execute waits behind an RNR-blocked head.
	for f.pending.len() > 0 {
		e := f.pending.pop()
		if e.qp.epoch == e.epoch {
			e.qp.drive()
		}
	}
}

// Progress executes up to max queued send WRs in post order across the
// fabric (max <= 0: all) and returns how many it executed. A WR whose
// QP cannot send now (SQD, or RNR-blocked waiting for a receive) stays
// queued, and so do the WRs behind it on that QP.
func (f *Fabric) Progress(max int) int {
	f.lockTick()
	defer f.mu.Unlock()
	return f.progress(max)
}

func (f *Fabric) progress(max int) int {
	var kept []pendingSend
	n := 0
	for f.pending.len() > 0 && (max <= 0 || n < max) {
		e := f.pending.pop()
		if e.qp.epoch != e.epoch {
			continue // the QP was reset, flushed or closed since
		}
		switch e.qp.execHead() {
		case execDone:
			n++
		case execWait:
			kept = append(kept, e)
		}
	}
	for i := len(kept) - 1; i >= 0; i-- {
		f.pending.pushFront(kept[i])
	}
	return n
}

// block records that q's head send waits for a receive at its responder.
func (f *Fabric) block(q *QP) {
	if !f.manual && !q.inBlocked {
		q.inBlocked = true
		f.blocked = append(f.blocked, q)
	}
}

// receivesPosted retries RNR-blocked senders after a receive was posted
// anywhere on the fabric (auto-progress only; Progress retries otherwise).
func (f *Fabric) receivesPosted() {
	if f.manual || len(f.blocked) == 0 {
		return
	}
	blocked := f.blocked
	f.blocked = nil
	for _, q := range blocked {
		q.inBlocked = false
		q.drive()
	}
}

// unblock removes q from the blocked list (q was reset, flushed or closed).
func (f *Fabric) unblock(q *QP) {
	if !q.inBlocked {
		return
	}
	q.inBlocked = false
	for i, b := range f.blocked {
		if b == q {
			f.blocked = append(f.blocked[:i], f.blocked[i+1:]...)
			return
		}
	}
}

// route finds the device an address vector points to, by DLID or, for a
// global route, by DGID.
func (f *Fabric) route(ah *ibv.AHAttr) *Device {
	for _, d := range f.devices {
		if d.closed {
			continue
		}
		if ah.IsGlobal && ah.GRH.DGID == d.GID() || !ah.IsGlobal && ah.DLID == d.lid {
			return d
		}
	}
	return nil
}

package soft

import (
	"hash/fnv"
	"math/rand/v2"

	"github.com/qpdrain/qpdrain/ibv"
)

// Schedule chooses how a soft device makes the choices the IBTA
// specification leaves to the implementation. The zero Schedule is
// orderly: every choice is the simplest one, made the same way every time.
// A non-zero Seed makes the device adversarial: every such choice is made
// pseudo-randomly from Seed, so the same seed and the same calls give the
// same trace (see the package documentation, "Adversarial schedules").
type Schedule struct {
	// Seed selects the adversarial schedule; 0 is orderly.
	Seed uint64
}

// Adversarial reports whether the schedule makes the open choices by seed.
func (s Schedule) Adversarial() bool { return s.Seed != 0 }

// Tuning of the adversarial schedule: how much work one device call may
// do, and how long an event may wait. Small numbers keep completions
// trickling over many calls without making tests slow.
const (
	advMaxFlushPerStep = 2  // flush completions generated per device call: 0..this
	advMaxEventDelay   = 6  // device calls an async event waits: 0..this
	advQPNBaseSpread   = 16 // the first QP number is firstQPN + 0..this-1
	advReuseOneIn      = 4  // a free QP number is not reused one time in this many
	advIdleSteps       = 1 << 16
)

// adversary is the state of an adversarial schedule. Guarded by fab.mu.
type adversary struct {
	rng *rand.Rand
	// steps counts the device calls seen; delayed events fall due by it.
	steps uint64
	// flushing lists the QPs with flush completions not yet generated,
	// in the order they entered ERROR; entries whose QP has none left are
	// dropped lazily.
	flushing []*QP
	// delayed holds raised events, oldest first, until their step.
	delayed ring[delayedEvent]
	// freeQPN holds the numbers of destroyed QPs, for reuse.
	freeQPN []uint32
}

// delayedEvent is an async event raised and not yet deliverable.
type delayedEvent struct {
	ev  ibv.AsyncEvent
	due uint64
}

// newAdversary seeds the schedule of device name: devices of one seed
// differ by name, so they make different choices.
func newAdversary(seed uint64, name string) *adversary {
	h := fnv.New64a()
	h.Write([]byte(name))
	return &adversary{rng: rand.New(rand.NewPCG(seed, h.Sum64()))}
}

// coin returns true half of the time.
func (a *adversary) coin() bool { return a.rng.Uint64()&1 == 1 }

// step is one device call's worth of deferred work on d: some flush
// completions, chosen among the work queues that have any, and the events
// whose delay has passed. Called with fab.mu held.
func (d *Device) step() {
	a := d.adv
	a.steps++
	for n := a.rng.IntN(advMaxFlushPerStep + 1); n > 0 && d.flushOne(); n-- {
	}
	d.deliverDue()
}

// flushOne generates one pending flush completion, of a work queue chosen
// at random, and reports whether there was one. Within a work queue the
// completions come in order (IBTA C10-42 orders them per queue only).
func (d *Device) flushOne() bool {
	a := d.adv
	for len(a.flushing) > 0 {
		i := a.rng.IntN(len(a.flushing))
		q := a.flushing[i]
		if q.flushS == 0 && q.flushR == 0 {
			a.flushing = append(a.flushing[:i], a.flushing[i+1:]...)
			continue
		}
		send := q.flushS > 0 && (q.flushR == 0 || a.coin())
		if send {
			q.flushS--
			w := q.sq.pop()
			q.sendCQ.push(&ibv.WC{ID: w.id, Status: ibv.WCWRFlushErr, QPNum: q.num}, false, q.sendDone())
		} else {
			q.flushR--
			r := &q.taken
			if r.len() == 0 {
				r = &q.rq
			}
			w := r.pop()
			q.recvCQ.push(&ibv.WC{ID: w.id, Status: ibv.WCWRFlushErr, QPNum: q.num}, false, q.recvDone(r == &q.rq))
			if q.flushR == 0 {
				q.lastWQEReached()
			}
		}
		return true
	}
	return false
}

// pending reports whether d holds deferred work a later call will do.
func (a *adversary) pending() bool {
	return len(a.flushing) > 0 || a.delayed.len() > 0
}

// eventsComing reports whether an event is delayed or will be raised by
// the flushes still to come (Last WQE Reached).
func (a *adversary) eventsComing() bool {
	if a.delayed.len() > 0 {
		return true
	}
	for _, q := range a.flushing {
		if q.lwrDue && q.flushR > 0 {
			return true
		}
	}
	return false
}

// deliverDue moves the delayed events whose step has come to the
// deliverable queue, keeping their order.
func (d *Device) deliverDue() {
	a := d.adv
	for a.delayed.len() > 0 && a.delayed.at(0).due <= a.steps {
		d.deliver(a.delayed.pop().ev)
	}
}

// scheduleFlush makes q's outstanding WQEs due for flushing: at once in
// orderly mode, over later calls in adversarial mode. send and recv are
// how many WQEs of each side, counted from the head, are due.
func (q *QP) scheduleFlush(send, recv int) {
	a := q.dev.adv
	if q.flushS == 0 && q.flushR == 0 && (send > 0 || recv > 0) {
		a.flushing = append(a.flushing, q)
	}
	q.flushS, q.flushR = send, recv
	q.wakeWaiters()
}

// wakeWaiters wakes the callers waiting on q's device events and on its
// CQs' channels, so that they run the steps that deliver what is now
// deferred: a waiter is a device call too.
func (q *QP) wakeWaiters() {
	q.dev.wakeEvents()
	for _, c := range [2]*CQ{q.sendCQ, q.recvCQ} {
		if c.ch != nil {
			c.ch.wakeUp()
		}
	}
}

// stepFabric runs one step of every adversarial device on the fabric.
// Called with f.mu held, at the start of every device call.
func (f *Fabric) stepFabric() {
	for _, d := range f.adv {
		if !d.closed {
			d.step()
		}
	}
}

// idleSteps runs steps while done is false and some adversarial device on
// the fabric still has deferred work: a caller that found nothing lets the
// device's deferred work move on, as a real device's would while the
// caller waits, instead of spinning or sleeping. Bounded, so that a caller
// never spins forever under the lock.
func (f *Fabric) idleSteps(done func() bool) {
	for i := 0; i < advIdleSteps && !done() && f.advPending(); i++ {
		f.stepFabric()
	}
}

// advPending reports whether an adversarial device on f has deferred work.
func (f *Fabric) advPending() bool {
	for _, d := range f.adv {
		if !d.closed && d.adv.pending() {
			return true
		}
	}
	return false
}

// allocQPN hands out a QP number: in orderly mode the next one; in
// adversarial mode usually one of a destroyed QP, as hardware reuses them.
func (d *Device) allocQPN() uint32 {
	if a := d.adv; a != nil && len(a.freeQPN) > 0 && a.rng.IntN(advReuseOneIn) != 0 {
		i := a.rng.IntN(len(a.freeQPN))
		n := a.freeQPN[i]
		a.freeQPN = append(a.freeQPN[:i], a.freeQPN[i+1:]...)
		return n
	}
	n := d.nextQPN
	d.nextQPN++
	return n
}

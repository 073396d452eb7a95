package ipoibcm

import (
	"fmt"
	"time"

	"github.com/qpdrain/qpdrain/drain"
)

// The Bounded policy hands each closed connection's QP to a drain.Reaper.
// The reaper's own timeouts are set to pass at once; the Manager consults
// it (a poll of the CQ that found it empty, drain.Reaper.CQEmpty, which
// applies the reaper's deadlines) only when a wait has run out on the
// Manager's Clock. So the waits are the Manager's timers, simulated time
// runs them without sleeping, and a drain WR's completion, which the
// reaper handles before it looks at deadlines, is never mistaken for a
// stall. The Manager does not hand the reaper the other completions (only
// the reports' per-queue flush counts would use them) because each hand-over
// would apply the deadlines early.

// hand gives c's QP to the reaper (lastWQE: its Last WQE Reached was seen).
func (m *Manager) hand(c *Conn, lastWQE bool, now time.Time) {
	h, err := m.reaper.Add(c.qp, drain.AddOptions{LastWQESeen: lastWQE})
	if err != nil {
		// Only a QP the reaper cannot take at all: it is not on the
		// reaper's CQ, or the reaper ended. Keep it, counted.
		m.warn("handing qp %#x to the reaper: %v", c.qpn, err)
		c.state = StateError
		m.move(c, ListQuarantine, false)
		m.stats.Quarantined++
		m.emit(c, EventQuarantined, now)
		return
	}
	c.handle = h
	c.deadline = time.Time{}
	m.move(c, ListDrain, false)
	m.emit(c, EventDrainPosted, now)
	if !lastWQE && m.drainDue.IsZero() {
		// Its wait for Last WQE Reached is over already; with no drain WR
		// outstanding nothing else would make the reaper look.
		m.consultSoon = true
	}
	m.afterReaper(now)
}

// afterReaper notes a drain WR the reaper posted, whose deadline starts now,
// and moves every connection whose drain has an outcome.
func (m *Manager) afterReaper(now time.Time) {
	if n := m.reaper.Stats().DrainWRs; n > m.drainWRsSeen {
		m.drainWRsSeen = n
		m.drainDue = now.Add(m.cfg.Drain.DrainTimeout)
	}
	pending := false
	for c := m.lists[ListDrain].head; c != nil; {
		next := c.next
		select {
		case <-c.handle.Done():
			rep := c.handle.Report()
			switch {
			case rep.Outcome.SafeToDestroy():
				m.move(c, ListReap, false)
				m.emit(c, EventDrained, now)
			default:
				// Quarantined, or refused by a full quarantine: either way
				// not proven, so kept.
				m.move(c, ListQuarantine, false)
				m.emit(c, EventQuarantined, now)
			}
		default:
			pending = true
		}
		c = next
	}
	m.consultSoon = pending && m.drainDue.IsZero()
}

// bounded runs the Bounded policy's timers that are due.
func (m *Manager) bounded(now time.Time) error {
	for c := m.lists[ListError].head; c != nil; {
		next := c.next
		if !c.deadline.IsZero() && !now.Before(c.deadline) {
			m.hand(c, false, now)
		}
		c = next
	}
	if m.consultSoon || (!m.drainDue.IsZero() && !now.Before(m.drainDue)) {
		return m.consult(now)
	}
	return nil
}

// consult polls the CQ empty and tells the reaper so: every wait of the
// reaper that has run out (all of them, by its own timeouts) takes the
// policy, and stalled QPs waiting for an empty CQ are released.
func (m *Manager) consult(now time.Time) error {
	if err := m.pollAll(now); err != nil {
		return fmt.Errorf("polling before consulting the reaper: %w", err)
	}
	m.drainDue = time.Time{}
	m.consultSoon = false
	m.reaper.CQEmpty()
	m.afterReaper(now)
	return nil
}

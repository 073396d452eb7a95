package ipoibcm

import (
	"context"
	"fmt"
	"time"

	"github.com/qpdrain/qpdrain/drain"
)

// The Bounded policy hands each closed connection's QP to a drain.Reaper,
// stating what IPoIB-CM's receive QPs are: they post no sends
// (AddOptions.NoSends), so one barrier drain WR per batch proves their SRQ
// side once Last WQE Reached has been seen.
//
// On the real clock the reaper keeps its own timeouts and policy
// (Config.Drain) and each Service, whose polls end with an empty one, tells
// it so (drain.Reaper.CQEmpty).
//
// The reaper's deadlines run on time.Now, so on any other clock the
// Manager keeps them: the reaper gets waits that never end, and when the
// oldest QP it holds has waited DrainTimeout on the Clock, the Manager
// polls the CQ empty (handing it every drain WR's completion), ends the
// reaper's round (drain.Reaper.Shutdown, which hands back every QP without
// a proof) and starts a new reaper. A QP handed back was not proven
// finished; the CQ was just found empty and an RX QP posts no sends, so,
// as drain.DestroyWhenEmpty would and ipoib_cm_dev_stop does, it is
// destroyed. Every QP pending at such a time is given up, however long it
// waited: on a device that completes a drain WR once it is posted, as the
// orderly soft device does, a drain still pending then never completes.
// The Manager hands the reaper no completion but its drain WRs': only the
// reports' per-queue flush counts would use the others.

// boundedHeadroom is the drain WRs the Bounded policy may have outstanding
// on the CQ, which reserves that many spare slots (Config.cqe), and on one
// QP, whose send queue has that many slots (Accept) because the reaper may
// post several barriers on the oldest QP waiting for one: a QP that closes
// while another's drain WR is outstanding gets a barrier at once instead
// of waiting, and a provider that never completes them holds at most this
// many slots until the stalled QPs are given up.
const boundedHeadroom = 16

// never is the reaper's wait when the Manager keeps the deadlines.
const never = 100 * 365 * 24 * time.Hour

// virtualTime says the Manager, not the reaper, times the Bounded waits.
func (m *Manager) virtualTime() bool {
	_, real := m.clock.(RealClock)
	return !real
}

// reaperOptions turns Config.Drain into the reaper's options.
func (m *Manager) reaperOptions() drain.Options {
	opts := m.cfg.Drain
	opts.Policy = drain.DestroyWhenEmpty
	if m.cfg.QuarantinePolicy {
		opts.Policy = drain.Quarantine
	}
	if opts.Headroom == 0 {
		opts.Headroom = boundedHeadroom
	}
	if m.virtualTime() {
		opts.LastWQETimeout, opts.DrainTimeout = never, never
	}
	opts.Channel, opts.Events, opts.OnWC, opts.OnEvent = nil, nil, nil, nil
	return opts
}

// hand gives c's QP to the reaper (lastWQE: its Last WQE Reached was seen).
func (m *Manager) hand(c *Conn, lastWQE bool, now time.Time) {
	h, err := m.reaper.Add(c.qp, drain.AddOptions{LastWQESeen: lastWQE, NoSends: true})
	if err != nil {
		// Only a QP the reaper cannot take at all: it is not on the
		// reaper's CQ, or the reaper ended. Keep it, counted.
		m.warn("handing qpn %d to the reaper: %v", c.qpn, err)
		c.state = StateError
		m.move(c, ListQuarantine, false)
		m.stats.Quarantined++
		m.emit(c, EventQuarantined, now)
		return
	}
	c.handle = h
	c.deadline = now.Add(m.cfg.Drain.DrainTimeout)
	m.move(c, ListDrain, false)
	m.emit(c, EventDrainPosted, now)
	m.afterReaper(now)
}

// afterReaper moves every connection whose drain has an outcome: to
// rx_reap_list when the reaper says it may be destroyed, to the quarantine
// otherwise (quarantined, or refused by a full quarantine: either way not
// proven, so kept).
func (m *Manager) afterReaper(now time.Time) {
	for c := m.lists[ListDrain].head; c != nil; {
		next := c.next
		select {
		case <-c.handle.Done():
			if c.handle.Report().Outcome.SafeToDestroy() {
				m.move(c, ListReap, false)
				m.emit(c, EventDrained, now)
			} else {
				m.move(c, ListQuarantine, false)
				m.emit(c, EventQuarantined, now)
			}
		default:
		}
		c = next
	}
}

// bounded runs the Bounded policy's timers that are due.
func (m *Manager) bounded(now time.Time) error {
	// Entries join rx_error_list at the head: the tail waits longest.
	for c := m.lists[ListError].tail; c != nil && !c.deadline.IsZero() && !now.Before(c.deadline); c = m.lists[ListError].tail {
		m.hand(c, false, now)
	}
	if !m.virtualTime() {
		// pollAll just found the CQ empty.
		m.reaper.CQEmpty()
		m.afterReaper(now)
		return nil
	}
	if c := m.lists[ListDrain].head; c != nil && !now.Before(c.deadline) {
		return m.endRound(now)
	}
	return nil
}

// endRound gives up every QP the reaper still holds, on a virtual clock:
// the CQ is polled empty first, so every drain WR that completed counts.
func (m *Manager) endRound(now time.Time) error {
	if _, err := m.pollAll(now); err != nil {
		return fmt.Errorf("polling before ending the reaper's round: %w", err)
	}
	m.afterReaper(now)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	m.reaper.Shutdown(ended)
	m.stats.Rounds++
	m.stats.DrainWRs += m.reaper.Stats().DrainWRs
	m.reaper = drain.NewReaper(m.cq, m.reaperOptions())
	for c := m.lists[ListDrain].head; c != nil; c = m.lists[ListDrain].head {
		m.stats.GivenUp++
		m.move(c, ListReap, false)
		m.emit(c, EventGivenUp, now)
	}
	return nil
}

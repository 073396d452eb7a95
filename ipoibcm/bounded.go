package ipoibcm

import (
	"time"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/drain/report"
)

// The Bounded policy hands each closed connection's QP to a drain.Reaper,
// stating what IPoIB-CM's receive QPs are: they post no sends
// (AddOptions.NoSends), so one barrier drain WR per batch proves their SRQ
// side once Last WQE Reached has been seen.
//
// The reaper runs on the Manager's Clock (drain.Options.Clock) and keeps
// its own timeouts and policy (Config.Drain) on any clock: each Service,
// whose polls end with an empty one, tells it so (drain.Reaper.CQEmpty),
// which also runs its deadlines, and NextDeadline includes the reaper's.
// A stalled QP under drain.DestroyWhenEmpty (the default here) is given up
// once a poll begun after the stall found the CQ empty: not proven
// finished, but an RX QP posts no sends, so it is destroyed, as
// ipoib_cm_dev_stop does (EventGivenUp). One reaper serves the Manager's
// whole life, so a kept QP's late drain WR completion can only meet the
// reaper that posted it. The Manager hands the reaper no completion but
// its drain WRs': only the reports' per-queue flush counts would use the
// others.

// boundedHeadroom is the drain WRs the Bounded policy may have outstanding
// on the CQ, which reserves that many spare slots (Config.cqe): a QP that
// closes while another's drain WR is outstanding gets a barrier at once
// instead of waiting, and a provider that never completes them holds at
// most this many slots until the stalled QPs are given up. Accept gives
// each RX QP as many send slots, though the reaper puts at most one
// barrier on a QP at a time.
const boundedHeadroom = 16

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
	opts.Clock = m.clock
	return opts
}

// hand gives c's QP to the reaper (lastWQE: its Last WQE Reached was seen).
func (m *Manager) hand(c *Conn, lastWQE bool, now time.Time) {
	h, err := m.reaper.Add(c.qp, drain.AddOptions{LastWQESeen: lastWQE, NoSends: true})
	if err != nil {
		// Only a QP the reaper cannot take at all: it is not on the
		// reaper's CQ, or the reaper ended. Keep it, counted.
		m.warn(c, "could not hand the QP to the reaper", err)
		c.state = StateError
		m.move(c, ListQuarantine, false)
		m.stats.Quarantined++
		m.emit(c, EventQuarantined, now)
		return
	}
	c.handle, c.deadline = h, time.Time{}
	m.move(c, ListDrain, false)
	m.emit(c, EventDrainPosted, now)
	m.afterReaper(now)
}

// afterReaper moves every connection whose drain has an outcome: to
// rx_reap_list when the reaper says it may be destroyed, to the quarantine
// otherwise (quarantined, or refused by a full quarantine: either way not
// proven, so kept).
func (m *Manager) afterReaper(now time.Time) {
	for c := m.lists[ListDrain].Front(); c != nil; {
		next := c.links.Next()
		select {
		case <-c.handle.Done():
			switch o := c.handle.Report().Outcome; {
			case o == report.DestroyedAfterEmptyCQ:
				m.stats.GivenUp++
				m.move(c, ListReap, false)
				m.emit(c, EventGivenUp, now)
			case o.SafeToDestroy():
				m.move(c, ListReap, false)
				m.emit(c, EventDrained, now)
			default:
				m.move(c, ListQuarantine, false)
				m.emit(c, EventQuarantined, now)
			}
		default:
		}
		c = next
	}
}

// bounded runs the Bounded policy's timers that are due.
func (m *Manager) bounded(now time.Time) {
	// Entries join rx_error_list at the head: the tail waits longest.
	for c := m.lists[ListError].Back(); c != nil && !c.deadline.IsZero() && !now.Before(c.deadline); c = m.lists[ListError].Back() {
		m.hand(c, false, now)
	}
	// pollAll just found the CQ empty.
	m.reaper.CQEmpty()
	m.afterReaper(now)
}

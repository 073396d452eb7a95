package ipoibcm

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// stopPoll is how often Stop polls while it waits (usleep_range(1000, 2000)).
const stopPoll = time.Millisecond

// StopReport says how a Stop went.
type StopReport struct {
	// Waited is how long Stop waited for the drains, on the Clock.
	Waited time.Duration
	// TimedOut says the wait ran out ("RX drain timing out") and Forced
	// QPs were destroyed without proof that they were finished.
	TimedOut bool
	Forced   int
	// Reaped is the QPs destroyed after a proof during the wait.
	Reaped int
}

// Stop is ipoib_cm_dev_stop: it stops accepting connections, moves every
// live connection to rx_error_list with its QP to ERROR, then services the
// CQ every millisecond of Clock until the error, flush and drain lists are
// empty or StopTimeout has passed; after that it assumes the hardware is
// wedged and destroys everything left, quarantined QPs included. Last it
// destroys the CQ, the SRQ and the receive ring. ctx bounds the whole call
// in real time; when it ends first, the rest is destroyed as on a timeout
// and the error wraps ctx's.
func (m *Manager) Stop(ctx context.Context) (StopReport, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return StopReport{}, fmt.Errorf("stopping: %w", ErrStopped)
	}
	// From here on Accept and Service refuse; the loop below services
	// itself.
	m.stopped = true
	begin := m.clock.Now()
	reapedBefore := m.stats.Reaped
	for c := m.lists[ListPassive].Front(); c != nil; c = m.lists[ListPassive].Front() {
		m.toErrorList(c, StateError, begin)
		m.toError(c, begin)
		m.emit(c, EventStop, begin)
	}
	m.staleAt = time.Time{}
	var rep StopReport
	var errs []error
	for m.lists[ListError].Len()+m.lists[ListFlush].Len()+m.lists[ListDrain].Len() > 0 {
		now := m.clock.Now()
		if now.Sub(begin) > m.cfg.StopTimeout {
			m.warn(nil, "RX drain timing out", nil)
			rep.TimedOut = true
			break
		}
		m.mu.Unlock()
		err := m.clock.Sleep(ctx, stopPoll)
		m.mu.Lock()
		if err != nil {
			rep.TimedOut = true
			errs = append(errs, fmt.Errorf("waiting for the RX drains: %w", err))
			break
		}
		if err := m.service(); err != nil {
			errs = append(errs, err)
			break
		}
	}
	now := m.clock.Now()
	rep.Waited = now.Sub(begin)
	m.reap(now)
	rep.Reaped = m.stats.Reaped - reapedBefore
	if m.reaper != nil {
		// Ends what the reaper still waits on; nothing is pending after
		// the loop above unless it gave up.
		ended, cancel := context.WithCancel(ctx)
		cancel()
		m.reaper.Shutdown(ended)
	}
	for _, l := range []ListID{ListPassive, ListError, ListFlush, ListDrain, ListQuarantine} {
		for c := m.lists[l].Front(); c != nil; c = m.lists[l].Front() {
			m.emit(c, EventForced, now)
			m.destroy(c, now)
			m.stats.Reaped--
			m.stats.Forced++
			rep.Forced++
		}
	}
	if err := m.objs.Close(); err != nil {
		errs = append(errs, fmt.Errorf("closing the receive CQ, SRQ and ring: %w", err))
	}
	if err := m.freeBuf(); err != nil {
		errs = append(errs, err)
	}
	return rep, errors.Join(errs...)
}

package ipoibcm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/ibv"
)

// done is an ended context: NextAsyncEvent with it returns a queued event
// or nothing, without blocking.
var done = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// Service does what the kernel's interrupt handlers and work items would
// have done by now: it runs the stale task when Clock says it is due,
// takes the device's queued async events, polls the shared CQ empty
// (activity, reposts, flushes, drain WRs), runs the Bounded policy's due
// waits, and destroys the QPs on rx_reap_list. Call it after anything that may have
// produced completions or events, and at NextDeadline.
func (m *Manager) Service() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return fmt.Errorf("servicing: %w", ErrStopped)
	}
	return m.service()
}

func (m *Manager) service() error {
	now := m.clock.Now()
	// The stale task first: the flushes and events its moves to ERROR
	// cause are then taken by this call.
	if !m.staleAt.IsZero() && !now.Before(m.staleAt) {
		m.staleTask(now)
	}
	// What one pass handles can make more (a drain WR posted on Last WQE
	// Reached completes, a device delivers a deferred flush on the next
	// call): repeat until a pass finds nothing.
	for range maxPasses {
		evs, err := m.events(now)
		if err != nil {
			return err
		}
		wcs, err := m.pollAll(now)
		if err != nil {
			return err
		}
		if evs+wcs == 0 {
			break
		}
	}
	if m.reaper != nil {
		m.bounded(now)
	}
	m.reap(now)
	return nil
}

// maxPasses bounds Service's passes over events and completions.
const maxPasses = 64

// events takes every queued async event of the device and returns how
// many there were.
func (m *Manager) events(now time.Time) (int, error) {
	for n := 0; ; n++ {
		ev, err := m.cfg.Context.NextAsyncEvent(done)
		switch {
		case errors.Is(err, context.Canceled):
			return n, nil
		case err != nil:
			return n, fmt.Errorf("reading async events: %w", err)
		}
		if !m.handleEvent(ev, now) && m.cfg.OnEvent != nil {
			m.cfg.OnEvent(ev)
		}
	}
}

// handleEvent is ipoib_cm_rx_event_handler: only Last WQE Reached of a QP
// of this Manager matters.
func (m *Manager) handleEvent(ev ibv.AsyncEvent, now time.Time) bool {
	if ev.QP == nil {
		return false
	}
	c := m.conns[ev.QP.Num()]
	if c == nil || c.qp != ev.QP {
		return false
	}
	if ev.Type != ibv.EventQPLastWQEReached {
		return true
	}
	if m.reaper == nil {
		// list_move from wherever it is, even if it was there already.
		c.lastWQE = true
		c.state = StateFlush
		m.move(c, ListFlush, true)
		m.emit(c, EventLastWQE, now)
		m.startRxDrain(now)
		return true
	}
	if c.lastWQE || c.handle != nil {
		return true // repeated: the reaper already has it
	}
	c.lastWQE = true
	c.state = StateFlush
	m.emit(c, EventLastWQE, now)
	m.hand(c, true, now)
	return true
}

// startRxDrain is ipoib_cm_start_rx_drain: at most one drain WR
// outstanding, because the CQ has one spare slot; it goes on the first QP
// of the flush list, and the whole flush list moves to the drain list.
func (m *Manager) startRxDrain(now time.Time) {
	if m.lists[ListFlush].Len() == 0 || m.lists[ListDrain].Len() != 0 {
		return
	}
	first := m.lists[ListFlush].Front()
	if err := first.qp.PostSend([]ibv.SendWR{{ID: KernelDrainWRID, Opcode: ibv.WRSend, Flags: ibv.SendSignaled}}); err != nil {
		m.stats.DrainPostFailed++
		m.warn(first, "failed to post drain wr", err)
	} else {
		m.stats.DrainWRs++
	}
	// list_splice_init keeps the order; the drain list was empty.
	for c := m.lists[ListFlush].Front(); c != nil; c = m.lists[ListFlush].Front() {
		m.move(c, ListDrain, false)
		m.emit(c, EventDrainPosted, now)
	}
}

// pollAll polls the CQ until it is empty and returns how many completions
// it took.
func (m *Manager) pollAll(now time.Time) (int, error) {
	total := 0
	for {
		n, err := m.cq.Poll(m.wcs)
		if err != nil {
			return total, fmt.Errorf("polling the receive CQ: %w", err)
		}
		total += n
		for _, wc := range m.wcs[:n] {
			if err := m.handleWC(wc, now); err != nil {
				return total, err
			}
		}
		if n == 0 {
			return total, nil
		}
	}
}

// handleWC is ipoib_cm_handle_rx_wc.
func (m *Manager) handleWC(wc ibv.WC, now time.Time) error {
	if wc.ID == KernelDrainWRID && m.reaper == nil {
		for c := m.lists[ListDrain].Front(); c != nil; c = m.lists[ListDrain].Front() {
			m.move(c, ListReap, false)
			m.emit(c, EventDrained, now)
		}
		m.startRxDrain(now)
		return nil
	}
	if drain.IsDrainWRID(wc.ID) && m.reaper != nil {
		m.reaper.HandleWC(wc)
		m.afterReaper(now)
		return nil
	}
	c := m.conns[wc.QPNum]
	if c == nil {
		if _, gone := m.dead[wc.QPNum]; gone {
			m.stats.LateWCs++
		}
		return nil
	}
	if wc.ID&recvTag == 0 {
		return nil
	}
	slot := int(wc.ID &^ recvTag)
	if wc.Status != ibv.WCSuccess {
		if m.srq != nil {
			return m.repost(c, slot)
		}
		if c.recvCount--; c.recvCount == 0 {
			m.move(c, ListReap, false)
			m.emit(c, EventFlushed, now)
		}
		return nil
	}
	m.stats.Receives++
	if uint64(slot)&UpdateMask == 0 && !now.Before(c.stamp.Add(m.cfg.UpdateTime)) {
		c.stamp = now
		if c.state == StateLive && c.list == ListPassive {
			m.move(c, ListPassive, true)
		}
	}
	return m.repost(c, slot)
}

// repost gives slot back to the SRQ, or to c's own receive queue.
func (m *Manager) repost(c *Conn, slot int) error {
	wr := []ibv.RecvWR{m.recvWR(slot)}
	if m.srq != nil {
		if err := m.srq.PostRecv(wr); err != nil {
			return fmt.Errorf("reposting SRQ receive %d: %w", slot, err)
		}
		return nil
	}
	if err := c.qp.PostRecv(wr); err != nil {
		// As ipoib_cm_handle_rx_wc: the count drops, nothing else. Should
		// it reach 0 this way, no flush will ever reap the QP.
		c.recvCount--
		m.warn(c, "ipoib_cm_post_receive_nonsrq failed", err, slog.Int("buf", slot))
	}
	return nil
}

// staleTask is ipoib_cm_stale_task: from the LRU tail of passive_ids,
// every connection idle longer than Timeout goes to rx_error_list with its
// QP to ERROR; the task runs again after Delay while passive_ids is not
// empty.
func (m *Manager) staleTask(now time.Time) {
	m.staleAt = time.Time{}
	for c := m.lists[ListPassive].Back(); c != nil; c = m.lists[ListPassive].Back() {
		if !now.After(c.stamp.Add(m.cfg.Timeout)) {
			break
		}
		m.toErrorList(c, StateError, now)
		m.toError(c, now)
		m.stats.Stale++
		m.emit(c, EventStale, now)
	}
	if m.lists[ListPassive].Len() > 0 {
		m.staleAt = now.Add(m.cfg.Delay)
	}
}

// reap is ipoib_cm_free_rx_reap_list: destroy every QP on rx_reap_list.
func (m *Manager) reap(now time.Time) {
	for c := m.lists[ListReap].Front(); c != nil; c = m.lists[ListReap].Front() {
		m.destroy(c, now)
	}
}

func (m *Manager) destroy(c *Conn, now time.Time) {
	m.move(c, ListNone, false)
	// A QP the reaper took goes through its handle, which keeps its drain
	// WRs' headroom until a poll after the destroy.
	destroy := c.qp.Close
	if c.handle != nil {
		destroy = c.handle.Destroy
	}
	if err := destroy(); err != nil {
		m.warn(c, "could not destroy the QP", err)
	}
	delete(m.conns, c.qpn)
	m.remember(c.qpn)
	if c.nonSRQSlot {
		m.nonSRQ--
	}
	m.stats.Reaped++
	m.emit(c, EventReaped, now)
}

// NextDeadline is the earliest time Service has a timer to run: the stale
// task, or a wait of the Bounded policy. Zero when no timer is pending.
func (m *Manager) NextDeadline() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	var d time.Time
	earlier := func(t time.Time) {
		if !t.IsZero() && (d.IsZero() || t.Before(d)) {
			d = t
		}
	}
	earlier(m.staleAt)
	if m.reaper != nil {
		earlier(m.reaper.NextDeadline())
	}
	if c := m.lists[ListError].Back(); c != nil && m.reaper != nil {
		// Entries join at the head, so the tail waits longest.
		earlier(c.deadline)
	}
	return d
}

// Stats returns the Manager's counters.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.stats
	if m.reaper != nil {
		rs := m.reaper.Stats()
		s.DrainWRs += rs.DrainWRs
		s.Quarantined += rs.Quarantined
	}
	return s
}

// Snapshot is what the Manager's lists hold at one time, QP numbers in
// list order (passive_ids most recently active first).
type Snapshot struct {
	At    time.Time
	Lists [NumLists][]uint32
	// QPs is every QP the Manager holds, on any list.
	QPs int
	// NonSRQConns is nonsrq_conn_qp.
	NonSRQConns int
}

// Count is how many connections list l holds.
func (s *Snapshot) Count(l ListID) int {
	if l >= NumLists {
		return 0
	}
	return len(s.Lists[l])
}

// Snapshot copies the lists.
func (m *Manager) Snapshot() Snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := Snapshot{At: m.clock.Now(), QPs: len(m.conns), NonSRQConns: m.nonSRQ}
	for l := ListPassive; l < NumLists; l++ {
		ids := make([]uint32, 0, m.lists[l].Len())
		for c := m.lists[l].Front(); c != nil; c = c.links.Next() {
			ids = append(ids, c.qpn)
		}
		s.Lists[l] = ids
	}
	return s
}

// Counts returns how many connections each list holds, indexed by ListID,
// without copying the lists.
func (m *Manager) Counts() [NumLists]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n [NumLists]int
	for l := range n {
		n[l] = m.lists[l].Len()
	}
	return n
}

// QPs is how many QPs the Manager holds, on any list.
func (m *Manager) QPs() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.conns)
}

// deadMax is how many destroyed QP numbers the Manager remembers.
const deadMax = 4096

// remember records a destroyed QP's number, forgetting the oldest past
// deadMax so that a long-lived Manager stays bounded.
func (m *Manager) remember(qpn uint32) {
	if len(m.deadRing) < deadMax {
		m.deadRing = append(m.deadRing, qpn)
	} else {
		delete(m.dead, m.deadRing[m.deadNext])
		m.deadRing[m.deadNext] = qpn
		m.deadNext = (m.deadNext + 1) % deadMax
	}
	m.dead[qpn] = struct{}{}
}

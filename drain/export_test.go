package drain

import (
	"fmt"
	"time"
)

// SetSpin sets the budget of Run's spin before it sleeps on a completion
// channel: d, or no spin for a negative d. Call it before Run.
func (r *Reaper) SetSpin(d time.Duration) {
	r.mu.Lock()
	r.spinFor = d
	r.mu.Unlock()
}

// CheckInFlight checks the invariant the Reaper's lost field states: every
// drain WR counted against the headroom is the sendID or recvID of the
// handle byNum names for its QP, or in lost, and no ID is kept twice. A
// drain WR whose ID was overwritten while outstanding breaks it: its
// completion is never matched, and its slot is never returned.
func (r *Reaper) CheckInFlight() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make(map[uint64]bool, len(r.lost))
	for id := range r.lost {
		ids[id] = true
	}
	for _, h := range r.byNum.all() {
		for _, id := range [...]uint64{h.sendID, h.recvID} {
			if id == 0 {
				continue
			}
			if ids[id] {
				return fmt.Errorf("drain WR %#x of qpn %d is kept twice", id, h.qpn)
			}
			ids[id] = true
		}
	}
	if len(ids) != r.inFlight {
		return fmt.Errorf("%d drain WRs counted against the headroom, %d known by their IDs", r.inFlight, len(ids))
	}
	return nil
}

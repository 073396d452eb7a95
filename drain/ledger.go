package drain

import (
	"sync"

	"github.com/qpdrain/qpdrain/ibv"
)

// ledger holds, per CQ, the drain WRs that reapers shut down while they
// still counted them (Shutdown), until the next reaper made on that CQ
// adopts them (NewReaper): they may still complete into the CQ, and only
// a reaper the CQ is polled for can tell when they no longer can. A
// reaper knows its predecessor by nothing but the CQ value, so there is
// one ledger for the process. Lock order: a reaper's mu, then ledger.mu.
var ledger struct {
	mu  sync.Mutex
	cqs map[ibv.CQ]map[uint64]leftWR // an entry goes when its map is empty
}

// leftWR is a drain WR a reaper left at Shutdown, posted on the QP
// numbered qpn.
type leftWR struct {
	qpn uint32
	// owner is the reaper that adopted it and counts it in its lost; nil
	// until one does.
	owner *Reaper
	// destroyed: its QP was destroyed through its handle while no reaper
	// owned it.
	destroyed bool
}

// leave hands the drain WRs r still counts, all in lost once Shutdown
// has let go of every QP, to the ledger, and stops counting them.
func (r *Reaper) leave() {
	if len(r.lost) == 0 {
		return
	}
	destroyed := make(map[uint64]bool, len(r.orphans))
	for _, o := range r.orphans {
		destroyed[o.id] = true
	}
	ledger.mu.Lock()
	defer ledger.mu.Unlock()
	if ledger.cqs == nil {
		ledger.cqs = make(map[ibv.CQ]map[uint64]leftWR)
	}
	wrs := ledger.cqs[r.cq]
	if wrs == nil {
		wrs = make(map[uint64]leftWR, len(r.lost))
		ledger.cqs[r.cq] = wrs
	}
	for id, qpn := range r.lost {
		wrs[id] = leftWR{qpn: qpn, destroyed: destroyed[id]}
	}
	r.inFlight -= len(r.lost)
	clear(r.lost)
	r.orphans, r.adopted = nil, 0
}

// adopt counts, as r's lost drain WRs, those the reapers shut down on r's
// CQ left that no reaper has adopted. Those whose QP was destroyed are
// freed by a poll begun after r was made (a destroy came before) that
// finds the CQ empty; the others stay in the ledger, where Handle.Destroy
// finds r.
func (r *Reaper) adopt() {
	if !r.cqOK {
		return // Add takes no QP on such a CQ: it left nothing
	}
	ledger.mu.Lock()
	defer ledger.mu.Unlock()
	wrs := ledger.cqs[r.cq]
	for id, e := range wrs {
		if e.owner != nil {
			continue
		}
		r.loseWR(id, e.qpn)
		r.inFlight++
		if e.destroyed {
			r.orphans = append(r.orphans, orphan{id: id, at: 0})
			removeLeft(r.cq, wrs, id)
			continue
		}
		e.owner = r
		wrs[id] = e
		r.adopted++
	}
	r.stats.MaxInFlight = r.inFlight
}

// destroyedLeft records that the QP of the drain WR id, which a reaper
// left on cq at Shutdown, has just been destroyed through its handle: in
// the reaper that adopted it, as Handle.Destroy does in its own
// (destroyed), or in the ledger for the reaper that will.
func destroyedLeft(cq ibv.CQ, id uint64) {
	for {
		ledger.mu.Lock()
		e, ok := ledger.cqs[cq][id]
		if !ok || e.owner == nil {
			if ok {
				e.destroyed = true
				ledger.cqs[cq][id] = e
			}
			ledger.mu.Unlock()
			return
		}
		owner := e.owner
		ledger.mu.Unlock()
		// The owner's lock first; it may have shut down meanwhile and left
		// the WR to the ledger again, or to another reaper.
		owner.mu.Lock()
		ledger.mu.Lock()
		wrs := ledger.cqs[cq]
		e, ok = wrs[id]
		mine := ok && e.owner == owner
		if mine {
			removeLeft(cq, wrs, id)
			owner.adopted--
			owner.orphans = append(owner.orphans, orphan{id: id, at: owner.at(owner.opts.Clock.Now())})
		}
		ledger.mu.Unlock()
		owner.mu.Unlock()
		if !ok || mine {
			return
		}
	}
}

// dropLeft takes the drain WR id, posted on the QP numbered qpn, off the
// ledger of r's CQ if owner holds it there (nil: no reaper does yet). It
// reports whether it did.
func (r *Reaper) dropLeft(id uint64, qpn uint32, owner *Reaper) bool {
	ledger.mu.Lock()
	defer ledger.mu.Unlock()
	wrs := ledger.cqs[r.cq]
	if e, ok := wrs[id]; !ok || e.owner != owner || e.qpn != qpn {
		return false
	}
	removeLeft(r.cq, wrs, id)
	return true
}

// removeLeft deletes id from wrs, cq's drain WRs in the ledger, and cq
// from the ledger once it has none; ledger.mu must be held.
func removeLeft(cq ibv.CQ, wrs map[uint64]leftWR, id uint64) {
	delete(wrs, id)
	if len(wrs) == 0 {
		delete(ledger.cqs, cq)
	}
}

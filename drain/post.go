package drain

import (
	"errors"
	"fmt"
	"time"

	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/ibv"
)

func (r *Reaper) nextID() uint64 {
	r.seq = drainSeq.Add(1)
	return WRIDTag | r.seq&^WRIDMask
}

// track counts a posted drain WR against the headroom; the caller keeps
// its ID in the handle.
func (r *Reaper) track(id uint64) {
	r.inFlight++
	r.newest = id &^ WRIDMask
	r.stats.MaxInFlight = max(r.stats.MaxInFlight, r.inFlight)
}

// post posts the drain WRs the flush list waits for, oldest QP first, as
// far as the headroom allows, then a barrier for the SRQ sides waiting on
// one if no drain WR posted after them is outstanding. It posts under r.mu
// so that a WR's completion, which a synchronous provider may produce
// inside the post, cannot be handed to HandleWC before the reaper knows
// the WR.
//
// A barrier goes on a QP of the barrier list that carries no drain WR: its
// send queue has the one slot the caller reserved for the reaper, and its
// handle keeps one send drain WR, whose ID is how the completion is
// matched. The carrier is one of the first Options.MaxBatch QPs, so that
// the barrier's completion releases it with those before it. With none
// free, the barrier waits for a completion to free one. A carrier whose
// send queue is found full waits for the next poll, as a QP's own drain
// WR does (posted): within the slot reserved, that is a provider
// returning it late; another QP may carry the barrier meanwhile.
func (r *Reaper) post(now time.Time) {
	if !r.postFlush(now) {
		return
	}
	l := &r.lists[stageBarrier]
	t := l.Back()
	if t == nil || r.newest > t.barrierAfter {
		return
	}
	for c, i := l.Front(), 0; c != nil && r.inFlight < r.opts.Headroom && (r.opts.MaxBatch == 0 || i < r.opts.MaxBatch); i++ {
		next := c.links.Next()
		if c.sendID == 0 && !c.waitsPoll(r.pollGen) {
			id := r.nextID()
			if r.posted(c, id, c.qp.PostSend(r.drainSend(id)), "barrier drain WR", now) {
				c.sendID = id
				r.track(id)
				r.stats.DrainWRs++
				c.step(now, &report.Step{Kind: report.StepDrainPosted, WRID: id, Carrier: c.qpn, Count: l.Len()})
				return
			}
		}
		c = next
	}
}

// postFlush is post without the barrier; it returns false when nothing
// may be posted any more.
func (r *Reaper) postFlush(now time.Time) bool {
	if r.cqErr != nil || r.shut {
		return false
	}
	for h := r.lists[stageFlush].Front(); h != nil && r.inFlight < r.opts.Headroom; {
		next := h.links.Next()
		if !h.waitsPoll(r.pollGen) {
			r.postFor(h, now)
		}
		h = next
	}
	return true
}

// waitsPoll reports whether h's last post found its queue full during
// the poll generation gen: it is posted again after the next poll.
func (h *Handle) waitsPoll(gen uint64) bool { return h.x != nil && h.x.full && h.x.retryGen == gen }

// drainSend is the WR list of a send drain WR with id.
func (r *Reaper) drainSend(id uint64) []ibv.SendWR {
	r.sendWR[0] = ibv.SendWR{ID: id, Opcode: ibv.WRSend, Flags: ibv.SendSignaled}
	return r.sendWR[:]
}

// drainRecv is the WR list of a receive drain WR with id.
func (r *Reaper) drainRecv(id uint64) []ibv.RecvWR {
	r.recvWR[0] = ibv.RecvWR{ID: id}
	return r.recvWR[:]
}

// postFor posts h's missing drain WRs, receive first: a provider that
// flushes a receive posted in ERROR only when a later post reaches the QP
// (rxe on Linux 6.12, docs/PROVIDERS.md) gets the send drain WR as that
// post.
func (r *Reaper) postFor(h *Handle, now time.Time) {
	if h.needRecv && r.inFlight < r.opts.Headroom {
		id := r.nextID()
		if !r.posted(h, id, h.qp.PostRecv(r.drainRecv(id)), "receive drain WR", now) {
			return
		}
		h.needRecv, h.recvID = false, id
		r.track(id)
		r.stats.RecvDrainWRs++
		h.step(now, &report.Step{Kind: report.StepRecvDrainPosted, WRID: id})
	}
	if h.needSend && r.inFlight < r.opts.Headroom {
		id := r.nextID()
		if !r.posted(h, id, h.qp.PostSend(r.drainSend(id)), "drain WR", now) {
			return
		}
		h.needSend, h.sendID = false, id
		r.track(id)
		r.stats.DrainWRs++
		h.step(now, &report.Step{Kind: report.StepDrainPosted, WRID: id, Carrier: h.qpn, Count: 1})
	}
	if !h.needSend && !h.needRecv {
		r.lists[stageFlush].remove(h)
		r.place(h, now)
	}
}

// posted handles a post's error: a full queue waits for the next poll,
// which may free a slot (a provider may return send slots only when their
// completions are polled); anything else fails the drain. It reports
// whether the WR was posted.
func (r *Reaper) posted(h *Handle, id uint64, err error, what string, now time.Time) bool {
	switch {
	case err == nil:
		if h.x != nil {
			h.x.full = false
		}
		return true
	case errors.Is(err, ibv.ErrQueueFull):
		if h.x == nil || !h.x.full {
			r.stats.PostRetries++
			h.step(now, &report.Step{Kind: report.StepPostRetry, WRID: id})
		}
		x := h.ext()
		x.full, x.retryGen = true, r.pollGen
		return false
	}
	r.finish(h, report.Failed, fmt.Errorf("posting the %s on qpn %d: %w: %w", what, h.qpn, ErrPostDrain, err), now)
	return false
}

// release returns a counted drain WR's slot to the headroom.
func (r *Reaper) release(id uint64) {
	r.inFlight--
	r.noBarrier(id)
}

// noBarrier forgets that the drain WR id is the newest outstanding, if it
// is: it completed, or its QP no longer drains, so it orders nothing one
// can count on.
func (r *Reaper) noBarrier(id uint64) {
	if id&^WRIDMask == r.newest {
		r.newest = 0
	}
}

// loseWR keeps counting a drain WR posted on qpn whose handle the reaper
// let go of, until it completes or, its QP destroyed through its handle
// (destroyed), a poll begun after that finds the CQ empty (untrack).
func (r *Reaper) loseWR(id uint64, qpn uint32) {
	if r.lost == nil {
		r.lost = make(map[uint64]uint32)
	}
	r.lost[id] = qpn
}

// untrack stops counting a lost drain WR against the headroom, if it
// still is; one adopted from the ledger leaves it.
func (r *Reaper) untrack(id uint64) {
	qpn, ok := r.lost[id]
	if !ok {
		return
	}
	delete(r.lost, id)
	r.release(id)
	if r.adopted > 0 && r.dropLeft(id, qpn, r) {
		r.adopted--
	}
}

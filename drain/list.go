package drain

import "github.com/qpdrain/qpdrain/ilist"

// stage is where a QP is in its drain; each stage but the transient ones is
// one of the reaper's lists, named after ipoib_cm.c's where they match.
type stage uint8

const (
	stageAdding     stage = iota // being moved to ERROR, on no list yet
	stageProving                 // counting receives, waiting for the CQ to be past the number's earlier QPs
	stageError                   // rx_error_list: in ERROR, waiting for Last WQE Reached
	stageFlush                   // rx_flush_list: ready, a drain WR still to post (headroom, a full queue)
	stageWait                    // rx_drain_list: drain WRs posted, or receives counted, awaited
	stageBarrier                 // only the SRQ side open, waiting for a barrier completion
	stageEmptyWait               // stalled under DestroyWhenEmpty, waiting for an empty poll
	stageQuarantine              // stalled, kept
	stageDone                    // outcome reached, forgotten by the reaper
	numStages                    // the number of stages, for Reaper.lists
)

// list is an intrusive list of handles ordered by deadline, so moving a QP
// between lists costs no allocation, removal is O(1), and the first entry
// is the next to time out.
type list struct {
	ilist.List[Handle]
	of stage // the stage this list holds
}

// push inserts h in deadline order, searching from the back: QPs usually
// arrive in the order they time out.
func (l *list) push(h *Handle) {
	at := l.Back()
	for at != nil && at.deadline > h.deadline {
		at = at.links.Prev()
	}
	var after *ilist.Links[Handle]
	if at != nil {
		after = &at.links
	}
	l.InsertAfter(h, &h.links, after)
	h.on = l.of
}

func (l *list) remove(h *Handle) {
	l.Remove(&h.links)
	h.on = stageAdding
}

// listOf is the list of stage s, nil for a stage that has none.
func (r *Reaper) listOf(s stage) *list {
	if s == stageAdding || s >= stageDone {
		return nil
	}
	return &r.lists[s]
}

package drain

import (
	"time"

	"github.com/qpdrain/qpdrain/ibv"
)

// eventHistory remembers the Last WQE Reached of QPs not being drained,
// by QP object, the oldest dropped first once max are held.
type eventHistory struct {
	max  int
	at   map[ibv.QP]time.Time
	ring []ibv.QP
	next int
}

func (e *eventHistory) add(qp ibv.QP, at time.Time) {
	if e.max <= 0 {
		return
	}
	if e.at == nil {
		e.at = make(map[ibv.QP]time.Time)
	}
	if _, ok := e.at[qp]; ok {
		return
	}
	if len(e.ring) < e.max {
		e.ring = append(e.ring, qp)
	} else {
		delete(e.at, e.ring[e.next])
		e.ring[e.next] = qp
		e.next = (e.next + 1) % e.max
	}
	e.at[qp] = at
}

// take returns and forgets when qp's Last WQE Reached was seen.
func (e *eventHistory) take(qp ibv.QP) (time.Time, bool) {
	if len(e.at) == 0 {
		return time.Time{}, false // a lookup by interface checks the key first
	}
	at, ok := e.at[qp]
	if ok {
		delete(e.at, qp)
	}
	return at, ok
}

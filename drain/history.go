package drain

import (
	"time"

	"github.com/qpdrain/qpdrain/ibv"
)

// eventHistory remembers the Last WQE Reached of QPs not being drained,
// by QP object and error episode (ibv.AsyncEvent.QPResets), the oldest
// dropped first once max are held.
type eventHistory struct {
	max  int
	at   map[ibv.QP]remembered
	ring []ibv.QP
	next int
}

// remembered is when a QP's Last WQE Reached was handed over, and the
// error episode it was raised in.
type remembered struct {
	at     time.Time
	resets uint64
}

func (e *eventHistory) add(qp ibv.QP, resets uint64, at time.Time) {
	if e.max <= 0 {
		return
	}
	if e.at == nil {
		e.at = make(map[ibv.QP]remembered)
	}
	if m, ok := e.at[qp]; ok {
		if m.resets != resets {
			// A later episode's: the earlier one's can serve no drain.
			e.at[qp] = remembered{at: at, resets: resets}
		}
		return
	}
	if len(e.ring) < e.max {
		e.ring = append(e.ring, qp)
	} else {
		delete(e.at, e.ring[e.next])
		e.ring[e.next] = qp
		e.next = (e.next + 1) % e.max
	}
	e.at[qp] = remembered{at: at, resets: resets}
}

// take returns and forgets when qp's Last WQE Reached was seen, if it was
// raised in the error episode qp is in now (resets).
func (e *eventHistory) take(qp ibv.QP, resets uint64) (time.Time, bool) {
	if len(e.at) == 0 {
		return time.Time{}, false // a lookup by interface checks the key first
	}
	m, ok := e.at[qp]
	if ok {
		delete(e.at, qp)
	}
	return m.at, ok && m.resets == resets
}

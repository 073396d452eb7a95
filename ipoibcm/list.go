package ipoibcm

// State is a passive connection's state, as ipoib_cm.c names them.
type State uint8

// States (enum ipoib_cm_state).
const (
	// StateLive (IPOIB_CM_RX_LIVE): connected, on passive_ids, or
	// disconnected by the peer with its QP in ERROR and not yet moved.
	StateLive State = iota
	// StateError (IPOIB_CM_RX_ERROR): moved to ERROR by the stale task,
	// by device stop, or (Bounded policy) by a disconnect.
	StateError
	// StateFlush (IPOIB_CM_RX_FLUSH): Last WQE Reached seen.
	StateFlush
)

// String names the state as ipoib_cm.c does, without the prefix.
func (s State) String() string {
	switch s {
	case StateLive:
		return "LIVE"
	case StateError:
		return "ERROR"
	case StateFlush:
		return "FLUSH"
	}
	return "State(?)"
}

// ListID names one of the manager's lists.
type ListID uint8

// Lists, named as struct ipoib_cm_dev_priv names them. ListQuarantine is
// qpdrain's: QPs the Bounded policy kept because their drain stalled.
const (
	ListNone       ListID = iota // reaped, or never listed
	ListPassive                  // passive_ids: live connections, most recently active first
	ListError                    // rx_error_list: in ERROR, waiting for Last WQE Reached (or, without an SRQ, for the receives to flush)
	ListFlush                    // rx_flush_list: Last WQE Reached seen, no drain WR yet
	ListDrain                    // rx_drain_list: behind the outstanding drain WR (Bounded: handed to the drain reaper)
	ListReap                     // rx_reap_list: proven finished, to be destroyed
	ListQuarantine               // Bounded only: drain stalled, kept and counted
	NumLists                     // the number of lists, for arrays indexed by ListID
)

var listNames = [NumLists]string{"none", "passive_ids", "rx_error_list", "rx_flush_list", "rx_drain_list", "rx_reap_list", "quarantine"}

// String is the list's name in ipoib_cm.c ("passive_ids", "rx_flush_list", ...).
func (l ListID) String() string {
	if l < NumLists {
		return listNames[l]
	}
	return "ListID(?)"
}

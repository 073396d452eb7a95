package report

import "fmt"

// Queue says which work queue of a QP a completion belongs to. A flushed
// completion carries no valid opcode, so only the caller, through its own
// wr_id scheme, can tell; see Options.Queue.
type Queue uint8

// Queues.
const (
	QueueUnknown Queue = iota
	QueueSend
	QueueRecv
)

// String names the queue ("send", "recv", "unknown").
func (q Queue) String() string {
	switch q {
	case QueueSend:
		return "send"
	case QueueRecv:
		return "recv"
	}
	return "unknown"
}

// MarshalText methods write each enum as its String, so that JSON output
// carries the same words as the text output. They never fail; Outcome,
// which JSON is read back into, has UnmarshalText too.

// MarshalText encodes the queue as its name ("send", "recv", "unknown").
func (q Queue) MarshalText() ([]byte, error) { return []byte(q.String()), nil }

// MarshalText encodes the outcome as its name ("safe").
func (o Outcome) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// MarshalText encodes the proof as its description ("receive drain WR").
func (p Proof) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// MarshalText encodes what was missing as its description.
func (m Missing) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText reads an outcome's name back; any other text is an error.
func (o *Outcome) UnmarshalText(text []byte) error {
	for i, n := range outcomeNames {
		if string(text) == n {
			*o = Outcome(i)
			return nil
		}
	}
	return fmt.Errorf("unknown outcome %q, want one of %q", text, outcomeNames)
}

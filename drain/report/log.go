package report

import (
	"encoding/binary"
	"encoding/json"
	"slices"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
)

// Log is a drain's steps as it records them: packed, each in the few
// bytes its fields take, and decoded only when read (Report.Steps). A drain
// writes six to eight steps for every QP and most reports are never read
// step by step, so what a step costs is its bytes and the stores to them:
// a QP drained the usual way takes 40-50 bytes, where its Steps take 64
// each. The zero Log is empty and ready to use.
type Log struct {
	b    []byte
	errs []error // the Err of the steps that have one, in their order
}

// A step is its kind; a byte saying which of its fields are not zero
// (logWRID ...); At as a signed varint; then each field that is not zero:
// WRID as a varint, or, when its top 16 bits are not zero (a tag, as drain
// WR IDs carry, or a pointer), those 2 bytes and the rest as a varint;
// Carrier, val and To as varints; Queue and Outcome a byte each. val is
// the one of From, Event, Status and Count its kind has (a Step sets only
// those), so it is written with no switch by kind and read back by it. An
// Err is not written: its step takes the next of errs.
const (
	logWRID    = 1 << iota // WRID, its top 16 bits zero
	logWRIDTop             // WRID, its top 16 bits not zero
	logCarrier             // Carrier
	logVal                 // From, Event, Status or Count
	logTo                  // To
	logQueue               // Queue
	logOutcome             // Outcome
	logErr                 // Err, the next of Log.errs
)

// maxLogStep is the most bytes one step takes.
const maxLogStep = 2 + binary.MaxVarintLen64 + 2 + binary.MaxVarintLen64 + binary.MaxVarintLen32 +
	binary.MaxVarintLen64 + binary.MaxVarintLen32 + 2

// logGrown is the room a log that outgrows its first room takes at once:
// a drain that goes past its first step takes about 50 bytes, and growing
// from 8 by doubling would copy it three times. A first step takes only
// its own room: a QP that waits for Last WQE Reached may wait long with
// nothing more.
const logGrown = 64

// MakeLog returns an empty Log that writes into room's capacity before it
// allocates, so that the logs of a batch of QPs can share one allocation
// (each given its own part, whose capacity ends where the next begins).
func MakeLog(room []byte) Log { return Log{b: room[:0]} }

// Append appends s to l. s is read field by field, each as it was stored:
// a step built just before the call and copied whole would be read with
// wide loads that wait for its narrow stores.
func (l *Log) Append(s *Step) {
	var buf [maxLogStep]byte
	var mask byte
	n := 2
	n += binary.PutVarint(buf[n:], int64(s.At))
	switch id := s.WRID; {
	case id>>48 != 0:
		mask |= logWRIDTop
		binary.LittleEndian.PutUint16(buf[n:], uint16(id>>48))
		n += 2
		n += binary.PutUvarint(buf[n:], id&(1<<48-1))
	case id != 0:
		mask |= logWRID
		n += binary.PutUvarint(buf[n:], id)
	}
	if s.Carrier != 0 {
		mask |= logCarrier
		n += binary.PutUvarint(buf[n:], uint64(s.Carrier))
	}
	if val := uint64(s.From) | uint64(s.Event) | uint64(s.Status) | uint64(s.Count); val != 0 {
		mask |= logVal
		n += binary.PutUvarint(buf[n:], val)
	}
	if s.To != 0 {
		mask |= logTo
		n += binary.PutUvarint(buf[n:], uint64(s.To))
	}
	if s.Queue != 0 {
		mask |= logQueue
		buf[n] = byte(s.Queue)
		n++
	}
	if s.Outcome != 0 {
		mask |= logOutcome
		buf[n] = byte(s.Outcome)
		n++
	}
	if s.Err != nil {
		mask |= logErr
		l.errs = append(l.errs, s.Err)
	}
	buf[0], buf[1] = byte(s.Kind), mask
	if len(l.b)+n > cap(l.b) && len(l.b) > 0 && cap(l.b) < logGrown {
		l.b = append(make([]byte, 0, max(logGrown, len(l.b)+n)), l.b...)
	}
	l.b = append(l.b, buf[:n]...)
}

// Insert puts the steps of first before l's, in a new allocation: a Report
// may share l's.
func (l *Log) Insert(first Log) {
	if len(first.b) == 0 {
		return
	}
	if len(l.b) == 0 {
		*l = first
		return
	}
	l.b = slices.Concat(first.b, l.b)
	if len(first.errs) > 0 {
		l.errs = slices.Concat(first.errs, l.errs)
	}
}

// steps decodes the log.
func (l *Log) steps() []Step {
	if len(l.b) == 0 {
		return nil
	}
	// Decoded on the stack, then copied once: a usual drain's eight steps
	// grown by append took four allocations.
	var room [8]Step
	steps := room[:0]
	uvarint := func(b []byte) (uint64, []byte) {
		v, n := binary.Uvarint(b)
		return v, b[n:]
	}
	errs := l.errs
	for b := l.b; len(b) > 0; {
		s := Step{Kind: StepKind(b[0])}
		mask := b[1]
		at, n := binary.Varint(b[2:])
		b = b[2+n:]
		s.At = time.Duration(at)
		var v, val uint64
		switch {
		case mask&logWRIDTop != 0:
			top := uint64(binary.LittleEndian.Uint16(b)) << 48
			v, b = uvarint(b[2:])
			s.WRID = top | v
		case mask&logWRID != 0:
			s.WRID, b = uvarint(b)
		}
		if mask&logCarrier != 0 {
			v, b = uvarint(b)
			s.Carrier = uint32(v)
		}
		if mask&logVal != 0 {
			val, b = uvarint(b)
		}
		if mask&logTo != 0 {
			v, b = uvarint(b)
			s.To = ibv.QPState(v)
		}
		if mask&logQueue != 0 {
			s.Queue, b = Queue(b[0]), b[1:]
		}
		if mask&logOutcome != 0 {
			s.Outcome, b = Outcome(b[0]), b[1:]
		}
		if mask&logErr != 0 {
			s.Err, errs = errs[0], errs[1:]
		}
		switch s.Kind {
		case StepState:
			s.From = ibv.QPState(val)
		case StepEvent:
			s.Event = ibv.EventType(val)
		case StepErrorWC, StepDrainDone, StepRecvDrainDone:
			s.Status = ibv.WCStatus(val)
		case StepDrainPosted, StepLastWQEStated:
			s.Count = int(val)
		}
		steps = append(steps, s)
	}
	return slices.Clone(steps)
}

// MarshalJSON marshals the steps, decoded.
func (l Log) MarshalJSON() ([]byte, error) { return json.Marshal(l.steps()) }

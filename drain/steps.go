package drain

import (
	"encoding/binary"
	"slices"
	"time"

	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/ibv"
)

// A handle keeps its report's steps as a log of bytes (Handle.steps), each
// step in the few bytes its fields take: a drain writes about six steps
// for every QP and they are read only when a report is built, so what
// costs is the memory they take and the stores to it, at 65,536 QPs
// outside the cache. A QP drained the usual way takes about 40 bytes
// where 32-byte steps took 192 and Steps (64 bytes) take 384.
//
// A step is its kind; a byte saying which of its fields are not zero
// (stepWRID ...); its time, from the handle's start, as a signed varint;
// then each field that is not zero, as a varint, but Queue and Outcome, a
// byte each. A drain WR's ID goes as its sequence number, a carrier that
// is the QP itself as a bit. val is the one of From, Event, Status and
// Count its kind has (report.Step sets only those), or for a step with an
// Err its index in handleExt.errs plus one: written with no switch by kind,
// and read back as it was written.
const (
	stepWRID    = 1 << iota // WRID, any ID
	stepDrainID             // WRID, a drain WR's (its sequence number)
	stepCarrier             // Carrier, another QP
	stepSelf                // Carrier, the QP itself (no bytes)
	stepVal                 // From, Event, Status, Count or Err
	stepTo                  // To
	stepQueue               // Queue
	stepOutcome             // Outcome
)

// maxStep is the most bytes one step takes.
const maxStep = 2 + 3*binary.MaxVarintLen64 + 2*binary.MaxVarintLen32 + 2

// stepsGrown is the room a step log that outgrows its first room takes at
// once: a drain that goes past its first step takes about 40 bytes, and
// growing from 8 by doubling would copy it three times. A first step
// takes only its own room: a QP that waits for Last WQE Reached may wait
// long with nothing more.
const stepsGrown = 64

// appendStep appends s, dated at, to b, with val in place of its From,
// Event, Status, Count and Err (see Handle.step). It writes nothing of h, so that
// a move to ERROR made without the reaper's lock can log its transitions
// (moveToError); it reads only what Add set before.
//
// s is read field by field, each as it was stored: a step built just
// before the call and copied whole would be read with wide loads that
// wait for its narrow stores.
func (h *Handle) appendStep(b []byte, at time.Time, s *report.Step, val uint64) []byte {
	var buf [maxStep]byte
	var mask byte
	n := 2
	n += binary.PutVarint(buf[n:], int64(at.Sub(h.r.epoch)-h.report.start))
	switch id := s.WRID; {
	case IsDrainWRID(id):
		mask |= stepDrainID
		n += binary.PutUvarint(buf[n:], id&^WRIDMask)
	case id != 0:
		mask |= stepWRID
		n += binary.PutUvarint(buf[n:], id)
	}
	switch c := s.Carrier; {
	case c == h.qpn && c != 0:
		mask |= stepSelf
	case c != 0:
		mask |= stepCarrier
		n += binary.PutUvarint(buf[n:], uint64(c))
	}
	if val != 0 {
		mask |= stepVal
		n += binary.PutUvarint(buf[n:], val)
	}
	if s.To != 0 {
		mask |= stepTo
		n += binary.PutUvarint(buf[n:], uint64(s.To))
	}
	if s.Queue != 0 {
		mask |= stepQueue
		buf[n] = byte(s.Queue)
		n++
	}
	if s.Outcome != 0 {
		mask |= stepOutcome
		buf[n] = byte(s.Outcome)
		n++
	}
	buf[0], buf[1] = byte(s.Kind), mask
	if len(b)+n > cap(b) && len(b) > 0 && cap(b) < stepsGrown {
		b = append(make([]byte, 0, max(stepsGrown, len(b)+n)), b...)
	}
	return append(b, buf[:n]...)
}

// step appends s, dated at, which sets only the fields its kind names, to
// h's steps.
func (h *Handle) step(at time.Time, s *report.Step) {
	val := uint64(s.From) | uint64(s.Event) | uint64(s.Status) | uint64(s.Count)
	if s.Err != nil {
		val = h.keep(s.Err)
	}
	h.steps = h.appendStep(h.steps, at, s, val)
}

// transition appends to b the StepState of a move from -> to at at.
func (h *Handle) transition(b []byte, at time.Time, from, to ibv.QPState) []byte {
	return h.appendStep(b, at, &report.Step{Kind: report.StepState, To: to}, uint64(from))
}

// keep adds err to h's errors of steps and returns its index plus one.
func (h *Handle) keep(err error) uint64 {
	x := h.ext()
	x.errs = append(x.errs, err)
	return uint64(len(x.errs))
}

// unpackSteps is the Steps h's log was written from.
func (h *Handle) unpackSteps() []report.Step {
	// Decoded on the stack, then copied once: a usual drain's six steps
	// grown by append took four allocations.
	var room [8]report.Step
	steps := room[:0]
	uvarint := func(b []byte) (uint64, []byte) {
		v, n := binary.Uvarint(b)
		return v, b[n:]
	}
	for b := h.steps; len(b) > 0; {
		s := report.Step{Kind: report.StepKind(b[0])}
		mask := b[1]
		at, n := binary.Varint(b[2:])
		b = b[2+n:]
		s.At = time.Duration(at)
		var v, val uint64
		switch {
		case mask&stepDrainID != 0:
			v, b = uvarint(b)
			s.WRID = WRIDTag | v
		case mask&stepWRID != 0:
			s.WRID, b = uvarint(b)
		}
		switch {
		case mask&stepSelf != 0:
			s.Carrier = h.qpn
		case mask&stepCarrier != 0:
			v, b = uvarint(b)
			s.Carrier = uint32(v)
		}
		if mask&stepVal != 0 {
			val, b = uvarint(b)
		}
		if mask&stepTo != 0 {
			v, b = uvarint(b)
			s.To = ibv.QPState(v)
		}
		if mask&stepQueue != 0 {
			s.Queue, b = report.Queue(b[0]), b[1:]
		}
		if mask&stepOutcome != 0 {
			s.Outcome, b = report.Outcome(b[0]), b[1:]
		}
		switch s.Kind {
		case report.StepState:
			s.From = ibv.QPState(val)
		case report.StepEvent:
			s.Event = ibv.EventType(val)
		case report.StepErrorWC, report.StepDrainDone, report.StepRecvDrainDone:
			s.Status = ibv.WCStatus(val)
		case report.StepDrainPosted, report.StepLastWQEStated:
			s.Count = int(val)
		case report.StepStall, report.StepOutcome:
			if val != 0 {
				s.Err = h.x.errs[val-1]
			}
		}
		steps = append(steps, s)
	}
	if len(steps) == 0 {
		return nil
	}
	return slices.Clone(steps)
}

package drain

import (
	"time"

	"github.com/qpdrain/qpdrain/drain/report"
	"github.com/qpdrain/qpdrain/ibv"
)

// step appends s, dated at, which sets only the fields its kind names, to
// h's steps.
func (h *Handle) step(at time.Time, s *report.Step) {
	s.At = h.r.at(at) - h.report.start
	h.steps.Append(s)
}

// transition appends to l the StepState of a move from -> to at at. It
// writes nothing of h, so that a move to ERROR made without the reaper's
// lock can log its transitions (moveToError); it reads only what Add set
// before.
func (h *Handle) transition(l *report.Log, at time.Time, from, to ibv.QPState) {
	l.Append(&report.Step{At: h.r.at(at) - h.report.start, Kind: report.StepState, From: from, To: to})
}

// Package report is what a drain saw and proved for one QP: the outcome,
// the proof of each queue, and every step in order, with times. A
// [github.com/qpdrain/qpdrain/drain.Reaper] or
// [github.com/qpdrain/qpdrain/drain.DrainAll] hands one out per QP; read it to
// learn whether the QP may be destroyed and why.
//
// A Report's Outcome is [Safe] only when both [Report.Recv] and
// [Report.Send] carry a [Proof]: a drain WR's completion, Last WQE Reached
// followed by a barrier drain WR's, the caller's count of receives back,
// or the caller's statement that nothing was outstanding. An unproven
// queue's [QueueProof.Missing] says what never came. [Report.Steps] is the
// drain's log (state transitions, events, drain WRs posted and completed,
// stalls), decoded from the packed [Log] a report keeps and printed by
// [Report.String] one step a line; every enum marshals to JSON as the words
// the text uses.
package report

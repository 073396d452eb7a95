package soft

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ErrUnknownQuirk is the error ParseQuirks wraps for a name QuirkNames does
// not list.
var ErrUnknownQuirk = errors.New("unknown quirk")

// quirkNames names each switch of Quirks as the CLI's --quirk and
// --soft-quirk flags spell it, in kebab case.
var quirkNames = map[string]func(*Quirks) *bool{
	"send-in-error-not-flushed":    func(q *Quirks) *bool { return &q.SendInErrorNotFlushed },
	"no-last-wqe-reached":          func(q *Quirks) *bool { return &q.NoLastWQEReached },
	"last-wqe-reached-twice":       func(q *Quirks) *bool { return &q.LastWQEReachedTwice },
	"recv-in-error-flush-deferred": func(q *Quirks) *bool { return &q.RecvInErrorFlushDeferred },
	"drain-needs-rts":              func(q *Quirks) *bool { return &q.DrainNeedsRTS },
	"recv-in-error-not-flushed":    func(q *Quirks) *bool { return &q.RecvInErrorNotFlushed },
	"no-responder-error-event":     func(q *Quirks) *bool { return &q.NoResponderErrorEvent },
	"last-wqe-reached-again":       func(q *Quirks) *bool { return &q.LastWQEReachedAgain },
	"cq-overrun-keeps-qps":         func(q *Quirks) *bool { return &q.CQOverrunKeepsQPs },
	"flush-deferred":               func(q *Quirks) *bool { return &q.FlushDeferred },
	"sqd-drained-early":            func(q *Quirks) *bool { return &q.SQDrainedEarly },
}

// QuirkNames lists the names ParseQuirks takes, sorted, one per switch of
// Quirks.
func QuirkNames() []string {
	names := make([]string, 0, len(quirkNames))
	for n := range quirkNames {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// ParseQuirks turns quirk names (QuirkNames) into the switches they set. A
// name it does not know is an error wrapping ErrUnknownQuirk that lists the
// known ones.
func ParseQuirks(names []string) (Quirks, error) {
	var q Quirks
	for _, name := range names {
		field, ok := quirkNames[name]
		if !ok {
			return Quirks{}, fmt.Errorf("%w %q, want one of %s", ErrUnknownQuirk, name, strings.Join(QuirkNames(), ", "))
		}
		*field(&q) = true
	}
	return q, nil
}

package drain

import (
	"context"
	"time"

	"github.com/qpdrain/qpdrain/clock"
)

// afterUntil calls f once t has passed on c, unless stop is called
// first; f may still run as stop returns, so it must be harmless late. A
// zero t never fires. On the real clock it is a runtime timer (Wait runs
// once per drain: a goroutine each would cost a third of a one-at-a-time
// drain); on any other clock a goroutine that sleeps on it, ended by stop.
func afterUntil(c clock.Clock, t time.Time, f func()) (stop func()) {
	if t.IsZero() {
		return func() {}
	}
	if _, real := c.(clock.Real); real {
		timer := time.AfterFunc(time.Until(t), f)
		return func() { timer.Stop() }
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if c.Sleep(ctx, t.Sub(c.Now())) == nil {
			f()
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

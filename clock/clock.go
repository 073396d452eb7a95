// Package clock is the time qpdrain's reapers, managers and simulations run
// on. A drain.Reaper or an ipoibcm.Manager never reads time.Now itself: on
// Real it runs in wall-clock time; on a Virtual clock, or on a soft device's
// fabric (soft.Fabric, whose device timers fire as it moves), a stall
// timeout or hours of connection churn take no real time and a seed replays
// exactly.
package clock

import (
	"context"
	"sync"
	"time"
)

// Clock is a source of time that can also be waited on.
type Clock interface {
	// Now is the current time.
	Now() time.Time
	// Sleep lets d pass, or returns ctx.Err() when ctx ends first. A
	// simulated clock moves forward by d at once.
	Sleep(ctx context.Context, d time.Duration) error
}

// Real is wall-clock time.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// Sleep waits d in real time, or until ctx ends.
func (Real) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Virtual is simulated time: it stands still until Set, Advance or Sleep
// moves it. Safe for concurrent use.
type Virtual struct {
	mu  sync.Mutex
	now time.Time
}

// NewVirtual returns a clock that reads start.
func NewVirtual(start time.Time) *Virtual { return &Virtual{now: start} }

// Now returns the clock's time.
func (c *Virtual) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d (a negative d is ignored).
func (c *Virtual) Advance(d time.Duration) {
	if d <= 0 {
		return
	}
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Set moves the clock to t if t is later than its time; time never runs
// backwards.
func (c *Virtual) Set(t time.Time) {
	c.mu.Lock()
	if t.After(c.now) {
		c.now = t
	}
	c.mu.Unlock()
}

// Sleep advances the clock by d unless ctx has ended.
func (c *Virtual) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.Advance(d)
	return nil
}

package drain

import (
	"context"
	"sync"
	"time"
)

// Clock is the time a Reaper runs on (Options.Clock): every deadline,
// stall timer and report timestamp. A Reaper never reads time.Now itself,
// so a drain can run on simulated time. ipoibcm's Managers run on the same
// interface.
type Clock interface {
	// Now is the current time.
	Now() time.Time
	// Sleep lets d pass, or returns ctx.Err() when ctx ends first.
	Sleep(ctx context.Context, d time.Duration) error
}

// RealClock is wall-clock time, the default.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// Sleep waits d in real time, or until ctx ends.
func (RealClock) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// VirtualClock is simulated time: it stands still until Set or Advance
// moves it, and Sleep advances it at once, so a stall timeout or hours of
// connection churn take no real time and a seed replays exactly. A Wait
// or Run on it whose next stall deadline is ahead sleeps to it at once:
// feed the reaper (Poll) before waiting. Safe for concurrent use.
type VirtualClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewVirtualClock returns a clock that reads start.
func NewVirtualClock(start time.Time) *VirtualClock { return &VirtualClock{now: start} }

// Now returns the clock's time.
func (c *VirtualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d (a negative d is ignored).
func (c *VirtualClock) Advance(d time.Duration) {
	if d <= 0 {
		return
	}
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Set moves the clock to t if t is later than its time; time never runs
// backwards.
func (c *VirtualClock) Set(t time.Time) {
	c.mu.Lock()
	if t.After(c.now) {
		c.now = t
	}
	c.mu.Unlock()
}

// Sleep advances the clock by d unless ctx has ended.
func (c *VirtualClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.Advance(d)
	return nil
}

// afterUntil calls f once t has passed on c, unless stop is called
// first; f may still run as stop returns, so it must be harmless late. A
// zero t never fires. On the real clock it is a runtime timer (Wait runs
// once per drain: a goroutine each would cost a third of a one-at-a-time
// drain); on any other clock a goroutine that sleeps on it, ended by stop.
func afterUntil(c Clock, t time.Time, f func()) (stop func()) {
	if t.IsZero() {
		return func() {}
	}
	if _, real := c.(RealClock); real {
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

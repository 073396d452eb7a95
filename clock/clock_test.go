package clock_test

import (
	"context"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/clock"
)

func TestVirtual(t *testing.T) {
	start := time.Unix(1e9, 0)
	c := clock.NewVirtual(start)
	c.Advance(-time.Second)
	c.Set(start.Add(-time.Hour))
	if got := c.Now(); !got.Equal(start) {
		t.Errorf("after a negative Advance and an earlier Set: %v, want %v (time never runs backwards)", got, start)
	}
	if err := c.Sleep(context.Background(), time.Minute); err != nil {
		t.Fatal(err)
	}
	c.Advance(time.Second)
	c.Set(start.Add(2 * time.Minute))
	if got, want := c.Now(), start.Add(2*time.Minute); !got.Equal(want) {
		t.Errorf("%v, want %v", got, want)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Sleep(ctx, time.Hour); err != context.Canceled {
		t.Errorf("Sleep on an ended context: %v, want context.Canceled", err)
	}
	if got, want := c.Now(), start.Add(2*time.Minute); !got.Equal(want) {
		t.Errorf("a Sleep refused moved the clock to %v", got)
	}
}

func TestRealSleepEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := (clock.Real{}).Sleep(ctx, time.Hour); err != context.Canceled {
		t.Errorf("Sleep on an ended context: %v, want context.Canceled", err)
	}
	before := time.Now()
	if err := (clock.Real{}).Sleep(context.Background(), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(before); d < time.Millisecond {
		t.Errorf("slept %v, want at least 1ms", d)
	}
}

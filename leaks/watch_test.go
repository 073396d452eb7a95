package leaks

import (
	"context"
	"errors"
	"testing"
	"time"
)

// fakeSampler returns a sample with one device and counts its calls.
type fakeSampler struct {
	calls int
	err   error // returned from the third call on
}

func (f *fakeSampler) Sample(context.Context) (Sample, error) {
	f.calls++
	if f.err != nil && f.calls >= 3 {
		return Sample{}, f.err
	}
	return Sample{At: time.Now(), Devices: []Device{{Name: "rxe0"}}}, nil
}

func TestWatch(t *testing.T) {
	f := &fakeSampler{}
	var seen []int
	start := time.Now()
	got, err := Watch(context.Background(), f, 30*time.Millisecond, 10*time.Millisecond, func(i, n int, _ Sample) {
		if n != 4 {
			t.Errorf("progress says %d samples, want 4", n)
		}
		seen = append(seen, i)
	})
	if err != nil || len(got) != 4 || len(seen) != 4 {
		t.Fatalf("Watch: %d samples, progress %v, err %v; want 4", len(got), seen, err)
	}
	if el := time.Since(start); el < 30*time.Millisecond {
		t.Errorf("Watch took %v, less than its window", el)
	}
}

func TestWatchErrors(t *testing.T) {
	boom := errors.New("boom")
	got, err := Watch(context.Background(), &fakeSampler{err: boom}, time.Second, time.Millisecond, nil)
	if !errors.Is(err, boom) || len(got) != 2 {
		t.Errorf("Watch: %d samples, err %v; want 2 and boom", len(got), err)
	}
	_, err = Watch(context.Background(), &fakeSampler{err: ErrNoRDMA}, time.Second, time.Millisecond, nil)
	if !errors.Is(err, ErrNoRDMA) {
		t.Errorf("Watch: err %v, want ErrNoRDMA", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Watch(ctx, &fakeSampler{}, time.Hour, time.Minute, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("Watch on a done context: %v", err)
	}
	for _, bad := range [][2]time.Duration{{-time.Second, time.Second}, {time.Second, 0}} {
		if _, err := Watch(context.Background(), &fakeSampler{}, bad[0], bad[1], nil); err == nil {
			t.Errorf("Watch(%v, %v) accepted", bad[0], bad[1])
		}
	}
}

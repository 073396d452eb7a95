package leaks

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Defaults of Watch: four samples a second apart, done in three seconds.
const (
	DefaultFor      = 3 * time.Second
	DefaultInterval = time.Second
)

// Watch takes a sample now and then one every interval until the window
// (for) has passed, and returns them oldest first. progress, when not nil,
// is called after each sample with its number (from 1) and the number the
// window will take. It stops at the first error, returning it with the
// samples taken so far; a done context ends it with the context's error.
func Watch(ctx context.Context, s Sampler, window, interval time.Duration, progress func(i, n int, at Sample)) ([]Sample, error) {
	if window < 0 {
		return nil, fmt.Errorf("sampling window %v is negative", window)
	}
	if interval <= 0 {
		return nil, fmt.Errorf("sampling interval %v must be positive", interval)
	}
	n := int(window/interval) + 1
	samples := make([]Sample, 0, n)
	start := time.Now()
	for i := range n {
		if i > 0 {
			// Each sample at its slot, whatever the previous read took.
			t := time.NewTimer(time.Until(start.Add(time.Duration(i) * interval)))
			select {
			case <-ctx.Done():
				t.Stop()
				return samples, ctx.Err()
			case <-t.C:
			}
		}
		smp, err := s.Sample(ctx)
		if err != nil {
			if errors.Is(err, ErrNoRDMA) {
				return samples, err
			}
			return samples, fmt.Errorf("sample %d of %d: %w", i+1, n, err)
		}
		samples = append(samples, smp)
		if progress != nil {
			progress(i+1, n, smp)
		}
	}
	return samples, nil
}

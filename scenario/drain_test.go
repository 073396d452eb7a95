package scenario

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/soft"
)

// Without quirks every QP is proven safe; with a drain WR that never
// completes every one is quarantined, and the wait that ran out is counted.
func TestDrain(t *testing.T) {
	res, err := (&Drain{QPs: 3, Taken: 2, Sends: 1, MaxQuarantine: drain.DefaultMaxQuarantine}).Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Reports) != 3 || res.NotSafe() != 0 || res.Stats.Safe != 3 || res.TimedOut() != 0 || res.MaxQP != 65536 {
		t.Errorf("no quirks: %d reports, %d not safe, stats %+v, max_qp %d", len(res.Reports), res.NotSafe(), res.Stats, res.MaxQP)
	}
	res, err = (&Drain{QPs: 2, Taken: 2, Sends: 1, MaxQuarantine: drain.DefaultMaxQuarantine, Timeout: 20 * time.Millisecond,
		Quirks: soft.Quirks{SendInErrorNotFlushed: true}}).Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.NotSafe() != 2 || res.Stats.Quarantined != 2 || res.TimedOut() != 2 {
		t.Errorf("drain WR never completes: %d not safe, %d timed out, stats %+v", res.NotSafe(), res.TimedOut(), res.Stats)
	}
}

// A simulation beyond its device is refused before anything runs, with an
// error naming the limit.
func TestDrainLimits(t *testing.T) {
	for _, tc := range []struct {
		d    Drain
		want error
	}{
		{Drain{QPs: 65537}, ErrTooManyQPs},
		{Drain{QPs: 60000, Taken: 100}, ErrCQTooLarge},
	} {
		if _, err := tc.d.Run(context.Background()); !errors.Is(err, tc.want) {
			t.Errorf("%+v: %v, want %v", tc.d, err, tc.want)
		}
	}
}

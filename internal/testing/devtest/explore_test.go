package devtest

import (
	"slices"
	"testing"

	"github.com/qpdrain/qpdrain/soft"
)

// Explore runs the body on the orderly schedule and seeds 1..N, each seed
// reaching the body's devices through Schedule, also from subtests.
func TestExploreSeeds(t *testing.T) {
	if CurrentProvider() != ProviderSoft || DeviceName() == DeviceAdversarial {
		t.Skip("checks the seeds Explore gives on the plain soft device")
	}
	t.Setenv(EnvSeeds, "3")
	var seen, fromSub []uint64
	Explore(t, func(t *testing.T) {
		seen = append(seen, Schedule(t).Seed)
		t.Run("sub", func(t *testing.T) { fromSub = append(fromSub, Schedule(t).Seed) })
	})
	want := []uint64{0, 1, 2, 3}
	if !slices.Equal(seen, want) || !slices.Equal(fromSub, want) {
		t.Errorf("seeds %v, from subtests %v; want %v", seen, fromSub, want)
	}
	if s := Schedule(t); s != (soft.Schedule{}) {
		t.Errorf("schedule after Explore %+v, want orderly", s)
	}
}

// QPDRAIN_SOFT_SEED replays one seed.
func TestExploreReplay(t *testing.T) {
	if CurrentProvider() != ProviderSoft {
		t.Skip("replays a soft device seed")
	}
	t.Setenv(EnvSeed, "1234")
	var seen []uint64
	Explore(t, func(t *testing.T) { seen = append(seen, Schedule(t).Seed) })
	if !slices.Equal(seen, []uint64{1234}) {
		t.Errorf("seeds %v, want [1234]", seen)
	}
}

// Bad settings fail with a message naming the variable.
func TestExploreBadSettings(t *testing.T) {
	for _, tc := range []struct{ env, val string }{{EnvSeeds, "0"}, {EnvSeeds, "many"}, {EnvSeed, "x"}} {
		t.Run(tc.env+"="+tc.val, func(t *testing.T) {
			t.Setenv(tc.env, tc.val)
			if _, err := exploreSeeds(false); err == nil {
				t.Errorf("%s=%q accepted", tc.env, tc.val)
			}
		})
	}
}

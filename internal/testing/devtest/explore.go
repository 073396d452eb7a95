package devtest

import (
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/soft"
)

// Exploration of the soft device's adversarial schedules.
const (
	// EnvSeeds is how many adversarial seeds Explore runs (seeds 1..N).
	EnvSeeds = "QPDRAIN_SOFT_SEEDS"
	// EnvSeed, when set, is the one seed Explore runs, and the seed of
	// every test on soft:adversarial: the replay of a failure.
	EnvSeed = "QPDRAIN_SOFT_SEED"
	// EnvExploreTime bounds how long one Explore keeps starting seeds (a Go
	// duration, e.g. "2m"); unset, it runs them all.
	EnvExploreTime = "QPDRAIN_SOFT_EXPLORE_TIME"
	// DefaultSeeds is how many seeds Explore runs when EnvSeeds is unset
	// (2 with -short): modest, so that make test stays quick.
	DefaultSeeds = 8
	// maxExploreFailures stops an exploration that keeps failing, so a
	// broken body reports a few seeds instead of flooding the log.
	maxExploreFailures = 20
)

// DeviceAdversarial is the QPDRAIN_TEST_DEVICE value that runs the tests on
// soft devices with adversarial schedules: each test not run by Explore
// gets a seed of its own, derived from its name and printed if it fails.
const DeviceAdversarial = "soft:adversarial"

// seeds maps a test name to the seed Explore gave it; subtests of that
// test find it by prefix.
var seeds sync.Map // string -> uint64

// runs counts how often each test name asked for a seed on
// soft:adversarial, so that go test -count=N gives N seeds.
var runs struct {
	sync.Mutex
	n map[string]uint64
}

// Explore runs body under many schedules of the soft device, one subtest
// per seed: "seed=0" (orderly) and seeds 1..N (adversarial), N from
// QPDRAIN_SOFT_SEEDS or DefaultSeeds; with QPDRAIN_SOFT_SEED only that
// seed. Every device body opens through Open (or Schedule) with the t it
// is given, so it runs on that seed. A failing seed names itself and the
// command that replays it. On a device other than soft, body runs once.
func Explore(t *testing.T, body func(t *testing.T)) {
	t.Helper()
	if CurrentProvider() != ProviderSoft {
		body(t)
		return
	}
	list, err := exploreSeeds(testing.Short())
	if err != nil {
		t.Fatal(err)
	}
	var deadline time.Time
	if v := os.Getenv(EnvExploreTime); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive duration such as 2m", EnvExploreTime, v)
		}
		deadline = time.Now().Add(d)
	}
	parent := t.Name()
	start := time.Now()
	passed, failed := 0, 0
	var failing []uint64
	for _, seed := range list {
		if !deadline.IsZero() && time.Now().After(deadline) || failed >= maxExploreFailures {
			break
		}
		ok := t.Run("seed="+strconv.FormatUint(seed, 10), func(t *testing.T) {
			seeds.Store(t.Name(), seed)
			t.Cleanup(func() {
				seeds.Delete(t.Name()) // last: after the body's own cleanups and subtests
				if t.Failed() {
					t.Logf("replay: %s=%d go test -run '%s' %s", EnvSeed, seed, runPattern(parent), packageDir())
				}
			})
			body(t)
		})
		if ok {
			passed++
		} else {
			failed++
			failing = append(failing, seed)
		}
	}
	el := time.Since(start)
	summary := fmt.Sprintf("explore %s: %d passed, %d failed in %.3fs (%.0f seeds a second)",
		t.Name(), passed, failed, el.Seconds(), float64(passed+failed)/el.Seconds())
	if len(failing) > 0 {
		summary += fmt.Sprintf("; failing seeds %v", failing)
	}
	if failed >= maxExploreFailures && passed+failed < len(list) {
		summary += fmt.Sprintf("; stopped after %d failures", failed)
	}
	t.Log(summary)
	if os.Getenv(EnvSeeds) != "" {
		// Explicit explorations (make soak) report on stdout as they end.
		fmt.Println(summary)
	}
}

// exploreSeeds lists the seeds Explore runs.
func exploreSeeds(short bool) ([]uint64, error) {
	if v := os.Getenv(EnvSeed); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: want a seed, a number", EnvSeed, v)
		}
		return []uint64{s}, nil
	}
	n := uint64(DefaultSeeds)
	if short {
		n = 2
	}
	if v := os.Getenv(EnvSeeds); v != "" {
		k, err := strconv.ParseUint(v, 10, 64)
		if err != nil || k == 0 {
			return nil, fmt.Errorf("%s=%q: want a count of seeds, at least 1", EnvSeeds, v)
		}
		n = k
	}
	list := make([]uint64, 0, n+1)
	if DeviceName() != DeviceAdversarial {
		list = append(list, 0)
	}
	for s := uint64(1); s <= n; s++ {
		list = append(list, s)
	}
	return list, nil
}

// packageDir names the test's package directory (go test runs a test
// binary there) relative to the module root, for replay commands; "." if
// it cannot tell.
func packageDir() string {
	wd, err := os.Getwd()
	if err != nil {
		return "."
	}
	for root := wd; ; {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			rel, err := filepath.Rel(root, wd)
			if err != nil || rel == "." {
				return "."
			}
			return "./" + filepath.ToSlash(rel)
		}
		up := filepath.Dir(root)
		if up == root {
			return "."
		}
		root = up
	}
}

// runPattern is the -run pattern that selects exactly the test name.
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// Schedule is the soft device schedule for test t: the seed Explore runs
// it on (t or a subtest of it); on soft:adversarial outside Explore,
// QPDRAIN_SOFT_SEED or a seed derived from the test's name and run count;
// else orderly. A test that opens soft devices itself passes it in
// soft.Config.Schedule. A failing adversarial test logs its seed.
func Schedule(t testing.TB) soft.Schedule {
	t.Helper()
	for name := t.Name(); ; {
		if s, ok := seeds.Load(name); ok {
			return soft.Schedule{Seed: s.(uint64)}
		}
		i := strings.LastIndexByte(name, '/')
		if i < 0 {
			break
		}
		name = name[:i]
	}
	if DeviceName() != DeviceAdversarial {
		return soft.Schedule{}
	}
	seed, err := adversarialSeed(t.Name())
	if err != nil {
		t.Fatal(err)
	}
	// Every device of the test gets this seed: the replay needs only one.
	seeds.Store(t.Name(), seed)
	t.Cleanup(func() {
		seeds.Delete(t.Name())
		if t.Failed() {
			t.Logf("replay: %s=%s %s=%d go test -run '%s' %s", EnvDevice, DeviceAdversarial, EnvSeed, seed, runPattern(t.Name()), packageDir())
		}
	})
	return soft.Schedule{Seed: seed}
}

// adversarialSeed is the seed of a test run on soft:adversarial outside
// Explore.
func adversarialSeed(name string) (uint64, error) {
	if v := os.Getenv(EnvSeed); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil || s == 0 {
			return 0, fmt.Errorf("%s=%q: want a non-zero seed", EnvSeed, v)
		}
		return s, nil
	}
	runs.Lock()
	if runs.n == nil {
		runs.n = map[string]uint64{}
	}
	k := runs.n[name]
	runs.n[name]++
	runs.Unlock()
	h := fnv.New64a()
	h.Write([]byte(name))
	seed := h.Sum64() + k
	if seed == 0 {
		seed = 1
	}
	return seed, nil
}

package churn

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/devtest"
	"github.com/qpdrain/qpdrain/ipoibcm"
	"github.com/qpdrain/qpdrain/soft"
)

var update = flag.Bool("update", false, "rewrite the golden summaries in testdata/")

// softPair opens two soft devices on one fabric, the Manager's (with
// quirks and at most maxQP QPs, 0 for the default) and the peers'.
func softPair(t testing.TB, q soft.Quirks, maxQP int) (rx, peers *soft.Device) {
	t.Helper()
	fab := soft.NewFabric()
	rxDev, err := soft.Open(soft.Config{Fabric: fab, Name: "soft0", Quirks: q, Limits: soft.Limits{MaxQP: maxQP}})
	if err != nil {
		t.Fatal(err)
	}
	devtest.Close(t, rxDev)
	peerDev, err := soft.Open(soft.Config{Fabric: fab, Name: "soft1"})
	if err != nil {
		t.Fatal(err)
	}
	devtest.Close(t, peerDev)
	return rxDev, peerDev
}

// goldenCases are the eHCA thread, reproduced and cured, on the kernel's
// timers: a provider that never completes a send posted in ERROR (IBM
// eHCA), a device that holds 128 RX QPs.
var goldenCases = []struct {
	name   string
	noSRQ  bool
	policy ipoibcm.Policy
	short  bool // stale timers of seconds instead of the kernel's minutes
}{
	{"ehca-srq-kernel", false, ipoibcm.Kernel, false},
	{"ehca-srq-bounded", false, ipoibcm.Bounded, false},
	{"ehca-srq-bounded-short-timers", false, ipoibcm.Bounded, true},
	{"ehca-nonsrq-kernel", true, ipoibcm.Kernel, false},
}

// goldenConfig is the configuration of a golden case.
func goldenConfig(rx, peers ibv.Context, noSRQ bool, p ipoibcm.Policy, short bool) Config {
	mc := ipoibcm.Config{Policy: p, NoSRQ: noSRQ, RecvQueueSize: 16}
	if short {
		mc.UpdateTime, mc.Timeout, mc.Delay = 5*time.Second, 10*time.Second, 15*time.Second
	}
	cfg := Config{Seed: 1, Events: 3000, Device: rx, PeerDevice: peers, Samples: 30, VanishFraction: 0.25, Manager: mc}
	if d, ok := rx.(*soft.Device); ok {
		cfg.DeviceClock = d.Fabric()
	}
	return cfg
}

func TestGolden(t *testing.T) {
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			rx, peers := softPair(t, soft.Quirks{SendInErrorNotFlushed: true}, 128)
			res, err := Run(context.Background(), goldenConfig(rx, peers, tc.noSRQ, tc.policy, tc.short))
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			if err := res.WriteText(&b, 0, false); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", tc.name+".golden")
			if *update {
				if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (go test ./ipoibcm/churn -update writes it)", err)
			}
			if !bytes.Equal(b.Bytes(), want) {
				t.Errorf("summary differs from %s (go test ./ipoibcm/churn -update rewrites it):\n%s", path, b.Bytes())
			}
		})
	}
}

// The same seed gives the same run, samples and all; another seed another.
func TestDeterministic(t *testing.T) {
	run := func(seed uint64) []byte {
		rx, peers := softPair(t, soft.Quirks{}, 0)
		cfg := goldenConfig(rx, peers, false, ipoibcm.Bounded, true)
		cfg.Seed, cfg.Events = seed, 1000
		return runJSON(t, cfg)
	}
	a, b, c := run(7), run(7), run(8)
	if !bytes.Equal(a, b) {
		t.Errorf("seed 7 twice gave two runs:\n%s\n%s", a, b)
	}
	if bytes.Equal(a, c) {
		t.Errorf("seeds 7 and 8 gave the same run")
	}
}

// A simulator slowed down in real time gives the same run: the device
// clock moves only with the simulated one. A soft fabric's clock that also
// jumped once its callers had been idle for a millisecond of real time
// fired peers' retry timers early, and a slow moment changed the send
// errors counted.
func TestDeterministicWhenSlow(t *testing.T) {
	run := func(slow bool) []byte {
		rx, peers := softPair(t, soft.Quirks{SendInErrorNotFlushed: true}, 128)
		cfg := goldenConfig(rx, peers, false, ipoibcm.Bounded, true)
		if slow {
			// Longer than the fabric's quiescence, a hundred times.
			cfg.Progress = func(int, int) { time.Sleep(2 * time.Millisecond) }
		}
		return runJSON(t, cfg)
	}
	if fast, slow := run(false), run(true); !bytes.Equal(fast, slow) {
		t.Errorf("a slow simulator gave another run:\n%s\n%s", fast, slow)
	}
}

// runJSON runs cfg and returns its result as JSON, without the wall time,
// the one field that may differ between two runs of one configuration.
func runJSON(t *testing.T, cfg Config) []byte {
	t.Helper()
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	res.Wall = 0
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestConfigErrors(t *testing.T) {
	rx, _ := softPair(t, soft.Quirks{}, 0)
	for _, c := range []Config{
		{},
		{Device: rx, Events: -1},
		{Device: rx, VanishFraction: 2},
		{Device: rx, ConnectRate: -1},
		{Device: rx, Manager: ipoibcm.Config{RecvQueueSize: -1}},
	} {
		if _, err := Run(context.Background(), c); !errors.Is(err, ibv.ErrInvalidArgument) {
			t.Errorf("Run(%+v): %v, want ErrInvalidArgument", c, err)
		}
	}
}

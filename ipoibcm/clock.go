package ipoibcm

import "github.com/qpdrain/qpdrain/drain"

// Clock is the time every timer of a Manager runs on: the stale task, the
// bounded policy's waits, the device-stop wait and, through
// drain.Options.Clock, its reaper. A Manager never reads time.Now itself.
type Clock = drain.Clock

// RealClock is wall-clock time, for managers on real devices.
type RealClock = drain.RealClock

// VirtualClock is simulated time (see drain.VirtualClock).
type VirtualClock = drain.VirtualClock

// NewVirtualClock returns a clock that reads start.
var NewVirtualClock = drain.NewVirtualClock

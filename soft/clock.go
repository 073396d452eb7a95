package soft

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/qpdrain/qpdrain/clock"
	"github.com/qpdrain/qpdrain/ibv"
)

// quiescence is how long a fabric with timers pending must see only idle
// calls (empty polls, waits) before its virtual clock jumps to the next
// timer: long enough that a caller between two verbs is not overtaken,
// short enough that a waiting test does not notice.
const quiescence = time.Millisecond

// devClock is a fabric's device time: virtual (moved by Advance and by
// jumps when every caller waits) or real. Guarded by fab.mu.
type devClock struct {
	real  bool
	epoch time.Time     // what Now reads at device time 0
	base  time.Time     // real time: device time 0
	virt  time.Duration // virtual time now
	quiet time.Time     // last call that was not idle, while timers are pending
	// noJumps keeps the virtual clock where Advance puts it: a caller that
	// moves it itself must not see it move with real time (SetClockJumps).
	noJumps bool
	// timers are the pending device timers, soonest first.
	timers []devTimer
	firing bool
}

// devTimer wakes a QP's head send: an RNR NAK timer or a transport ack
// timeout. It is void once the QP's epoch changes.
type devTimer struct {
	due   time.Duration
	qp    *QP
	epoch uint32
}

// Now is the fabric's device time: virtual unless SetRealTime(true),
// starting at the wall-clock time the fabric was made. With Sleep it makes
// the fabric a clock.Clock, so a drain.Reaper or an ipoibcm.Manager
// (Options.Clock, Config.Clock) runs on the devices' own time: a stall
// timeout and a retry timer fire in the order their deadlines fall.
func (f *Fabric) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.clk.epoch.Add(f.now())
}

// Sleep lets d pass on the fabric's clock: a virtual clock moves forward
// by d at once (Advance, firing the device timers due on the way); a
// real-time one waits. It returns ctx.Err() when ctx ends first.
func (f *Fabric) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	real := f.clk.real
	f.mu.Unlock()
	if real {
		return clock.Real{}.Sleep(ctx, d)
	}
	return f.Advance(max(d, 0))
}

func (f *Fabric) now() time.Duration {
	if f.clk.real {
		return time.Since(f.clk.base)
	}
	return f.clk.virt
}

// Advance moves the virtual clock forward by d, firing the device timers
// that fall due on the way, in order. It fails with ErrInvalidArgument on a
// negative d and with ErrInvalidState on a real-time fabric.
func (f *Fabric) Advance(d time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case d < 0:
		return fmt.Errorf("advancing the clock by %v: %w", d, ibv.ErrInvalidArgument)
	case f.clk.real:
		return fmt.Errorf("advancing the clock of a real-time fabric: %w", ibv.ErrInvalidState)
	}
	end := f.clk.virt + d
	for len(f.clk.timers) > 0 && f.clk.timers[0].due <= end {
		f.clk.virt = max(f.clk.virt, f.clk.timers[0].due)
		f.fireDue()
	}
	f.clk.virt = end
	return nil
}

// SetClockJumps chooses whether the virtual clock jumps to the next timer
// once only waiting calls happened for a millisecond of real time (on, the
// default). Off, it moves only by Advance: for a caller that moves it
// itself (a simulation on its own virtual clock), whose run must not depend
// on how much real time passes between its calls, since a jump taken while
// it was merely slow fires device timers before their simulated time. A
// waiter then waits for what another call or an Advance brings. A
// real-time fabric is not affected.
func (f *Fabric) SetClockJumps(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.clk.noJumps = !on
}

// SetRealTime makes the fabric's clock follow real time (on), for demos,
// or a virtual clock again (off), which starts where real time was.
func (f *Fabric) SetRealTime(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if on == f.clk.real {
		return
	}
	now := f.now()
	f.clk.real = on
	f.clk.base = time.Now().Add(-now)
	f.clk.virt = now
	f.fireDue()
}

// startTimer arms a timer that drives q's head send again after d.
func (f *Fabric) startTimer(q *QP, d time.Duration) {
	t := devTimer{due: f.now() + d, qp: q, epoch: q.epoch}
	i, _ := slices.BinarySearchFunc(f.clk.timers, t.due, func(a devTimer, due time.Duration) int {
		if a.due <= due {
			return -1
		}
		return 1
	})
	f.clk.timers = slices.Insert(f.clk.timers, i, t)
	if !f.clk.firing {
		f.clk.quiet = time.Now()
	}
}

// fireDue fires the timers due by now: each wakes its QP's head send,
// which retries (auto-progress) or waits for Progress.
func (f *Fabric) fireDue() {
	now := f.now()
	f.clk.firing = true
	for len(f.clk.timers) > 0 && f.clk.timers[0].due <= now {
		t := f.clk.timers[0]
		f.clk.timers = slices.Delete(f.clk.timers, 0, 1)
		q := t.qp
		if q.closed || q.epoch != t.epoch || !q.timerWait {
			continue
		}
		q.timerWait, q.timerDue = false, true
		if !f.manual {
			q.drive()
		}
	}
	f.clk.firing = false
}

// busy records a call that is not idle while timers are pending, and fires
// the timers real time has made due.
func (f *Fabric) busy() {
	if len(f.clk.timers) > 0 {
		f.clk.quiet = time.Now()
		if f.clk.real {
			f.fireDue()
		}
	}
}

// jumpClock is the idle caller's part of the clock: when nothing but idle
// calls happened for the quiescence period, every caller is waiting, so the
// virtual clock jumps to the next timer and fires it. It reports whether a
// timer fired.
func (f *Fabric) jumpClock() bool {
	if len(f.clk.timers) == 0 {
		return false
	}
	if f.clk.real {
		n := len(f.clk.timers)
		f.fireDue()
		return len(f.clk.timers) != n
	}
	if f.clk.noJumps || time.Since(f.clk.quiet) < quiescence {
		return false
	}
	f.clk.virt = max(f.clk.virt, f.clk.timers[0].due)
	f.fireDue()
	return true
}

// idle runs what a caller that found nothing lets happen: the deferred
// work of adversarial devices, then timers, until done or nothing is left.
func (f *Fabric) idle(done func() bool) {
	for !done() {
		if len(f.adv) > 0 {
			f.idleSteps(done)
			if done() {
				return
			}
		}
		if !f.jumpClock() {
			return
		}
	}
}

// idleWait is how long a waiter sleeps before it looks again at a fabric
// with timers pending, or 0 when only a wake-up can help.
func (f *Fabric) idleWait() time.Duration {
	if len(f.clk.timers) == 0 {
		return 0
	}
	if f.clk.real {
		return max(f.clk.timers[0].due-f.now(), time.Microsecond)
	}
	if f.clk.noJumps {
		return 0
	}
	return quiescence
}

// rnrTimerUS is the RNR NAK timer, in µs, that each min_rnr_timer value
// encodes (IBTA vol. 1 Table 45; enum ib_rnr_timeout in
// include/rdma/ib_verbs.h).
var rnrTimerUS = [32]float64{655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
	2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520}

// rnrDelay is the RNR NAK timer of a responder's min_rnr_timer.
func rnrDelay(code uint8) time.Duration {
	return time.Duration(rnrTimerUS[code&31] * float64(time.Microsecond))
}

// ackTimeout is the local ACK timeout a QP's timeout attribute encodes:
// 4.096 µs * 2^timeout (ibv_modify_qp(3)); 0 means wait forever.
func ackTimeout(code uint8) (time.Duration, bool) {
	if code == 0 {
		return 0, false
	}
	return time.Duration(4096 * (uint64(1) << (code & 31))), true
}

package flushcheck

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
)

// A verbs call stuck in the kernel cannot be cancelled (rxe on Linux 5.10
// blocked ibv_destroy_qp, and soft-locked a CPU in ibv_modify_qp, for good),
// so a probe runs in a goroutine of its own and records each verbs call
// before it makes it; Probe.Run waits for the probe and gives up on it once
// a call has not returned within Options.CallTimeout.

// callRecord is the verbs call a probe is in, shared between the probe's
// goroutine and the one waiting for it.
type callRecord struct {
	mu    sync.Mutex
	what  string    // the call in progress; "" between calls
	since time.Time // when it was made
	last  string    // the last call made
}

func (c *callRecord) enter(what string) {
	c.mu.Lock()
	c.what, c.since, c.last = what, time.Now(), what
	c.mu.Unlock()
}

func (c *callRecord) leave() {
	c.mu.Lock()
	c.what = ""
	c.mu.Unlock()
}

// now returns the call in progress ("" for none) and how long it has been
// in it, and the last call made.
func (c *callRecord) now() (what string, in time.Duration, last string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.what != "" {
		in = time.Since(c.since)
	}
	return c.what, in, c.last
}

// verb makes one verbs call, f, recorded as what ("ibv_modify_qp on QP 17
// to RESET"), so that a call that does not return is reported by name.
func (e *env) verb(what string, f func() error) error {
	e.calls.enter(what)
	defer e.calls.leave()
	return f()
}

// probeEnd is what a probe's goroutine returns.
type probeEnd struct {
	v   verdict
	err error
}

// watchEvery is how often await looks at the call in progress: often
// enough that the check gives up within a twentieth of the call timeout
// after it, a quarter of a second at the most.
func watchEvery(limit time.Duration) time.Duration {
	return max(min(limit/20, 250*time.Millisecond), time.Millisecond)
}

// await waits for the probe to end and returns what it concluded, or an
// error wrapping ErrHung once a verbs call it recorded has not returned
// within CallTimeout, or the probe has not ended CallTimeout after its
// context did (it is blocked where it records no call: its waits all end
// with the context).
func (e *env) await(ended <-chan probeEnd) (probeEnd, error) {
	limit := e.o.CallTimeout
	tick := time.NewTicker(watchEvery(limit))
	defer tick.Stop()
	var ctxEnded time.Time
	for {
		select {
		case end := <-ended:
			return end, nil
		case <-tick.C:
		}
		what, in, last := e.calls.now()
		if what != "" && in >= limit {
			return probeEnd{}, fmt.Errorf("%s %w within %v (blocked for %v)", what, ErrHung, limit, roundDur(in))
		}
		switch {
		case e.ctx.Err() == nil:
		case ctxEnded.IsZero():
			ctxEnded = time.Now()
		case time.Since(ctxEnded) >= limit:
			if last == "" {
				last = "none"
			}
			return probeEnd{}, fmt.Errorf("the probe %w within %v of its end (%v), blocked outside the verbs calls it records (the last: %s)",
				ErrHung, limit, context.Cause(e.ctx), last)
		}
	}
}

// owned is an object of the probe that env.close destroys through the
// verbs call what.
type owned struct {
	e    *env
	what string
	obj  io.Closer
}

func (o owned) Close() error {
	if err := o.e.verb(o.what, o.obj.Close); err != nil {
		return fmt.Errorf("%s: %w", o.what, err)
	}
	return nil
}

// own records obj, destroyed by close through the verbs call what.
func (e *env) own(what string, obj io.Closer) { e.objs.Add(owned{e, what, obj}) }

// destroy destroys obj through the verbs call what now, and returns how
// long the call took.
func (e *env) destroy(what string, obj io.Closer) (time.Duration, error) {
	start := time.Now()
	if err := e.verb(what, obj.Close); err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	return roundDur(time.Since(start)), nil
}

func (e *env) modify(qp ibv.QP, attr ibv.QPAttr, mask ibv.QPAttrMask) error {
	return e.verb(fmt.Sprintf("ibv_modify_qp on QP %d to %s", qp.Num(), attr.State), func() error { return qp.Modify(attr, mask) })
}

func (e *env) postSend(qp ibv.QP, wrs []ibv.SendWR) error {
	return e.verb(fmt.Sprintf("ibv_post_send on QP %d", qp.Num()), func() error { return qp.PostSend(wrs) })
}

func (e *env) postRecv(qp ibv.QP, wrs []ibv.RecvWR) error {
	return e.verb(fmt.Sprintf("ibv_post_recv on QP %d", qp.Num()), func() error { return qp.PostRecv(wrs) })
}

func (e *env) postSRQRecv(srq ibv.SRQ, wrs []ibv.RecvWR) error {
	return e.verb("ibv_post_srq_recv", func() error { return srq.PostRecv(wrs) })
}

func (e *env) query(qp ibv.QP, mask ibv.QPAttrMask) (attr ibv.QPAttr, err error) {
	err = e.verb(fmt.Sprintf("ibv_query_qp on QP %d", qp.Num()), func() error {
		attr, _, err = qp.Query(mask)
		return err
	})
	return attr, err
}

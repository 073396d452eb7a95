package churn

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/qpdrain/qpdrain/clock"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/ipoibcm"
	"github.com/qpdrain/qpdrain/rcsetup"
	"github.com/qpdrain/qpdrain/teardown"
)

// Defaults of Config.
const (
	DefaultEvents      = 10000
	DefaultConnectRate = 1.0 // per second
	DefaultSendRate    = 0.1 // per second and connection
	DefaultLifetime    = time.Minute
	// DefaultVanishFraction is the CLI's default; zero in Config means no peer vanishes.
	DefaultVanishFraction = 0.25
	DefaultSamples        = 100
	// MaxEvents bounds Config.Events: ten million events are hours of
	// wall time.
	MaxEvents = 10_000_000
)

// Config is one simulation.
type Config struct {
	// Seed drives every choice of the schedule.
	Seed uint64
	// Events is how many churn events to run (default DefaultEvents).
	Events int
	// Device is where the Manager runs. Required.
	Device ibv.Context
	// PeerDevice is where the peers' QPs live; nil puts them on Device,
	// connected in loopback. Two devices must reach each other by LID (two
	// soft devices on one fabric).
	PeerDevice ibv.Context
	// Manager is the Manager's configuration; Run sets its Context, PD and
	// Clock, and sees the Trace before a Trace given here.
	Manager ipoibcm.Config
	// ConnectRate is connection requests per second, SendRate messages
	// per second per connection, Lifetime the mean connection lifetime,
	// VanishFraction the share of connections whose peer vanishes.
	ConnectRate, SendRate float64
	Lifetime              time.Duration
	VanishFraction        float64
	// Samples is how many times the lists are sampled over the run
	// (default DefaultSamples), evenly by event count.
	Samples int
	// Settle is how long, after the last event, the Manager runs its timers
	// with no new event before the end state is taken (default: Timeout +
	// Delay + both drain timeouts + 1 s, so every vanished peer has been
	// collected and every bounded wait has ended).
	Settle time.Duration
	// RealTime runs the schedule on the real clock instead of a virtual
	// one, for real devices: events happen at their times.
	RealTime bool
	// DeviceClock, when set, is the run's clock: the devices' own (a
	// soft.Fabric), so their retry and RNR timers fire at the simulated
	// times the Manager's timers do; nil gives the run a clock.Virtual of
	// its own. Ignored with RealTime.
	DeviceClock DeviceClock
	// Progress, if set, is called with the events done so far, about a
	// hundred times in a run.
	Progress func(done, total int)
}

func (c Config) withDefaults() (Config, error) {
	if c.Device == nil {
		return c, fmt.Errorf("simulating churn: no device: %w", ibv.ErrInvalidArgument)
	}
	if c.PeerDevice == nil {
		c.PeerDevice = c.Device
	}
	if c.Events == 0 {
		c.Events = DefaultEvents
	}
	if c.ConnectRate == 0 {
		c.ConnectRate = DefaultConnectRate
	}
	if c.SendRate == 0 {
		c.SendRate = DefaultSendRate
	}
	if c.Lifetime == 0 {
		c.Lifetime = DefaultLifetime
	}
	if c.Samples == 0 {
		c.Samples = DefaultSamples
	}
	bad := func(what string, v any) (Config, error) {
		return c, fmt.Errorf("simulating churn: %s %v: %w", what, v, ibv.ErrInvalidArgument)
	}
	switch {
	case c.Events < 1 || c.Events > MaxEvents:
		return bad("events (want 1 to 10,000,000)", c.Events)
	case c.ConnectRate < 0 || math.IsInf(c.ConnectRate, 0) || math.IsNaN(c.ConnectRate):
		return bad("connect rate", c.ConnectRate)
	case c.SendRate < 0 || math.IsInf(c.SendRate, 0) || math.IsNaN(c.SendRate):
		return bad("send rate", c.SendRate)
	case c.Lifetime < 0:
		return bad("lifetime", c.Lifetime)
	case c.VanishFraction < 0 || c.VanishFraction > 1 || math.IsNaN(c.VanishFraction):
		return bad("vanish fraction (want 0 to 1)", c.VanishFraction)
	case c.Samples < 1:
		return bad("samples", c.Samples)
	case c.Settle < 0:
		return bad("settle", c.Settle)
	}
	return c, nil
}

// DeviceClock is the devices' own simulated clock (a soft.Fabric).
type DeviceClock interface {
	// Now and Sleep are the clock; Sleep moves it forward at once,
	// firing the device timers due on the way.
	clock.Clock
	// SetClockJumps(false) makes it move only when moved. Run turns the
	// jumps off for the run and on again after it: a clock that also moved
	// on its own, when the simulator was slow between two calls, would fire
	// timers before their simulated time, and the run would depend on the
	// real time it took.
	SetClockJumps(on bool)
}

// epoch is where the run's own virtual clock starts; results give times
// since the run's start.
var epoch = time.Date(2008, 4, 1, 0, 0, 0, 0, time.UTC)

// kind is what an item of the schedule does.
type kind uint8

const (
	kindArrive kind = iota
	kindSend
	kindEnd
)

type item struct {
	at   time.Time
	seq  int // ties keep the order of scheduling
	kind kind
	p    *peer
}

type schedule []*item

func (s schedule) Len() int { return len(s) }
func (s schedule) Less(i, j int) bool {
	if !s[i].at.Equal(s[j].at) {
		return s[i].at.Before(s[j].at)
	}
	return s[i].seq < s[j].seq
}
func (s schedule) Swap(i, j int) { s[i], s[j] = s[j], s[i] }
func (s *schedule) Push(x any)   { *s = append(*s, x.(*item)) }
func (s *schedule) Pop() any {
	old := *s
	it := old[len(old)-1]
	*s = old[:len(old)-1]
	return it
}

// peer is the remote side of one connection.
type peer struct {
	qp       ibv.QP
	conn     *ipoibcm.Conn
	vanish   bool
	gone     bool
	inFlight int // sends posted, completion not polled
}

// peerSendDepth is each peer QP's send queue.
const peerSendDepth = 4

// sim is one run.
type sim struct {
	cfg     Config
	rng     *rand.Rand
	clock   clock.Clock
	virtual bool // clock is simulated: the run moves it
	m       *ipoibcm.Manager
	objs    teardown.List
	peerPD  ibv.PD
	peerCQ  ibv.CQ
	peerMR  ibv.MR
	peerBuf []byte
	toPeer  rcsetup.Route // the Manager's QPs to the peers
	toRX    rcsetup.Route // the peers to the Manager's QPs
	sched   schedule
	seq     int
	peers   map[uint32]*peer // by peer QP number
	live    []*peer
	res     *Result
	vanish  map[uint32]time.Time // RX QP number -> when its peer vanished
	forced  map[uint32]struct{}  // RX QPs destroyed unproven by the stop
	stale   []time.Duration
	reaped  []time.Duration
	start   time.Time
	wcs     []ibv.WC
}

// Run runs one simulation. ctx bounds it; when ctx ends, the run stops at
// the next event and the error wraps ctx's.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &sim{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x1b873593)), peers: make(map[uint32]*peer),
		vanish: make(map[uint32]time.Time), forced: make(map[uint32]struct{}), wcs: make([]ibv.WC, 64)}
	switch c := cfg.DeviceClock; {
	case cfg.RealTime:
		s.clock = clock.Real{}
	case c != nil:
		s.clock, s.virtual = c, true
		c.SetClockJumps(false)
		defer c.SetClockJumps(true)
	default:
		s.clock, s.virtual = clock.NewVirtual(epoch), true
	}
	s.res = newResult(cfg)
	wall := time.Now()
	err = s.run(ctx)
	err = errors.Join(err, s.close(ctx))
	s.res.Wall = time.Since(wall)
	s.res.finish(s.stale, s.reaped)
	if err != nil {
		return s.res, err
	}
	return s.res, nil
}

func (s *sim) run(ctx context.Context) error {
	if err := s.open(); err != nil {
		return err
	}
	s.start = s.clock.Now()
	s.push(s.after(s.cfg.ConnectRate), kindArrive, nil)
	every := max(1, s.cfg.Events/s.cfg.Samples)
	progressEvery := max(1, s.cfg.Events/100)
	for s.res.Events.Total() < s.cfg.Events {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("after %d events: %w", s.res.Events.Total(), err)
		}
		it := heap.Pop(&s.sched).(*item)
		if err := s.timersUntil(ctx, it.at); err != nil {
			return err
		}
		before := s.res.Events.Total()
		if err := s.do(it); err != nil {
			return err
		}
		if err := s.m.Service(); err != nil {
			return err
		}
		if n := s.res.Events.Total(); n != before {
			s.res.PeakQPs = max(s.res.PeakQPs, s.m.QPs())
			if n%every == 0 {
				s.sample()
			}
			if s.cfg.Progress != nil && n%progressEvery == 0 {
				s.cfg.Progress(n, s.cfg.Events)
			}
		}
	}
	// The churn ends: every peer still connected ends as it would have,
	// with a DREQ or by vanishing.
	for len(s.live) > 0 {
		if err := s.end(s.live[0], false); err != nil {
			return err
		}
		if err := s.m.Service(); err != nil {
			return err
		}
	}
	settle := s.cfg.Settle
	if settle == 0 {
		mc := s.m.Config()
		settle = mc.Timeout + mc.Delay + mc.Drain.LastWQETimeout + mc.Drain.DrainTimeout + time.Second
	}
	// Sampled in steps, so that the lists draining show over time.
	const settleSteps = 10
	end := s.clock.Now().Add(settle)
	for i := 1; i <= settleSteps; i++ {
		if err := s.timersUntil(ctx, end.Add(-settle*time.Duration(settleSteps-i)/settleSteps)); err != nil {
			return err
		}
		if err := s.m.Service(); err != nil {
			return err
		}
		s.sample()
	}
	s.res.end()
	return nil
}

// timersUntil runs the Manager's timers due before t, then moves the clock
// to t (virtual) or waits until t (real).
func (s *sim) timersUntil(ctx context.Context, t time.Time) error {
	spins := 0
	for {
		d := s.m.NextDeadline()
		if d.IsZero() || !d.Before(t) {
			break
		}
		if !d.After(s.clock.Now()) {
			if spins++; spins > 1000 {
				return fmt.Errorf("the manager's timer at %v does not move on", d.Sub(s.start))
			}
		} else {
			spins = 0
		}
		if err := s.waitUntil(ctx, d); err != nil {
			return err
		}
		if err := s.m.Service(); err != nil {
			return err
		}
		s.pollPeers()
	}
	if err := s.waitUntil(ctx, t); err != nil {
		return err
	}
	return nil
}

func (s *sim) waitUntil(ctx context.Context, t time.Time) error {
	if s.virtual {
		d := t.Sub(s.clock.Now())
		if d <= 0 {
			return nil
		}
		if err := s.clock.Sleep(ctx, d); err != nil {
			return fmt.Errorf("advancing the clock: %w", err)
		}
		return nil
	}
	// On a real device, service while waiting: completions and events
	// arrive on their own.
	for {
		now := s.clock.Now()
		if !now.Before(t) {
			return nil
		}
		if err := s.clock.Sleep(ctx, min(t.Sub(now), time.Millisecond)); err != nil {
			return fmt.Errorf("waiting for the next event: %w", err)
		}
		if err := s.m.Service(); err != nil {
			return err
		}
		s.pollPeers()
	}
}

// after returns a time an exponentially distributed interval of the given
// rate (per second) from now.
func (s *sim) after(rate float64) time.Time {
	return s.clock.Now().Add(time.Duration(s.rng.ExpFloat64() / rate * float64(time.Second)))
}

func (s *sim) push(at time.Time, k kind, p *peer) {
	s.seq++
	heap.Push(&s.sched, &item{at: at, seq: s.seq, kind: k, p: p})
}

func (s *sim) do(it *item) error {
	switch it.kind {
	case kindArrive:
		if s.cfg.ConnectRate > 0 {
			s.push(s.after(s.cfg.ConnectRate), kindArrive, nil)
		}
		return s.arrive()
	case kindSend:
		if it.p.gone {
			return nil
		}
		s.push(s.after(s.cfg.SendRate), kindSend, it.p)
		return s.send(it.p)
	case kindEnd:
		return s.end(it.p, true)
	}
	return nil
}

func (s *sim) arrive() error {
	s.res.Events.Connects++
	qp, err := s.peerPD.CreateQP(ibv.QPInitAttr{SendCQ: s.peerCQ, RecvCQ: s.peerCQ, Type: ibv.QPTRC, SigAll: true,
		Cap: ibv.QPCap{MaxSendWR: peerSendDepth, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return fmt.Errorf("creating a peer QP: %w", err)
	}
	c, err := s.m.Accept(qp.Num(), s.toPeer)
	var rej *ipoibcm.RejectError
	if errors.As(err, &rej) {
		s.res.reject(rej.Reason, s.clock.Now().Sub(s.start))
		if err := qp.Close(); err != nil {
			return fmt.Errorf("closing a rejected peer's QP: %w", err)
		}
		return nil
	}
	if err != nil {
		return errors.Join(err, qp.Close())
	}
	s.res.Accepted++
	if err := s.toRX.Bring(qp, c.QPNum(), ibv.QPSRTS); err != nil {
		return errors.Join(err, qp.Close())
	}
	p := &peer{qp: qp, conn: c, vanish: s.rng.Float64() < s.cfg.VanishFraction}
	s.peers[qp.Num()] = p
	s.live = append(s.live, p)
	lifetime := time.Duration(s.rng.ExpFloat64() * float64(s.cfg.Lifetime))
	s.push(s.clock.Now().Add(lifetime), kindEnd, p)
	if s.cfg.SendRate > 0 {
		s.push(s.after(s.cfg.SendRate), kindSend, p)
	}
	return nil
}

func (s *sim) send(p *peer) error {
	s.res.Events.Sends++
	s.pollPeers()
	if p.inFlight >= peerSendDepth {
		s.res.SendsDropped++
		return nil
	}
	wr := ibv.SendWR{ID: uint64(p.qp.Num()), Opcode: ibv.WRSend, Flags: ibv.SendSignaled,
		SGL: []ibv.SGE{{Addr: s.peerMR.Addr(), Length: 64, LKey: s.peerMR.LKey()}}}
	if err := p.qp.PostSend([]ibv.SendWR{wr}); err != nil {
		return fmt.Errorf("posting a peer's send: %w", err)
	}
	p.inFlight++
	s.pollPeers()
	return nil
}

// pollPeers takes the peers' send completions.
func (s *sim) pollPeers() {
	for {
		n, err := s.peerCQ.Poll(s.wcs)
		if err != nil || n == 0 {
			return
		}
		for _, wc := range s.wcs[:n] {
			if p := s.peers[uint32(wc.ID)]; p != nil {
				p.inFlight--
				if wc.Status != ibv.WCSuccess && wc.Status != ibv.WCWRFlushErr {
					s.res.SendErrors++
				}
			}
		}
	}
}

// end ends p's connection; count says it is one of the run's events.
func (s *sim) end(p *peer, count bool) error {
	now := s.clock.Now()
	if p.vanish {
		if count {
			s.res.Events.Vanishes++
		} else {
			s.res.VanishedAtEnd++
		}
		s.vanish[p.conn.QPNum()] = now
	} else {
		if count {
			s.res.Events.Disconnects++
		}
		if p.conn.List() != ipoibcm.ListNone {
			if err := s.m.Disconnect(p.conn); err != nil {
				return err
			}
		}
	}
	return s.closePeer(p)
}

func (s *sim) closePeer(p *peer) error {
	p.gone = true
	s.pollPeers()
	delete(s.peers, p.qp.Num())
	if i := slices.Index(s.live, p); i >= 0 {
		s.live = slices.Delete(s.live, i, i+1)
	}
	if err := p.qp.Close(); err != nil {
		return fmt.Errorf("closing a peer's QP: %w", err)
	}
	return nil
}

// trace follows the Manager's transitions for the timings.
func (s *sim) trace(e ipoibcm.Event) {
	switch e.Kind {
	case ipoibcm.EventStale:
		if at, ok := s.vanish[e.QPNum]; ok {
			s.stale = append(s.stale, e.At.Sub(at))
			delete(s.vanish, e.QPNum)
		}
	case ipoibcm.EventForced:
		s.forced[e.QPNum] = struct{}{}
	case ipoibcm.EventReaped:
		if _, ok := s.forced[e.QPNum]; !ok {
			s.reaped = append(s.reaped, e.Since)
		}
	}
}

func (s *sim) sample() {
	n := s.m.Counts()
	st := s.m.Stats()
	s.res.Samples = append(s.res.Samples, Sample{
		At: s.clock.Now().Sub(s.start), Events: s.res.Events.Total(),
		Passive: n[ipoibcm.ListPassive], Error: n[ipoibcm.ListError], Flush: n[ipoibcm.ListFlush],
		Drain: n[ipoibcm.ListDrain], Reap: n[ipoibcm.ListReap], Quarantine: n[ipoibcm.ListQuarantine],
		QPs: s.m.QPs(), Accepted: s.res.Accepted, Rejected: st.RejectNoQP + st.RejectOther,
	})
}

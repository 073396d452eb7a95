package ipoibcm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/qpdrain/qpdrain/clock"
	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/ilist"
	"github.com/qpdrain/qpdrain/rcsetup"
	"github.com/qpdrain/qpdrain/teardown"
)

// recvTag marks the wr_id of every receive the Manager posts (IPOIB_OP_RECV);
// the low 32 bits are the ring index.
const recvTag uint64 = 1 << 40

// bufSize is the bytes of each receive buffer. The model carries no
// payload it reads, so every receive of every connection points into one
// registered ring of RecvQueueSize buffers.
const bufSize = 256

// Conn is one passive (receive-side) connection: struct ipoib_cm_rx.
type Conn struct {
	m          *Manager
	qp         ibv.QP
	qpn        uint32
	peer       uint32
	state      State
	list       ListID
	links      ilist.Links[Conn]
	stamp      time.Time // p->jiffies: last activity, refreshed at most every UpdateTime
	errAt      time.Time // when the QP was moved to ERROR
	recvCount  int       // without an SRQ: receives posted and not yet completed
	lastWQE    bool
	deadline   time.Time     // Bounded: end of the wait for Last WQE Reached on rx_error_list
	handle     *drain.Handle // Bounded: the reaper's handle
	nonSRQSlot bool          // counted in nonsrq_conn_qp
}

// QPNum is the connection's QP number.
func (c *Conn) QPNum() uint32 { return c.qpn }

// PeerQPNum is the remote QP number the connection was accepted for.
func (c *Conn) PeerQPNum() uint32 { return c.peer }

// State returns the connection's state.
func (c *Conn) State() State {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.state
}

// List returns the list the connection is on (ListNone once reaped).
func (c *Conn) List() ListID {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.list
}

// Stats count what a Manager did.
type Stats struct {
	Accepted        int // connections accepted
	RejectNoQP      int // rejected with RejNoQP (non-SRQ limit)
	RejectOther     int // rejected with RejConsumerDefined (a verb failed, e.g. no QP left)
	Disconnects     int // DREQ/REJ received
	Stale           int // moved to ERROR by the stale task
	Receives        int // receives completed successfully (messages from peers)
	DrainWRs        int // drain WRs posted (Kernel) or by the reaper (Bounded)
	DrainPostFailed int // Kernel: drain WR post failures (ipoib_warn "failed to post drain wr")
	Reaped          int // QPs destroyed after their drain or flush
	Quarantined     int // Bounded: stalled drains kept
	// GivenUp counts QPs the Bounded policy destroyed without a proof
	// after their drain stalled, the CQ found empty
	// (drain.DestroyedAfterEmptyCQ).
	GivenUp int
	Forced  int // QPs Stop destroyed without proof after StopTimeout
	// LateWCs counts completions for QPs the Manager had already
	// destroyed: each would be a QP declared finished too early.
	LateWCs int
	// MaxQPs is the most QPs the Manager held at once.
	MaxQPs int
}

// Manager is the receive side of IPoIB connected mode on one device: it
// accepts connections, keeps their QPs on ipoib_cm.c's lists, collects stale
// ones, drains and destroys closed ones, on one CQ shared by every QP (as
// both send and receive CQ, "for drain WR") and, unless Config.NoSRQ, one
// SRQ. It starts no goroutine: the caller calls Service when completions
// or events may have arrived and when NextDeadline is due. All methods are
// safe for concurrent use.
type Manager struct {
	cfg   Config
	clock clock.Clock

	mu     sync.Mutex
	objs   teardown.List // CQ, SRQ, MR
	cq     ibv.CQ
	srq    ibv.SRQ
	mr     ibv.MR
	buf    []byte
	reaper *drain.Reaper
	// headroom is the Bounded reaper's drain WRs outstanding at most.
	headroom int
	conns    map[uint32]*Conn
	// dead holds the numbers of the last deadMax QPs destroyed, in deadRing,
	// to count late completions.
	dead     map[uint32]struct{}
	deadRing []uint32
	deadNext int
	lists    [NumLists]ilist.List[Conn]
	nonSRQ   int       // nonsrq_conn_qp
	staleAt  time.Time // the stale task's next run; zero when not queued
	stats    Stats
	wcs      []ibv.WC
	stopped  bool
}

// New creates the Manager's CQ, its SRQ (unless cfg.NoSRQ) filled with
// cfg.RecvQueueSize receives, and the receive buffer.
func New(cfg Config) (*Manager, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, clock: cfg.Clock, conns: make(map[uint32]*Conn), dead: make(map[uint32]struct{})}
	if err := m.open(); err != nil {
		return nil, errors.Join(err, m.objs.Close(), m.freeBuf())
	}
	return m, nil
}

func (m *Manager) open() error {
	cfg := m.cfg
	var err error
	if m.cq, err = cfg.Context.CreateCQ(cfg.CQEntries(), nil); err != nil {
		return fmt.Errorf("creating the receive CQ (%d entries): %w", cfg.CQEntries(), err)
	}
	m.objs.Add(m.cq)
	if m.buf, err = ibv.AllocBuffer(cfg.RecvQueueSize * bufSize); err != nil {
		return fmt.Errorf("allocating the receive ring: %w", err)
	}
	if m.mr, err = cfg.PD.RegMR(m.buf, ibv.AccessLocalWrite); err != nil {
		return fmt.Errorf("registering the receive ring: %w", err)
	}
	m.objs.Add(m.mr)
	m.wcs = make([]ibv.WC, 64)
	if cfg.Policy == Bounded {
		opts := m.reaperOptions()
		m.headroom = opts.Headroom
		if m.reaper, err = drain.NewReaper(m.cq, opts); err != nil {
			return err
		}
	}
	if cfg.NoSRQ {
		return nil
	}
	if m.srq, err = cfg.PD.CreateSRQ(ibv.SRQAttr{MaxWR: uint32(cfg.RecvQueueSize), MaxSGE: 1}); err != nil {
		return fmt.Errorf("creating the SRQ (%d WRs): %w", cfg.RecvQueueSize, err)
	}
	m.objs.Add(m.srq)
	wrs := make([]ibv.RecvWR, cfg.RecvQueueSize)
	for i := range wrs {
		wrs[i] = m.recvWR(i)
	}
	if err := m.srq.PostRecv(wrs); err != nil {
		return fmt.Errorf("filling the SRQ: %w", err)
	}
	return nil
}

func (m *Manager) freeBuf() error {
	if m.buf == nil {
		return nil
	}
	b := m.buf
	m.buf = nil
	return ibv.FreeBuffer(b)
}

// recvWR is the receive of ring slot i.
func (m *Manager) recvWR(i int) ibv.RecvWR {
	return ibv.RecvWR{ID: recvTag | uint64(i), SGL: []ibv.SGE{{Addr: m.mr.Addr() + uint64(i*bufSize), Length: bufSize, LKey: m.mr.LKey()}}}
}

// CQ is the shared CQ every connection's QP completes into.
func (m *Manager) CQ() ibv.CQ { return m.cq }

// Config returns the configuration in force, defaults filled in.
func (m *Manager) Config() Config { return m.cfg }

// emit hands an event to the trace; m.mu is held.
func (m *Manager) emit(c *Conn, k EventKind, now time.Time) {
	if m.cfg.Trace == nil {
		return
	}
	ev := Event{At: now, Kind: k}
	if c != nil {
		ev.QPNum, ev.List, ev.State = c.qpn, c.list, c.state
		if k == EventReaped && !c.errAt.IsZero() {
			ev.Since = now.Sub(c.errAt)
		}
	}
	m.cfg.Trace(ev)
}

// warn logs msg at warning level, where ipoib_cm.c calls ipoib_warn: with
// c's QP number as rdma(8) names it (c nil: about no QP), attrs, and err
// unless nil.
func (m *Manager) warn(c *Conn, msg string, err error, attrs ...slog.Attr) {
	l := m.cfg.Log
	if l == nil || !l.Enabled(context.Background(), slog.LevelWarn) {
		return
	}
	all := make([]slog.Attr, 0, len(attrs)+2)
	if c != nil {
		all = append(all, slog.Uint64("lqpn", uint64(c.qpn)))
	}
	all = append(all, attrs...)
	if err != nil {
		all = append(all, slog.Any("error", err))
	}
	l.LogAttrs(context.Background(), slog.LevelWarn, msg, all...)
}

// move puts c at the head (front true) or tail of list l (list_move /
// list_move_tail).
func (m *Manager) move(c *Conn, l ListID, front bool) {
	if c.list != ListNone {
		m.lists[c.list].Remove(&c.links)
	}
	c.list = l
	if l == ListNone {
		return
	}
	if front {
		m.lists[l].PushFront(c, &c.links)
	} else {
		m.lists[l].PushBack(c, &c.links)
	}
}

// toError moves c's QP to ERROR (ib_modify_qp with ipoib_cm_err_attr),
// warning on failure as ipoib_cm.c does.
func (m *Manager) toError(c *Conn, now time.Time) {
	if c.errAt.IsZero() {
		c.errAt = now
	}
	if err := c.qp.Modify(ibv.QPAttr{State: ibv.QPSErr}, ibv.QPAttrState); err != nil {
		m.warn(c, "unable to move qp to error state", err)
	}
}

// Accept handles a REQ from the remote QP peer reachable over route
// (ipoib_cm_req_handler): it creates an RC QP on the shared CQ and SRQ (or
// with its own receive ring), takes it RESET -> INIT -> RTR -> RTS, and
// puts the connection at the head of passive_ids. Without an SRQ, past
// MaxNonSRQConn connections it rejects with RejNoQP; when a verb fails it
// rejects with RejConsumerDefined. A rejection is a *RejectError
// (errors.Is(err, ErrRejected)).
func (m *Manager) Accept(peer uint32, route rcsetup.Route) (*Conn, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return nil, fmt.Errorf("accepting a connection from qpn %d: %w", peer, ErrStopped)
	}
	now := m.clock.Now()
	reject := func(r RejectReason, err error) (*Conn, error) {
		if r == RejNoQP {
			m.stats.RejectNoQP++
		} else {
			m.stats.RejectOther++
		}
		if m.cfg.Trace != nil {
			m.cfg.Trace(Event{At: now, Kind: EventRejected, Reason: r})
		}
		return nil, &RejectError{Reason: r, Err: err}
	}
	attr := ibv.QPInitAttr{SendCQ: m.cq, RecvCQ: m.cq, SRQ: m.srq, Type: ibv.QPTRC, SigAll: true,
		Cap: ibv.QPCap{MaxSendWR: 1, MaxSendSGE: 1}} // max_send_wr 1: for the drain WR
	if m.srq == nil {
		attr.Cap.MaxRecvWR, attr.Cap.MaxRecvSGE = uint32(m.cfg.RecvQueueSize), 1
	}
	if m.reaper != nil {
		attr.Cap.MaxSendWR = uint32(m.headroom)
	}
	qp, err := m.cfg.PD.CreateQP(attr)
	if err != nil {
		return reject(RejConsumerDefined, fmt.Errorf("creating the RX QP: %w", err))
	}
	// Some Mellanox firmware completes drain WRs with error only if the QP
	// was in RTS first, so the receive-only QP goes to RTS too.
	if err := route.Bring(qp, peer, ibv.QPSRTS); err != nil {
		return reject(RejConsumerDefined, errors.Join(err, qp.Close()))
	}
	c := &Conn{m: m, qp: qp, qpn: qp.Num(), peer: peer, state: StateLive, stamp: now}
	if m.srq == nil {
		if m.nonSRQ >= m.cfg.MaxNonSRQConn {
			return reject(RejNoQP, qp.Close())
		}
		m.nonSRQ++
		c.nonSRQSlot = true
		wrs := make([]ibv.RecvWR, m.cfg.RecvQueueSize)
		for i := range wrs {
			wrs[i] = m.recvWR(i)
		}
		if err := qp.PostRecv(wrs); err != nil {
			m.nonSRQ--
			return reject(RejConsumerDefined, errors.Join(fmt.Errorf("posting the receive ring: %w", err), qp.Close()))
		}
		c.recvCount = len(wrs)
	}
	m.conns[c.qpn] = c
	delete(m.dead, c.qpn) // a reused number is the new QP's (its ring slot goes stale harmlessly)
	m.stats.Accepted++
	m.stats.MaxQPs = max(m.stats.MaxQPs, len(m.conns))
	if m.staleAt.IsZero() {
		m.staleAt = now.Add(m.cfg.Delay) // queue_delayed_work: a queued task stays as it is
	}
	m.move(c, ListPassive, true)
	m.emit(c, EventAccepted, now)
	return c, nil
}

// Disconnect handles a DREQ (after the DREP) or a REJ for c
// (ipoib_cm_rx_handler): its QP goes to ERROR. Under the Kernel policy the
// connection stays where it is until Last WQE Reached moves it, as in
// ipoib_cm.c; under Bounded it moves to rx_error_list at once, with a
// deadline for the event.
func (m *Manager) Disconnect(c *Conn) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c.list == ListNone || c.m != m {
		return fmt.Errorf("disconnecting qpn %d: not a connection of this manager: %w", c.qpn, ibv.ErrInvalidArgument)
	}
	now := m.clock.Now()
	m.stats.Disconnects++
	m.toError(c, now)
	if m.cfg.Policy == Bounded && c.list == ListPassive {
		m.toErrorList(c, StateError, now)
	}
	m.emit(c, EventDisconnect, now)
	return nil
}

// toErrorList puts c on rx_error_list; under Bounded with an SRQ the wait
// for its Last WQE Reached starts.
func (m *Manager) toErrorList(c *Conn, s State, now time.Time) {
	c.state = s
	m.move(c, ListError, true)
	if m.reaper != nil && m.srq != nil && !c.lastWQE {
		c.deadline = now.Add(m.cfg.Drain.LastWQETimeout)
	}
}

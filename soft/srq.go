package soft

import (
	"fmt"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/ibv/objtrace"
)

// SRQ is a shared receive queue of a soft device.
type SRQ struct {
	dev *Device
	pd  *PD
	id  uint32
	rec *objtrace.Record
	// Guarded by dev.fab.mu.
	q       ring[recvWQE]
	used    uint32 // slots held: WQEs posted whose completions are not yet polled
	maxWR   uint32
	maxSGE  uint32
	limit   uint32 // armed when non-zero
	qps     []*QP  // attached QPs in creation order
	errored bool
	closed  bool
}

var _ ibv.SRQ = (*SRQ)(nil)

// CreateSRQ creates an SRQ holding attr.MaxWR receive WRs of up to
// attr.MaxSGE SGEs; a non-zero attr.SRQLimit arms the limit event.
func (p *PD) CreateSRQ(attr ibv.SRQAttr) (ibv.SRQ, error) {
	d := p.dev
	d.fab.mu.Lock()
	defer d.fab.mu.Unlock()
	switch {
	case p.closed:
		return nil, fmt.Errorf("creating an SRQ: %w", ibv.ErrClosed)
	case attr.MaxWR == 0 || attr.SRQLimit > attr.MaxWR:
		return nil, fmt.Errorf("creating an SRQ of %d WRs with limit %d: %w", attr.MaxWR, attr.SRQLimit, ibv.ErrInvalidArgument)
	case int(attr.MaxWR) > d.limits.MaxSRQWR || int(attr.MaxSGE) > d.limits.MaxSGE:
		return nil, fmt.Errorf("creating an SRQ of %d WRs, %d SGEs on %s (max %d, %d): %w",
			attr.MaxWR, attr.MaxSGE, d.name, d.limits.MaxSRQWR, d.limits.MaxSGE, ibv.ErrInvalidArgument)
	case d.nSRQ >= d.limits.MaxSRQ:
		return nil, fmt.Errorf("creating an SRQ on %s (max %d): %w", d.name, d.limits.MaxSRQ, ibv.ErrResourceLimit)
	}
	d.nSRQ++
	p.nSRQ++
	d.nextID++
	s := &SRQ{dev: d, pd: p, id: d.nextID, maxWR: attr.MaxWR, maxSGE: attr.MaxSGE, limit: attr.SRQLimit}
	s.rec = objtrace.Track("soft SRQ %d on %s", s.id, d.name)
	return s, nil
}

// PostRecv posts receive WRs to the SRQ. It fails with a *ibv.PostError
// whose Index is the first WR not posted: ErrQueueFull when the SRQ is
// full, ErrInvalidState once the SRQ is in error.
func (s *SRQ) PostRecv(wrs []ibv.RecvWR) error {
	f := s.dev.fab.lockTick()
	defer f.mu.Unlock()
	err := s.postRecv(wrs)
	if len(wrs) > 0 {
		if s.dev.pref > 0 {
			for _, q := range s.qps {
				q.prefetch()
			}
		}
		f.receivesPosted()
	}
	return err
}

func (s *SRQ) postRecv(wrs []ibv.RecvWR) error {
	for i := range wrs {
		wr := &wrs[i]
		var err error
		switch {
		case s.closed:
			err = ibv.ErrClosed
		case s.errored:
			err = fmt.Errorf("SRQ %d is in error: %w", s.id, ibv.ErrInvalidState)
		case len(wr.SGL) > int(s.maxSGE):
			err = fmt.Errorf("%d SGEs, SRQ %d takes %d: %w", len(wr.SGL), s.id, s.maxSGE, ibv.ErrInvalidArgument)
		case s.used >= s.maxWR:
			err = fmt.Errorf("SRQ %d holds %d WRs not yet completed and polled: %w", s.id, s.maxWR, ibv.ErrQueueFull)
		}
		if err != nil {
			return &ibv.PostError{Index: i, Err: err}
		}
		s.used++
		s.q.push(newRecvWQE(wr))
	}
	return nil
}

// ID is the SRQ's handle on its device, counted from 1, as traces name it.
func (s *SRQ) ID() uint32 { return s.id }

// take removes the oldest WQE. Taking the SRQ below its armed
// limit raises SRQ_LIMIT_REACHED once and disarms the limit. Called with
// fab.mu held.
func (s *SRQ) take() (recvWQE, bool) {
	if s.errored || s.q.len() == 0 {
		return recvWQE{}, false
	}
	w := s.q.pop()
	if s.limit != 0 && uint32(s.q.len()) < s.limit {
		s.limit = 0
		s.dev.raise(ibv.AsyncEvent{Type: ibv.EventSRQLimitReached, SRQ: s})
	}
	return w, true
}

// Query returns the SRQ's size and its armed limit (0 when disarmed).
func (s *SRQ) Query() (ibv.SRQAttr, error) {
	s.dev.fab.mu.Lock()
	defer s.dev.fab.mu.Unlock()
	if s.closed {
		return ibv.SRQAttr{}, fmt.Errorf("querying SRQ %d: %w", s.id, ibv.ErrClosed)
	}
	return ibv.SRQAttr{MaxWR: s.maxWR, MaxSGE: s.maxSGE, SRQLimit: s.limit}, nil
}

// Modify resizes the SRQ (SRQAttrMaxWR, not below the WRs it holds) or
// arms its limit (SRQAttrLimit). Arming when the SRQ already holds fewer
// WQEs than the limit raises the event at the next take.
func (s *SRQ) Modify(attr ibv.SRQAttr, mask ibv.SRQAttrMask) error {
	s.dev.fab.mu.Lock()
	defer s.dev.fab.mu.Unlock()
	maxWR := s.maxWR
	if mask&ibv.SRQAttrMaxWR != 0 {
		maxWR = attr.MaxWR
	}
	switch {
	case s.closed:
		return fmt.Errorf("modifying SRQ %d: %w", s.id, ibv.ErrClosed)
	case s.errored:
		return fmt.Errorf("modifying SRQ %d: in error: %w", s.id, ibv.ErrInvalidState)
	case mask&^(ibv.SRQAttrMaxWR|ibv.SRQAttrLimit) != 0,
		maxWR < s.used || maxWR == 0,
		mask&ibv.SRQAttrLimit != 0 && attr.SRQLimit > maxWR:
		return fmt.Errorf("modifying SRQ %d (mask %#x, max_wr %d, limit %d): %w", s.id, uint32(mask), attr.MaxWR, attr.SRQLimit, ibv.ErrInvalidArgument)
	case int(maxWR) > s.dev.limits.MaxSRQWR:
		return fmt.Errorf("resizing SRQ %d to %d WRs (max %d): %w", s.id, maxWR, s.dev.limits.MaxSRQWR, ibv.ErrInvalidArgument)
	}
	s.maxWR = maxWR
	if mask&ibv.SRQAttrLimit != 0 {
		s.limit = attr.SRQLimit
	}
	return nil
}

// Close destroys the SRQ. It fails with ErrBusy while a QP is attached. WRs
// still queued are dropped without completions: no QP owns them.
func (s *SRQ) Close() error {
	return s.dev.fab.closeObject(&s.closed, s.rec, func() error {
		if len(s.qps) > 0 {
			return fmt.Errorf("closing SRQ %d with %d QPs attached: %w", s.id, len(s.qps), ibv.ErrBusy)
		}
		s.q.reset()
		s.dev.nSRQ--
		s.pd.nSRQ--
		return nil
	})
}

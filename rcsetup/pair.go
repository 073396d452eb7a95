package rcsetup

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/qpdrain/qpdrain/cm"
	"github.com/qpdrain/qpdrain/ibv"
)

// Connector creates pairs of RC QPs on one device connected to each other:
// by hand over a Route, or through the RDMA CM (CM), which is the only way
// an iWARP device connects (NeedsCM).
type Connector interface {
	// Pair creates two RC QPs on pd, A with attrA and B with attrB, and
	// connects them to each other (both in RTS) over the device's port
	// (Route) or the address the CM listens on (CM), asking for the retry
	// attributes rt where the way of connecting can set them (Route:
	// all; CM: the retry counts, which rdma_conn_param carries; the
	// device then holds what the CM negotiated, which ibv_query_qp
	// reports). pd must be a PD of Context(). The QPs are the caller's
	// to use and may be closed before the Pair; closing the Pair closes
	// both QPs, then what connected them. When Pair fails it has closed
	// what it created. A context that ends first bounds the wait for the
	// CM: its error wraps ctx.Err().
	Pair(ctx context.Context, pd ibv.PD, attrA, attrB ibv.QPInitAttr, rt Retry) (*Pair, error)
}

// Pair is two connected RC QPs from a Connector.
type Pair struct {
	A, B ibv.QP
	// ids are the CM IDs the QPs were created on, closed after them.
	ids []cm.ID
}

// Close closes both QPs, then the CM IDs they were created on, all of
// them even when one fails; it returns nil when already closed.
func (p *Pair) Close() error {
	var errs []error
	for _, qp := range []ibv.QP{p.A, p.B} {
		if qp != nil {
			errs = append(errs, qp.Close())
		}
	}
	for i := len(p.ids) - 1; i >= 0; i-- {
		errs = append(errs, p.ids[i].Close())
	}
	return errors.Join(errs...)
}

// NeedsCM reports whether dev's RC QPs connect only through the RDMA CM:
// an iWARP device (IBV_TRANSPORT_IWARP), which takes a QP to RTS only with
// the connection the iWARP CM set up (the kernel's siw: siw_qp_modify
// refuses RTS without the connection's socket, and ibv_modify_qp cannot
// pass one).
func NeedsCM(dev ibv.Context) bool { return dev.Info().Transport == ibv.TransportIWARP }

// Pair creates the two QPs on pd and connects them by hand (Connect) with
// the retry attributes rt.
func (r Route) Pair(_ context.Context, pd ibv.PD, attrA, attrB ibv.QPInitAttr, rt Retry) (*Pair, error) {
	p := &Pair{}
	var err error
	if p.A, err = pd.CreateQP(attrA); err != nil {
		return nil, fmt.Errorf("creating an RC QP: %w", err)
	}
	if p.B, err = pd.CreateQP(attrB); err != nil {
		return nil, errors.Join(fmt.Errorf("creating an RC QP: %w", err), p.Close())
	}
	r.Retry = &rt
	if err := r.Connect(p.A, p.B); err != nil {
		return nil, errors.Join(err, p.Close())
	}
	return p, nil
}

// CM connects QPs of one device through the RDMA CM, as applications do:
// a listener on the device's address, and for each pair an active ID that
// connects to it and the ID of the request it accepts, both on that one
// address (loopback).
type CM struct {
	// mu serializes Pair: the listener's next request must be the one
	// the pair's own active ID sent.
	mu       sync.Mutex
	m        cm.Manager
	listener cm.ID
	addr     netip.AddrPort
	dev      ibv.Context
}

// ListenCM starts a CM connector of m on addr, the IP address of the
// device to connect QPs on (librdmacm: of the netdev an RDMA device is on;
// softcm: an address attached to a soft device). Its device is the one
// the CM binds addr to (Context); with librdmacm that is librdmacm's own
// context of the device, so the QPs' PDs and CQs must come from it, not
// from an ibv.Open of the same device. An address no device has fails.
func ListenCM(m cm.Manager, addr netip.Addr) (*CM, error) {
	l, err := m.CreateID(cm.PSTCP)
	if err != nil {
		return nil, fmt.Errorf("connecting through the RDMA CM: %w", err)
	}
	if err := l.Listen(netip.AddrPortFrom(addr, 0), 16); err != nil {
		return nil, errors.Join(fmt.Errorf("connecting through the RDMA CM: %w", err), l.Close())
	}
	dev := l.Context()
	if dev == nil {
		return nil, errors.Join(fmt.Errorf("connecting through the RDMA CM: no RDMA device has %s: %w", addr, ibv.ErrNoDevice), l.Close())
	}
	return &CM{m: m, listener: l, addr: netip.AddrPortFrom(addr, l.LocalAddr().Port()), dev: dev}, nil
}

// Context is the device the CM bound the listener's address to.
func (c *CM) Context() ibv.Context { return c.dev }

// Addr is the address and port the connector's listener listens on.
func (c *CM) Addr() netip.AddrPort { return c.addr }

// Close closes the listener (rejecting requests nobody took). Close it
// last: after the pairs and every PD, CQ and MR on its device, which with
// librdmacm the listener's ID holds open.
func (c *CM) Close() error { return c.listener.Close() }

// Pair connects a new active ID to the listener (rdma_resolve_addr,
// rdma_resolve_route, rdma_connect) with A created on it, and accepts the
// request with B created on the request's ID (rdma_accept). rt's retry
// counts go into the connection parameters (0 takes 7).
func (c *CM) Pair(ctx context.Context, pd ibv.PD, attrA, attrB ibv.QPInitAttr, rt Retry) (*Pair, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := &Pair{}
	fail := func(err error) (*Pair, error) {
		return nil, errors.Join(fmt.Errorf("connecting two QPs through the RDMA CM on %s: %w", c.addr, err), p.Close())
	}
	active, err := c.m.CreateID(cm.PSTCP)
	if err != nil {
		return fail(err)
	}
	p.ids = append(p.ids, active)
	if err := active.ResolveAddr(ctx, netip.Addr{}, c.addr); err != nil {
		return fail(err)
	}
	if err := active.ResolveRoute(ctx); err != nil {
		return fail(err)
	}
	if p.A, err = active.CreateQP(pd, attrA); err != nil {
		return fail(err)
	}
	param := cm.ConnParam{RetryCount: rt.RetryCnt, RNRRetryCount: rt.RNRRetry}
	// Both sides wait for each other; the first to fail (a rejection, an
	// accept that cannot create B) ends the other's wait at once.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 2)
	go func() { done <- active.Connect(cctx, param) }()
	go func() { done <- c.accept(cctx, p, pd, attrB, param) }()
	var errs []error
	for range 2 {
		if err := <-done; err != nil {
			errs = append(errs, err)
			cancel()
		}
	}
	if len(errs) > 0 {
		return fail(errs[0])
	}
	return p, nil
}

// accept takes the listener's next request, creates B on it and accepts.
// It sets p.B and adds the request's ID to p.ids, which Pair reads once it
// returned.
func (c *CM) accept(ctx context.Context, p *Pair, pd ibv.PD, attr ibv.QPInitAttr, param cm.ConnParam) error {
	req, err := c.listener.GetRequest(ctx)
	if err != nil {
		return err
	}
	p.ids = append(p.ids, req)
	if p.B, err = req.CreateQP(pd, attr); err != nil {
		return err
	}
	return req.Accept(ctx, param)
}

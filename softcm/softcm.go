// Package softcm is the RDMA CM (package cm) of soft devices: a Network
// gives each soft device an IP address, and its IDs resolve, listen,
// connect, accept and disconnect the way librdmacm over the kernel's
// rdma_cm does, moving the IDs' QPs through the same states. It lets the
// CM's tests (internal/testing/cmtest) run in `go test ./...` and reach
// the flush path applications trigger with rdma_disconnect.
//
// What the CM does to QPs, as librdmacm does it (rdma-core's
// librdmacm/cma.c): CreateQP moves the QP to INIT; Accept moves the
// passive QP to RTR and RTS before it answers, and the active QP follows
// to RTR and RTS when the answer arrives, before Connect returns
// (ESTABLISHED); a rejection moves the active QP to ERROR; Disconnect
// moves the caller's QP to ERROR (on an iWARP device to SQD, as
// librdmacm's ucma_modify_qp_sqd does) and tells the peer, whose QP stays in RTS
// until it calls Disconnect as well (an application answers
// RDMA_CM_EVENT_DISCONNECTED with rdma_disconnect). The caller's side sees
// its own RDMA_CM_EVENT_DISCONNECTED once the peer has disconnected or
// closed its ID (the IB CM's DREP); simultaneous disconnects give both at
// once.
//
// Differences from rdma_cm over rxe: every event is raised at once, in the
// call that causes it, so only Connect and GetRequest ever wait (for the
// peer); no RDMA_CM_EVENT_TIMEWAIT_EXIT follows a disconnect; QPs start at
// PSN 0 with a path MTU of 1024; only RC QPs in port space cm.PSTCP are
// supported. A connect to an address and port nobody listens on is
// rejected at once with reason 8 (invalid service ID), as rxe's peer CM
// rejects it; an address no device has is RDMA_CM_EVENT_ADDR_ERROR.
package softcm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"syscall"

	"github.com/qpdrain/qpdrain/cm"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/fifo"
	"github.com/qpdrain/qpdrain/soft"
)

// IB CM reject reasons (IBTA Table 112) the soft CM gives as an
// RDMA_CM_EVENT_REJECTED's status.
const (
	RejectInvalidServiceID = 8  // no listener at the address and port
	RejectConsumer         = 28 // the passive side called Reject
)

// firstPort is the first port the network hands out for port 0 and for
// the source ports of active IDs.
const firstPort = 20000

// Network is a set of soft devices with one IP address each, and the CM
// that connects QPs between them. One mutex guards every ID of the
// network; QP transitions run under it, so they happen in the order the
// CM calls reach it.
type Network struct {
	mu        sync.Mutex
	devs      map[netip.Addr]*soft.Device
	listeners map[netip.AddrPort]*id
	nextPort  uint16
}

var _ cm.Manager = (*Network)(nil)

// NewNetwork returns a network without devices.
func NewNetwork() *Network {
	return &Network{devs: map[netip.Addr]*soft.Device{}, listeners: map[netip.AddrPort]*id{}, nextPort: firstPort}
}

// Attach gives dev the address addr. Devices that connect through the
// network must share a soft.Fabric (or be one device: loopback). An
// invalid or unspecified address, or one already attached, is
// ibv.ErrInvalidArgument.
func (n *Network) Attach(dev *soft.Device, addr netip.Addr) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !addr.IsValid() || addr.IsUnspecified() || n.devs[addr] != nil {
		return fmt.Errorf("attaching %s to %s: address invalid or taken: %w", addr, dev.Name(), ibv.ErrInvalidArgument)
	}
	n.devs[addr] = dev
	return nil
}

// CreateID creates an ID in port space ps; only cm.PSTCP is supported.
func (n *Network) CreateID(ps cm.PortSpace) (cm.ID, error) {
	if ps != cm.PSTCP {
		return nil, fmt.Errorf("creating CM ID in port space %#x: %w", int(ps), ibv.ErrNotSupported)
	}
	return newID(n), nil
}

// port hands out a port number no listener uses. Called with n.mu held.
func (n *Network) port() uint16 {
	for {
		p := n.nextPort
		n.nextPort++
		if n.nextPort == 0 {
			n.nextPort = firstPort
		}
		free := true
		for k := range n.listeners {
			free = free && k.Port() != p
		}
		if free {
			return p
		}
	}
}

// listenerFor finds the listener a request to dst reaches: one bound to
// dst, or to the unspecified address and dst's port. Called with n.mu held.
func (n *Network) listenerFor(dst netip.AddrPort) *id {
	if l := n.listeners[dst]; l != nil {
		return l
	}
	for k, l := range n.listeners {
		if k.Addr().IsUnspecified() && k.Port() == dst.Port() {
			return l
		}
	}
	return nil
}

// state is where an ID is in the connection's life (the kernel's enum
// rdma_cm_state, reduced to what the soft CM distinguishes).
type state int

const (
	stateIdle          state = iota
	stateAddrResolved        // ResolveAddr done
	stateRouteResolved       // ResolveRoute done
	stateListen              // Listen done
	stateConnecting          // active: Connect waiting for the answer
	stateRequest             // passive: a request not yet accepted or rejected
	stateConnected           // ESTABLISHED
	stateDREQSent            // Disconnect called, the peer has not answered
	stateDREQRcvd            // the peer disconnected, Disconnect not called yet
	stateDone                // disconnected, rejected or failed: only Close is left
)

// id is a soft CM ID. Every field is guarded by net.mu but notify and
// done, which wake waiters.
type id struct {
	net    *Network
	state  state
	dev    *soft.Device
	local  netip.AddrPort
	peer   netip.AddrPort
	qp     ibv.QP
	remote *id // the other end of a connection or request
	// connected: the ID was connected once, so Disconnect stays allowed
	connected bool
	param     cm.ConnParam
	events    []cm.Event
	reqs      []*id // connection requests of a listener, for GetRequest
	closed    bool
	notify    chan struct{} // a token when events or reqs grew
	done      chan struct{} // closed by Close
}

var _ cm.ID = (*id)(nil)

func newID(n *Network) *id {
	return &id{net: n, notify: make(chan struct{}, 1), done: make(chan struct{})}
}

// push raises e on i. Called with net.mu held.
func (i *id) push(e cm.Event) {
	if i.closed {
		return
	}
	i.events = append(i.events, e)
	i.wake()
}

func (i *id) wake() {
	select {
	case i.notify <- struct{}{}:
	default:
	}
}

// wait waits until q (guarded by net.mu) has an element, which it pops,
// ctx ends or the ID is closed.
func wait[T any](ctx context.Context, i *id, op string, q *[]T) (T, error) {
	for {
		i.net.mu.Lock()
		v, ok := fifo.Pop(q)
		closed := i.closed
		i.net.mu.Unlock()
		var zero T
		switch {
		case ok:
			return v, nil
		case closed:
			return zero, fmt.Errorf("%s: %w", op, ibv.ErrClosed)
		}
		select {
		case <-i.notify:
		case <-i.done:
		case <-ctx.Done():
			return zero, fmt.Errorf("%s: %w", op, ctx.Err())
		}
	}
}

// await waits for the ID's next event and checks it is want.
func (i *id) await(ctx context.Context, op string, want cm.EventType) error {
	e, err := wait(ctx, i, op, &i.events)
	if err != nil {
		return err
	}
	return e.Err(op, want)
}

// begin takes net.mu for an operation allowed in the states given, and
// fails (releasing it) when the ID is closed or in another state.
func (i *id) begin(op string, states ...state) error {
	i.net.mu.Lock()
	if i.closed {
		i.net.mu.Unlock()
		return fmt.Errorf("%s: %w", op, ibv.ErrClosed)
	}
	for _, s := range states {
		if i.state == s {
			return nil
		}
	}
	i.net.mu.Unlock()
	return fmt.Errorf("%s: not allowed in this state of the ID: %w", op, ibv.ErrInvalidArgument)
}

func (i *id) ResolveAddr(ctx context.Context, src netip.Addr, dst netip.AddrPort) error {
	op := fmt.Sprintf("resolving address %s", dst)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := i.begin(op, stateIdle); err != nil {
		return err
	}
	n := i.net
	dev := n.devs[dst.Addr()]
	if src.IsValid() {
		if dev = n.devs[src]; dev == nil {
			n.mu.Unlock()
			return fmt.Errorf("%s: source %s is no device's: %w", op, src, syscall.EADDRNOTAVAIL)
		}
	} else {
		src = dst.Addr() // the soft network's route to an address is the device that has it
	}
	if dev == nil || n.devs[dst.Addr()] == nil {
		i.push(cm.Event{Type: cm.EventAddrError, Status: -int(syscall.EHOSTUNREACH)})
	} else {
		i.dev, i.local, i.peer = dev, netip.AddrPortFrom(src, n.port()), dst
		i.state = stateAddrResolved
		i.push(cm.Event{Type: cm.EventAddrResolved})
	}
	n.mu.Unlock()
	return i.await(ctx, op, cm.EventAddrResolved)
}

func (i *id) ResolveRoute(ctx context.Context) error {
	const op = "resolving route"
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := i.begin(op, stateAddrResolved); err != nil {
		return err
	}
	i.state = stateRouteResolved
	i.push(cm.Event{Type: cm.EventRouteResolved})
	i.net.mu.Unlock()
	return i.await(ctx, op, cm.EventRouteResolved)
}

func (i *id) Listen(addr netip.AddrPort, backlog int) error {
	op := fmt.Sprintf("listening on %s", addr)
	if err := i.begin(op, stateIdle); err != nil {
		return err
	}
	n := i.net
	defer n.mu.Unlock()
	var dev *soft.Device
	if !addr.Addr().IsUnspecified() {
		if dev = n.devs[addr.Addr()]; dev == nil {
			return fmt.Errorf("%s: no device has %s: %w", op, addr.Addr(), syscall.EADDRNOTAVAIL)
		}
	}
	if addr.Port() == 0 {
		addr = netip.AddrPortFrom(addr.Addr(), n.port())
	}
	for k := range n.listeners {
		if k.Port() == addr.Port() && (k.Addr() == addr.Addr() || k.Addr().IsUnspecified() || addr.Addr().IsUnspecified()) {
			return fmt.Errorf("%s: %w", op, syscall.EADDRINUSE)
		}
	}
	n.listeners[addr] = i
	i.dev, i.local, i.state = dev, addr, stateListen
	return nil
}

func (i *id) GetRequest(ctx context.Context) (cm.ID, error) {
	const op = "waiting for a connection request"
	if err := i.begin(op, stateListen); err != nil {
		return nil, err
	}
	i.net.mu.Unlock()
	// Not returned directly: a nil *id would be a non-nil cm.ID.
	r, err := wait(ctx, i, op, &i.reqs)
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (i *id) Connect(ctx context.Context, param cm.ConnParam) error {
	op := fmt.Sprintf("connecting to %s", i.peer)
	if err := i.begin(op, stateRouteResolved); err != nil {
		return err
	}
	n := i.net
	if i.qp == nil {
		n.mu.Unlock()
		return fmt.Errorf("%s: the ID has no QP: %w", op, ibv.ErrInvalidArgument)
	}
	i.param = param
	l := n.listenerFor(i.peer)
	if l == nil {
		i.reject(RejectInvalidServiceID)
		n.mu.Unlock()
		return i.await(ctx, op, cm.EventEstablished)
	}
	req := newID(n)
	req.state, req.dev, req.local, req.peer, req.remote, req.param = stateRequest, n.devs[i.peer.Addr()], i.peer, i.local, i, param
	i.state, i.remote = stateConnecting, req
	l.reqs = append(l.reqs, req)
	l.wake()
	n.mu.Unlock()
	return i.await(ctx, op, cm.EventEstablished)
}

// reject ends i's connect with RDMA_CM_EVENT_REJECTED, moving its QP to
// ERROR as librdmacm does on that event. Called with net.mu held.
func (i *id) reject(reason int) {
	i.state = stateDone
	toError(i.qp)
	i.push(cm.Event{Type: cm.EventRejected, Status: reason})
}

func (i *id) Accept(ctx context.Context, param cm.ConnParam) error {
	const op = "accepting a connection request"
	if err := i.begin(op, stateRequest); err != nil {
		return err
	}
	n := i.net
	a := i.remote
	switch {
	case i.qp == nil:
		n.mu.Unlock()
		return fmt.Errorf("%s: the ID has no QP: %w", op, ibv.ErrInvalidArgument)
	case a.closed || a.state != stateConnecting:
		// The active side gave up (closed its ID or timed out).
		i.state = stateDone
		i.push(cm.Event{Type: cm.EventConnectError, Status: -int(syscall.ECONNRESET)})
	default:
		err := toRTS(i.qp, a, param, a.param)
		if err == nil {
			err = toRTS(a.qp, i, a.param, param)
		}
		if err != nil {
			n.mu.Unlock()
			return fmt.Errorf("%s: %w", op, err)
		}
		i.state, a.state = stateConnected, stateConnected
		i.connected, a.connected = true, true
		a.push(cm.Event{Type: cm.EventEstablished, PrivateData: param.PrivateData})
		i.push(cm.Event{Type: cm.EventEstablished})
	}
	n.mu.Unlock()
	return i.await(ctx, op, cm.EventEstablished)
}

func (i *id) Reject(privateData []byte) error {
	if err := i.begin("rejecting a connection request", stateRequest); err != nil {
		return err
	}
	defer i.net.mu.Unlock()
	i.state = stateDone
	if a := i.remote; a.state == stateConnecting {
		a.reject(RejectConsumer)
		a.events[len(a.events)-1].PrivateData = privateData
	}
	return nil
}

func (i *id) Disconnect() error {
	if err := i.begin("disconnecting", stateConnected, stateDREQRcvd, stateDREQSent, stateDone); err != nil {
		return err
	}
	defer i.net.mu.Unlock()
	if !i.connected {
		return fmt.Errorf("disconnecting: the ID was never connected: %w", ibv.ErrInvalidArgument)
	}
	i.stop()
	if i.state == stateConnected || i.state == stateDREQRcvd {
		i.disconnect()
	}
	return nil
}

// disconnect sends the DREQ (or, answering one, the DREP) of i's
// connection. Called with net.mu held.
func (i *id) disconnect() {
	r := i.remote
	switch {
	case i.state == stateDREQRcvd: // the DREP
		i.state = stateDone
		if r.state == stateDREQSent {
			r.state = stateDone
			r.push(cm.Event{Type: cm.EventDisconnected})
		}
	case r.closed || r.state == stateDREQSent || r.state == stateDone:
		// Nobody left to answer, or both sides disconnect at once.
		i.state = stateDone
		if r.state == stateDREQSent {
			r.state = stateDone
			r.push(cm.Event{Type: cm.EventDisconnected})
		}
		i.push(cm.Event{Type: cm.EventDisconnected})
	default:
		i.state, r.state = stateDREQSent, stateDREQRcvd
		r.push(cm.Event{Type: cm.EventDisconnected})
	}
}

func (i *id) NextEvent(ctx context.Context) (cm.Event, error) {
	return wait(ctx, i, "waiting for a CM event", &i.events)
}

func (i *id) Context() ibv.Context {
	i.net.mu.Lock()
	defer i.net.mu.Unlock()
	if i.dev == nil {
		return nil // a typed nil would not compare equal to nil
	}
	return i.dev
}

func (i *id) CreateQP(pd ibv.PD, attr ibv.QPInitAttr) (ibv.QP, error) {
	const op = "creating the CM ID's QP"
	i.net.mu.Lock()
	defer i.net.mu.Unlock()
	switch {
	case i.closed:
		return nil, fmt.Errorf("%s: %w", op, ibv.ErrClosed)
	case i.dev == nil || pd.Context() != ibv.Context(i.dev):
		return nil, fmt.Errorf("%s: the PD is not of the ID's device: %w", op, ibv.ErrInvalidArgument)
	case i.qp != nil && !isClosed(i.qp):
		return nil, fmt.Errorf("%s: the ID has a QP: %w", op, ibv.ErrInvalidArgument)
	case attr.Type != ibv.QPTRC:
		return nil, fmt.Errorf("%s: %s QP in port space TCP: %w", op, attr.Type, ibv.ErrInvalidArgument)
	}
	qp, err := pd.CreateQP(attr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	// rdma_init_qp_attr's INIT: port, P_Key index 0; the soft CM grants at
	// INIT the access the kernel grants at RTR with responder resources.
	init := ibv.QPAttr{State: ibv.QPSInit, PortNum: 1,
		AccessFlags: ibv.AccessLocalWrite | ibv.AccessRemoteWrite | ibv.AccessRemoteRead | ibv.AccessRemoteAtomic}
	if err := qp.Modify(init, ibv.QPAttrState|ibv.QPAttrPKeyIndex|ibv.QPAttrPort|ibv.QPAttrAccessFlags); err != nil {
		qp.Close()
		return nil, fmt.Errorf("%s: moving it to INIT: %w", op, err)
	}
	i.qp = qp
	return qp, nil
}

func (i *id) LocalAddr() netip.AddrPort {
	i.net.mu.Lock()
	defer i.net.mu.Unlock()
	return i.local
}

func (i *id) PeerAddr() netip.AddrPort {
	i.net.mu.Lock()
	defer i.net.mu.Unlock()
	return i.peer
}

func (i *id) Close() error {
	n := i.net
	n.mu.Lock()
	defer n.mu.Unlock()
	if i.closed {
		return nil
	}
	if i.qp != nil && !isClosed(i.qp) {
		return fmt.Errorf("closing CM ID: its QP %d is open: %w", i.qp.Num(), ibv.ErrBusy)
	}
	switch i.state {
	case stateListen:
		delete(n.listeners, i.local)
		for _, r := range i.reqs {
			r.closeRequest()
		}
		i.reqs = nil
	case stateRequest:
		i.closeRequest()
	case stateConnected, stateDREQRcvd:
		i.disconnect()
	}
	i.closed = true
	close(i.done)
	return nil
}

// closeRequest rejects a request nobody accepted, as the kernel does when
// the ID of a pending request is destroyed. Called with net.mu held.
func (i *id) closeRequest() {
	i.state = stateDone
	if a := i.remote; a.state == stateConnecting {
		a.reject(RejectConsumer)
	}
}

// toRTS moves qp, in INIT, to RTR and RTS towards the QP of peer, with the
// depths and retry counts of the two sides' ConnParams. Called with
// net.mu held.
func toRTS(qp ibv.QP, peer *id, own, theirs cm.ConnParam) error {
	pa, err := peer.dev.QueryPort(1)
	if err != nil {
		return err
	}
	resp := orDefault(own.ResponderResources, 16)
	init := orDefault(own.InitiatorDepth, 16)
	steps := []struct {
		attr ibv.QPAttr
		mask ibv.QPAttrMask
	}{
		{ibv.QPAttr{State: ibv.QPSRTR, AH: ibv.AHAttr{DLID: pa.LID, PortNum: 1}, PathMTU: ibv.MTU1024,
			DestQPNum: peer.qp.Num(), MaxDestRdAtomic: resp, MinRNRTimer: 12},
			ibv.QPAttrState | ibv.QPAttrAV | ibv.QPAttrPathMTU | ibv.QPAttrDestQPN | ibv.QPAttrRQPSN |
				ibv.QPAttrMaxDestRdAtomic | ibv.QPAttrMinRNRTimer},
		{ibv.QPAttr{State: ibv.QPSRTS, Timeout: 14, RetryCnt: orDefault(theirs.RetryCount, 7),
			RNRRetry: orDefault(theirs.RNRRetryCount, 7), MaxRdAtomic: init},
			ibv.QPAttrState | ibv.QPAttrTimeout | ibv.QPAttrRetryCnt | ibv.QPAttrRNRRetry | ibv.QPAttrSQPSN |
				ibv.QPAttrMaxQPRdAtomic},
	}
	for _, s := range steps {
		if err := modifyByCM(qp, s.attr, s.mask); err != nil {
			return fmt.Errorf("moving QP %d to %s: %w", qp.Num(), s.attr.State, err)
		}
	}
	return nil
}

// modifyByCM modifies qp as the CM does: on a soft device through
// soft.QP.ModifyByCM, the one way an iWARP QP reaches RTR and RTS.
func modifyByCM(qp ibv.QP, attr ibv.QPAttr, mask ibv.QPAttrMask) error {
	if sq, ok := qp.(*soft.QP); ok {
		return sq.ModifyByCM(attr, mask)
	}
	return qp.Modify(attr, mask)
}

func orDefault(v, def uint8) uint8 {
	if v == 0 {
		return def
	}
	return v
}

// toError moves qp to ERROR, as rdma_disconnect and a rejection do
// (librdmacm's ucma_modify_qp_err). A QP closed already needs nothing.
func toError(qp ibv.QP) {
	if qp != nil {
		_ = qp.Modify(ibv.QPAttr{State: ibv.QPSErr}, ibv.QPAttrState)
	}
}

// stop moves i's QP where rdma_disconnect moves it (librdmacm's
// rdma_disconnect): an iWARP QP to SQD (ucma_modify_qp_sqd; siw's
// CLOSING), any other to ERROR (ucma_modify_qp_err). Called with net.mu
// held.
func (i *id) stop() {
	if i.qp == nil || i.dev.Info().Transport != ibv.TransportIWARP {
		toError(i.qp)
		return
	}
	// A QP in ERROR refuses SQD (IBTA's state diagram) and stays there.
	_ = i.qp.Modify(ibv.QPAttr{State: ibv.QPSSQD}, ibv.QPAttrState)
}

// isClosed reports whether qp was closed.
func isClosed(qp ibv.QP) bool {
	_, _, err := qp.Query(ibv.QPAttrState)
	return errors.Is(err, ibv.ErrClosed)
}

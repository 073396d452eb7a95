package cm

import (
	"context"
	"net/netip"

	"github.com/qpdrain/qpdrain/ibv"
)

// PortSpace is the port space of a CM ID (enum rdma_port_space): which
// transport's port numbers its addresses carry.
type PortSpace int

// Port spaces, with rdma_cma.h's values.
const (
	PSIPoIB PortSpace = 0x0002 // RDMA_PS_IPOIB
	PSTCP   PortSpace = 0x0106 // RDMA_PS_TCP: reliable connected (RC) QPs
	PSUDP   PortSpace = 0x0111 // RDMA_PS_UDP: unreliable datagram (UD) QPs
	PSIB    PortSpace = 0x013F // RDMA_PS_IB
)

// ConnParam is what Connect and Accept exchange (struct rdma_conn_param).
// The zero value asks for the device's maximum RDMA READ and atomic depths
// and retry counts of 7 (retry forever on RNR), as librdmacm does without
// one.
type ConnParam struct {
	// ResponderResources and InitiatorDepth are the incoming and outgoing
	// RDMA READ and atomic depths; 0 takes the device's maximum.
	ResponderResources, InitiatorDepth uint8
	// RetryCount and RNRRetryCount are the transport and RNR retry counts
	// (3 bits each; 7 is infinite RNR retry); 0 takes 7.
	RetryCount, RNRRetryCount uint8
	// PrivateData goes to the peer with the request or reply.
	PrivateData []byte
}

// Manager creates CM IDs: librdmacm (package librdmacm) or a network of
// soft devices (package softcm).
type Manager interface {
	// CreateID creates a CM ID in port space ps (rdma_create_id) with an
	// event channel of its own. A port space the implementation does not
	// support is ibv.ErrNotSupported.
	CreateID(ps PortSpace) (ID, error)
}

// ID is a CM ID (struct rdma_cm_id): one end of a connection, or a
// listener. Its operations that wait for a CM event (ResolveAddr,
// ResolveRoute, GetRequest, Accept, Connect) wait no longer than their
// context: when it ends first they return ctx.Err(), wrapped, and the ID is
// then in an undefined state that only Close leaves. An event they wait
// for that says the operation failed is an *EventError matching the
// sentinel of its type (ErrAddrError, ErrRejected, ...). Calling an
// operation in a state that does not allow it is ibv.ErrInvalidArgument
// (librdmacm's EINVAL), and any operation after Close is ibv.ErrClosed.
type ID interface {
	// ResolveAddr resolves dst, and src when valid, to a local RDMA
	// device and port (rdma_resolve_addr) and waits for
	// RDMA_CM_EVENT_ADDR_RESOLVED. An address no device can reach is
	// ErrAddrError (or, when librdmacm refuses at once, its errno).
	ResolveAddr(ctx context.Context, src netip.Addr, dst netip.AddrPort) error
	// ResolveRoute resolves the route to the address ResolveAddr
	// resolved (rdma_resolve_route) and waits for
	// RDMA_CM_EVENT_ROUTE_RESOLVED; a failure is ErrRouteError.
	ResolveRoute(ctx context.Context) error
	// Listen binds the ID to addr (port 0: one the CM picks; the
	// unspecified address: every device) and listens for connection
	// requests (rdma_bind_addr, rdma_listen). An address in use is
	// syscall.EADDRINUSE.
	Listen(addr netip.AddrPort, backlog int) error
	// GetRequest waits for the next RDMA_CM_EVENT_CONNECT_REQUEST of a
	// listening ID and returns the new ID of the request, bound to the
	// device the request arrived on. The caller creates its QP, then
	// Accepts or Rejects, and Closes it.
	GetRequest(ctx context.Context) (ID, error)
	// Accept accepts the request of an ID from GetRequest (rdma_accept):
	// its QP moves to RTS, and Accept waits for
	// RDMA_CM_EVENT_ESTABLISHED.
	Accept(ctx context.Context, param ConnParam) error
	// Reject rejects the request of an ID from GetRequest (rdma_reject);
	// the active side's Connect fails with ErrRejected.
	Reject(privateData []byte) error
	// Connect connects the ID, whose route is resolved and whose QP is
	// created, to the listener at the resolved address (rdma_connect) and
	// waits for RDMA_CM_EVENT_ESTABLISHED; its QP is then in RTS. No
	// listener there is ErrRejected (the peer's CM rejects the request:
	// IB reject reason 8, invalid service ID) and no answer
	// ErrUnreachable; on a rejection the QP moves to ERROR. On iWARP the
	// TCP connection is refused: siw connects its socket inside
	// rdma_connect (siw_connect), so Connect fails at once with an error
	// matching syscall.ECONNREFUSED (as ErrRejected does too), the QP
	// left as it was.
	Connect(ctx context.Context, param ConnParam) error
	// Disconnect moves the ID's QP to ERROR (SQD on iWARP) and tells the
	// peer (rdma_disconnect). The peer sees RDMA_CM_EVENT_DISCONNECTED,
	// its QP untouched until it calls Disconnect too (librdmacm does not
	// move the passive side's QP: an application answers the event with
	// rdma_disconnect); this side sees RDMA_CM_EVENT_DISCONNECTED once
	// the peer has disconnected. Disconnecting again moves the QP to
	// ERROR again and returns nil, as rdma_disconnect does on rxe; an ID
	// never connected is ibv.ErrInvalidArgument.
	Disconnect() error
	// NextEvent waits for the next CM event of the ID that no operation
	// above took (RDMA_CM_EVENT_DISCONNECTED, _TIMEWAIT_EXIT,
	// _DEVICE_REMOVAL, ...). It returns ctx.Err() when ctx ends first.
	NextEvent(ctx context.Context) (Event, error)
	// Context is the device the ID is bound to, nil before ResolveAddr
	// or for a listener on the unspecified address. Allocate the PD and
	// CQs of the ID's QP on it.
	Context() ibv.Context
	// CreateQP creates the ID's QP on pd, a PD of Context()
	// (rdma_create_qp), and moves it to INIT as rdma_create_qp does;
	// Connect and Accept move it on. The QP is an ibv.QP like any other:
	// post, poll, Modify and Close it as usual, before closing the ID. A
	// PD of another device, an ID without a device or one that has a QP
	// already is ibv.ErrInvalidArgument.
	CreateQP(pd ibv.PD, attr ibv.QPInitAttr) (ibv.QP, error)
	// LocalAddr and PeerAddr are the ID's source and destination
	// addresses, zero when not known yet.
	LocalAddr() netip.AddrPort
	PeerAddr() netip.AddrPort
	// Close destroys the ID (rdma_destroy_id); a connected peer sees
	// RDMA_CM_EVENT_DISCONNECTED. It fails with ibv.ErrBusy while the
	// ID's QP is open, and returns nil when already closed.
	Close() error
}

// Package cm is qpdrain's Go API of the RDMA connection manager
// (<rdma/rdma_cma.h>): the way real applications (SPDK, Ceph, NFS/RDMA,
// rping, perftest -R) connect their QPs, and the only way iWARP devices
// connect at all. A Manager creates IDs; an ID resolves an address and a
// route, listens, connects or accepts, creates its QP (an ibv.QP like any
// other, that drain and flushcheck take as they are), and disconnects.
//
// Two implementations stand behind the interfaces, beside package ibv's:
// librdmacm (package librdmacm, cgo, opened at run time with dlopen as
// libibverbs is, so that a program starts without it) and a network of soft
// devices (package softcm). This package links no cgo.
//
// # Events and waits
//
// Each ID has an event channel of its own (rdma_create_event_channel per
// ID; a connection request's ID is migrated to one, rdma_migrate_id).
// The operations that wait for a CM event take a context and wait no
// longer than it; an event that says the operation failed is an
// *EventError, matching with errors.Is the sentinel of its type
// (ErrAddrError, ErrRouteError, ErrRejected, ErrUnreachable,
// ErrConnectError, ...) and the errno that says the same
// (ErrRejected: ECONNREFUSED). Events no operation waits for
// (RDMA_CM_EVENT_DISCONNECTED, _TIMEWAIT_EXIT, _DEVICE_REMOVAL) are
// queued for ID.NextEvent. Every event is copied and acknowledged when it
// is read, so no event a caller holds keeps rdma_destroy_id waiting.
//
// # QPs and disconnects
//
// What the CM does to an ID's QP follows librdmacm (rdma-core's
// librdmacm/cma.c): CreateQP moves it to INIT; Accept moves the passive
// QP to RTR and RTS before replying; the active QP follows when the reply
// arrives, before Connect returns; a rejection moves the active QP to
// ERROR. Disconnect moves the caller's QP to ERROR on InfiniBand and RoCE
// (SQD on iWARP) and tells the peer, which sees
// RDMA_CM_EVENT_DISCONNECTED with its QP untouched: an application answers
// the event with its own Disconnect, which moves its QP to ERROR and
// flushes its outstanding WRs, the path qpdrain exists for.
//
// # Errors
//
// Misuse is reported with package ibv's sentinels, as libibverbs's are:
// ibv.ErrInvalidArgument (EINVAL: an operation the ID's state does not
// allow, a PD of another device), ibv.ErrClosed (after Close),
// ibv.ErrBusy (Close of an ID whose QP is open) and ibv.ErrNotSupported
// (no librdmacm: a *LoadError that names what to install). A wait that
// ends with its context returns ctx.Err(), wrapped.
package cm

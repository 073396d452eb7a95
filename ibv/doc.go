// Package ibv is qpdrain's Go verbs API: the vocabulary of <infiniband/verbs.h>
// (QP, CQ, SRQ, WR, WC, async events) and the interfaces that every device
// implementation satisfies.
//
// Two implementations stand behind the interfaces: real devices through
// libibverbs (rdma-core, cgo; see Open and Devices) and the pure-Go software
// device in package soft. Code above this package (drain, flushcheck, the CLI)
// speaks only these interfaces and never knows which device it runs on.
//
// # Numeric values
//
// Every enum has the numeric value libibverbs gives it, so values cross the
// cgo boundary unchanged and print in logs as an rdma-core user expects.
// Immediate data is held in host byte order; the libibverbs implementation
// converts to and from the wire's big-endian order.
//
// # Object lifetimes
//
// A child keeps its parent alive: a QP holds its PD, CQs and SRQ; everything
// holds its Context. Closing a parent that still has live children fails with
// ErrBusy, and so does closing a CQ or SRQ that a QP still uses (IBTA C11-17).
// Close is idempotent: a second Close returns nil. Any other method on a
// closed object returns ErrClosed.
//
// # Completions in error
//
// On a completion whose Status is not WCSuccess, only WC.ID, WC.Status,
// WC.QPNum and WC.VendorErr are valid (ibv_poll_cq(3)). Never read the opcode
// or byte length of a flushed completion.
//
// # Async events
//
// Context.NextAsyncEvent returns each asynchronous event exactly once, copied
// and already acknowledged: ibv_destroy_qp, _cq and _srq block until every
// event of their object is acknowledged, so the libibverbs implementation acks
// at once and no caller can deadlock a destroy by holding an event.
package ibv

// Package ibv is qpdrain's Go verbs API: the vocabulary of <infiniband/verbs.h>
// (QP, CQ, SRQ, WR, WC, async events) and the interfaces that every device
// implementation satisfies.
//
// Two implementations stand behind the interfaces, in packages of their own:
// real devices through libibverbs (package libibverbs, cgo), which registers
// itself with Register when a program imports it and is then reached through
// Open and Devices, and the pure-Go software device (package soft). This
// package links no cgo. Code above it (drain, flushcheck, the CLI) speaks
// only these interfaces and never knows which device it runs on.
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
//
// An event loop may hand an event over long after it was raised, and a QP
// reused through RESET may meanwhile be in ERROR again: AsyncEvent.QPResets
// says which error episode a QP event belongs to. The soft device stamps it
// when it raises the event. The libibverbs implementation stamps it when it
// reads the event from the device, and a Modify to RESET reads every event
// already queued before it counts the reset, so an event the provider
// raised before the QP left ERROR carries the old count. That holds for a
// provider that raises no event of the episode once the modify to RESET has
// returned, as rxe: rxe_qp_reset disables the QP's tasks and runs them once
// itself before the modify returns.
//
// # Errors
//
// Every implementation (libibverbs, soft) gives the same misuse the same
// sentinel, the one libibverbs gives on rxe, and every sentinel also matches
// its errno (errors.Is(err, syscall.EINVAL)). internal/testing/devtest checks it on
// both. Each interface method's documentation names its errors.
//
//   - ErrClosed: the object, or one the call needs, was closed.
//   - ErrBusy: Close of an object that still has children or users.
//   - ErrInvalidArgument (EINVAL): a bad attribute, size, mask or WR field,
//     an object of another device, an invalid QP state transition or a
//     post in a state that forbids it (EINVAL is all libibverbs says, so
//     no device tells them from a bad attribute),
//     and a capability beyond the device's (DeviceAttr's MaxQPWR, MaxSGE,
//     MaxCQE, MaxSRQWR; EINVAL from rxe_qp_chk_cap, rxe_cq_chk_attr,
//     rxe_srq_chk_init).
//   - ErrResourceLimit (ENOMEM): the device ran out (MaxQP QPs, MaxCQ CQs,
//     ..., or memory) while creating an object.
//   - ErrQueueFull (ENOMEM): a post found no room in its work queue.
//   - ErrNotSupported (EOPNOTSUPP): the operation, QP type or WR opcode is
//     not available on this device, or libibverbs is not (*LoadError).
//   - ErrNoDevice (ENODEV): no RDMA device by that name.
//
// A post that fails returns a *PostError: the WRs before its Index were
// posted and complete as usual, the rest were not (bad_wr of
// ibv_post_send(3)); a WR with an unsupported opcode ends the batch there.
// An async event of a QP, CQ or SRQ closed before NextAsyncEvent returns it
// is dropped. docs/PROVIDERS.md lists what still differs between devices.
package ibv

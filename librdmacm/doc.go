// Package librdmacm is the implementation of package cm over the kernel's
// RDMA CM (rdma_cm, ib_cm, iw_cm) through librdmacm (rdma-core), beside the
// soft one of package softcm.
//
// Binaries are not linked against librdmacm: Open (or Load) opens
// librdmacm.so.1 with dlopen at run time and resolves every entry point
// it calls, at the symbol version a linked program binds, so that a
// program starts on a machine without librdmacm; a missing library or
// entry point is a *cm.LoadError, which matches ibv.ErrNotSupported and
// names what to install. librdmacm itself needs libibverbs, which it
// loads as a linked library does; the IDs' device contexts are handed
// out as ibv.Contexts of package libibverbs (libibverbs.Adopt) and their
// QPs, created with rdma_create_qp, as its ibv.QPs (libibverbs.CreateQPWith),
// so drain and flushcheck take them as they are. Builds without linux and
// cgo have no librdmacm; Load and Open answer ibv.ErrNotSupported there.
//
// Each ID has an event channel of its own, whose fd does not block;
// waiting for an event polls it, in slices of at most 10 ms, until the
// operation's context ends. A connection request's ID is migrated from
// the listener's channel to one of its own (rdma_migrate_id) before
// GetRequest returns it. Every event is copied and acknowledged as soon as
// it is read.
//
// Connect blocks the calling thread's signals while rdma_connect runs. On
// iWARP the driver may connect its TCP socket inside that call, and a
// signal there (Go preempts goroutines with SIGURG) makes siw close the
// connection it has just made and connect again, which its listener does
// not survive (docs/PROVIDERS.md).
package librdmacm

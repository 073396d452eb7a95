// Package libibverbs is the implementation of package ibv's interfaces over
// real RDMA devices through libibverbs (rdma-core), beside the pure-Go soft
// device of package soft. Importing it registers it with ibv.Register, so
// ibv.Open and ibv.Devices reach real devices; a program that imports only
// soft (and what stands on ibv) links no cgo:
//
//	import _ "github.com/qpdrain/qpdrain/libibverbs"
//
// # Loading libibverbs
//
// Binaries are not linked against libibverbs: they start on a machine
// without rdma-core and use the soft device there. The first Devices or Open
// call (or Load) opens libibverbs.so.1 with dlopen and resolves every entry
// point the binding calls, at the symbol version a linked program would
// bind; concurrent first callers share that one load. A missing library or
// entry point is an *ibv.LoadError, which matches ibv.ErrNotSupported and
// names what to install. The hot paths (post, poll, arm a CQ) are
// libibverbs's inline functions, which call the provider through the
// context's ops and need no symbol at all, so the loading costs them
// nothing. Builds without linux and cgo have no libibverbs implementation;
// Load, Devices and Open answer ibv.ErrNotSupported there.
//
// Immediate data is held in host byte order in ibv's types; this binding
// converts to and from the wire's big-endian order. Async events are
// acknowledged as soon as they are read (ibv_destroy_qp, _cq and _srq block
// until every event of their object is acknowledged), so no caller can
// deadlock a destroy by holding an event.
package libibverbs

import "github.com/qpdrain/qpdrain/ibv"

func init() { ibv.Register(binding{}) }

// binding is this package's ibv.Binding: its package-level functions.
type binding struct{}

func (binding) Load() error                           { return Load() }
func (binding) Devices() ([]ibv.DeviceInfo, error)    { return Devices() }
func (binding) Open(name string) (ibv.Context, error) { return Open(name) }

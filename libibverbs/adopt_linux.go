//go:build linux && cgo

package libibverbs

/*
#include "verbs_linux.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/qpdrain/qpdrain/ibv"
)

// The hooks another binding over libibverbs needs to hand its objects out
// as ibv objects: librdmacm (package librdmacm) opens device contexts and
// creates QPs on CM IDs itself (rdma_create_qp), and its callers post,
// poll and drain them through package ibv like any other.

// Adopt wraps ctx, a struct ibv_context * another library opened (a CM
// ID's verbs), as an ibv.Context: PDs, CQs and completion channels are
// created on it and its async events read as on a context of Open. Close
// stops the event reader and leaves the device open: its owner closes it,
// after the Close. Without libibverbs it returns Load's *LoadError; a nil
// ctx is ibv.ErrInvalidArgument.
func Adopt(ctx unsafe.Pointer) (ibv.Context, error) {
	if err := load(); err != nil {
		return nil, fmt.Errorf("adopting a device context: %w", err)
	}
	if ctx == nil {
		return nil, fmt.Errorf("adopting a nil device context: %w", ibv.ErrInvalidArgument)
	}
	cctx := (*C.struct_ibv_context)(ctx)
	name := C.GoString(C.qpd_ibv_get_device_name(cctx.device))
	c, err := newContext(cctx, name, false)
	if err != nil {
		return nil, fmt.Errorf("adopting device context of %s: %w", name, err)
	}
	return c, nil
}

// CreateQPWith creates a QP on pd as PD.CreateQP does, with the same
// checks and errors, but through create instead of ibv_create_qp, and
// destroys it on Close through destroy instead of ibv_destroy_qp: the
// hooks for rdma_create_qp and rdma_destroy_qp. create gets the struct
// ibv_pd * of pd and the struct ibv_qp_init_attr * to create with (its
// qp_context set, which create must keep) and returns the struct ibv_qp *
// or nil with the error (an errno is mapped as ibv_create_qp's). pd must
// be a PD of this binding (ibv.ErrInvalidArgument otherwise).
func CreateQPWith(pd ibv.PD, attr ibv.QPInitAttr, create func(pd, init unsafe.Pointer) (unsafe.Pointer, error), destroy func() error) (ibv.QP, error) {
	p, ok := pd.(*verbsPD)
	if !ok || p == nil {
		return nil, fmt.Errorf("creating QP: PD of another implementation: %w", ibv.ErrInvalidArgument)
	}
	if err := p.life.enter(); err != nil {
		return nil, err
	}
	defer p.life.exit()
	q, err := newQP(p, attr, func(pd *C.struct_ibv_pd, init *C.struct_ibv_qp_init_attr) (*C.struct_ibv_qp, error) {
		qp, err := create(unsafe.Pointer(pd), unsafe.Pointer(init))
		return (*C.struct_ibv_qp)(qp), err
	})
	if err != nil {
		return nil, err
	}
	q.destroy = destroy
	return q, nil
}

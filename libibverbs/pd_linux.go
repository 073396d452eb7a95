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
	"github.com/qpdrain/qpdrain/ibv/objtrace"
)

var (
	_ ibv.PD = (*verbsPD)(nil)
	_ ibv.MR = (*verbsMR)(nil)
)

// verbsPD is a protection domain; its users are its MRs, QPs and SRQs.
type verbsPD struct {
	life  lifecycle
	ctx   *verbsContext
	pd    *C.struct_ibv_pd
	trace *objtrace.Record
}

func (p *verbsPD) Context() ibv.Context { return p.ctx }

func (p *verbsPD) RegMR(buf []byte, access ibv.AccessFlags) (ibv.MR, error) {
	if err := p.life.enter(); err != nil {
		return nil, err
	}
	defer p.life.exit()
	if len(buf) == 0 {
		return nil, fmt.Errorf("registering MR of 0 bytes: %w", ibv.ErrInvalidArgument)
	}
	mr, err := C.qpd_reg_mr(p.pd, unsafe.Pointer(&buf[0]), C.size_t(len(buf)), C.int(access))
	if mr == nil {
		return nil, fmt.Errorf("registering MR of %d bytes: %w", len(buf), cErr(err, ibv.ErrResourceLimit))
	}
	p.life.users.Add(1)
	m := &verbsMR{pd: p, mr: mr, buf: buf, lkey: uint32(mr.lkey), rkey: uint32(mr.rkey), addr: uint64(uintptr(mr.addr))}
	m.trace = objtrace.Track("libibverbs MR lkey %#x on %s", uint32(mr.lkey), p.ctx.name)
	return m, nil
}

func (p *verbsPD) CreateQP(attr ibv.QPInitAttr) (ibv.QP, error) {
	if err := p.life.enter(); err != nil {
		return nil, err
	}
	defer p.life.exit()
	return newQP(p, attr, ibvCreateQP)
}

// ibvCreateQP is the qpCreator of PD.CreateQP: ibv_create_qp.
func ibvCreateQP(pd *C.struct_ibv_pd, init *C.struct_ibv_qp_init_attr) (*C.struct_ibv_qp, error) {
	qp, err := C.qpd_ibv_create_qp(pd, init)
	return qp, err
}

func (p *verbsPD) CreateSRQ(attr ibv.SRQAttr) (ibv.SRQ, error) {
	if err := p.life.enter(); err != nil {
		return nil, err
	}
	defer p.life.exit()
	return newSRQ(p, attr)
}

func (p *verbsPD) Close() error {
	return p.life.close("PD", p.trace, func() error {
		return rcCheck(C.qpd_ibv_dealloc_pd(p.pd), "deallocating PD")
	}, &p.ctx.life)
}

// verbsMR is a registered memory region. The memory stays owned by the
// caller, who must keep it mapped until the MR is closed.
type verbsMR struct {
	life  lifecycle
	pd    *verbsPD
	mr    *C.struct_ibv_mr
	buf   []byte
	trace *objtrace.Record

	// Copied at registration: struct ibv_mr is freed by Close, and the
	// keys are read on every post.
	lkey, rkey uint32
	addr       uint64
}

func (m *verbsMR) LKey() uint32 { return m.lkey }
func (m *verbsMR) RKey() uint32 { return m.rkey }
func (m *verbsMR) Addr() uint64 { return m.addr }
func (m *verbsMR) Buf() []byte  { return m.buf }

func (m *verbsMR) Close() error {
	return m.life.close("MR", m.trace, func() error {
		return rcCheck(C.qpd_ibv_dereg_mr(m.mr), "deregistering MR")
	}, &m.pd.life)
}

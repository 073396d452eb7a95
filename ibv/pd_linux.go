//go:build linux && cgo

package ibv

/*
#include "verbs_linux.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/qpdrain/qpdrain/internal/objtrace"
)

var (
	_ PD = (*verbsPD)(nil)
	_ MR = (*verbsMR)(nil)
)

// verbsPD is a protection domain; its users are its MRs, QPs and SRQs.
type verbsPD struct {
	life  lifecycle
	ctx   *verbsContext
	pd    *C.struct_ibv_pd
	trace *objtrace.Record
}

func (p *verbsPD) Context() Context { return p.ctx }

func (p *verbsPD) RegMR(buf []byte, access AccessFlags) (MR, error) {
	if err := p.life.enter(); err != nil {
		return nil, err
	}
	defer p.life.exit()
	if len(buf) == 0 {
		return nil, fmt.Errorf("registering MR of 0 bytes: %w", ErrInvalidArgument)
	}
	mr, err := C.qpd_reg_mr(p.pd, unsafe.Pointer(&buf[0]), C.size_t(len(buf)), C.int(access))
	if mr == nil {
		return nil, fmt.Errorf("registering MR of %d bytes: %w", len(buf), cErr(err, ErrResourceLimit))
	}
	p.life.users.Add(1)
	m := &verbsMR{pd: p, mr: mr, buf: buf, lkey: uint32(mr.lkey), rkey: uint32(mr.rkey), addr: uint64(uintptr(mr.addr))}
	m.trace = objtrace.Track(fmt.Sprintf("libibverbs MR lkey %#x on %s", uint32(mr.lkey), p.ctx.name))
	return m, nil
}

func (p *verbsPD) CreateQP(attr QPInitAttr) (QP, error) {
	if err := p.life.enter(); err != nil {
		return nil, err
	}
	defer p.life.exit()
	return newQP(p, attr)
}

func (p *verbsPD) CreateSRQ(attr SRQAttr) (SRQ, error) {
	if err := p.life.enter(); err != nil {
		return nil, err
	}
	defer p.life.exit()
	return newSRQ(p, attr)
}

func (p *verbsPD) Close() error {
	done, err := p.life.beginClose("PD")
	if done || err != nil {
		return err
	}
	defer p.life.mu.Unlock()
	if rc := C.qpd_ibv_dealloc_pd(p.pd); rc != 0 {
		return fmt.Errorf("deallocating PD: %w", rcErr(rc))
	}
	p.life.closed = true
	p.ctx.life.users.Add(-1)
	p.trace.Release()
	return nil
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
	done, err := m.life.beginClose("MR")
	if done || err != nil {
		return err
	}
	defer m.life.mu.Unlock()
	if rc := C.qpd_ibv_dereg_mr(m.mr); rc != 0 {
		return fmt.Errorf("deregistering MR: %w", rcErr(rc))
	}
	m.life.closed = true
	m.pd.life.users.Add(-1)
	m.trace.Release()
	return nil
}

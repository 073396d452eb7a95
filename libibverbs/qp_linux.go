//go:build linux && cgo

package libibverbs

/*
#include "verbs_linux.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/ibv/objtrace"
)

var (
	_ ibv.QP  = (*verbsQP)(nil)
	_ ibv.SRQ = (*verbsSRQ)(nil)
)

// postBuf is C memory reused for every post on one queue. Go writes the
// WRs and SGEs into it and one cgo call links and posts them, so no Go
// pointer reaches C and a post allocates nothing once the buffer has grown
// to the batch size.
type postBuf struct {
	mu  sync.Mutex
	buf *C.struct_qpd_postbuf
}

func newPostBuf() (*postBuf, error) {
	b := C.qpd_postbuf_new()
	if b == nil {
		return nil, syscall.ENOMEM
	}
	return &postBuf{buf: b}, nil
}

func (b *postBuf) free() {
	C.qpd_postbuf_free(b.buf)
	b.buf = nil
}

// sgeCount is the number of SGEs a batch of WRs needs.
func sgeCount[W ibv.SendWR | ibv.RecvWR](wrs []W) int {
	n := 0
	for i := range wrs {
		switch w := any(&wrs[i]).(type) {
		case *ibv.SendWR:
			n += len(w.SGL)
		case *ibv.RecvWR:
			n += len(w.SGL)
		}
	}
	return n
}

// fillSGEs copies sgl into the C SGE array starting at sges.
func fillSGEs(sges []C.struct_ibv_sge, sgl []ibv.SGE) []C.struct_ibv_sge {
	for i, s := range sgl {
		sges[i] = C.struct_ibv_sge{addr: C.uint64_t(s.Addr), length: C.uint32_t(s.Length), lkey: C.uint32_t(s.LKey)}
	}
	return sges[len(sgl):]
}

// reserve grows b's buffer (b.mu held) to nwr WRs and nsge SGEs and returns
// them. In, the C form of the WRs, is qpd_send for a send (which also tells
// C to size the chain of ibv_send_wr) or qpd_recv. A failure is the first
// WR's: nothing of the batch was posted.
func reserve[In C.struct_qpd_send | C.struct_qpd_recv](b *postBuf, nwr, nsge int) ([]In, []C.struct_ibv_sge, error) {
	// Checked here, not only in C: a batch that fits, nearly every one once
	// the buffer has grown, then costs no cgo call.
	if nwr > int(b.buf.wr_cap) || nsge > int(b.buf.sge_cap) {
		send := C.int(0)
		if _, ok := any((*In)(nil)).(*C.struct_qpd_send); ok {
			send = 1
		}
		if rc := C.qpd_postbuf_reserve(b.buf, C.int(nwr), C.int(nsge), send); rc != 0 {
			return nil, nil, &ibv.PostError{Index: 0, Err: rcErr(rc)}
		}
	}
	return unsafe.Slice((*In)(b.buf.in), nwr), unsafe.Slice(b.buf.sge, nsge), nil
}

// postSend writes wrs into the buffer and posts them on qp. As a provider
// does with a WR it rejects (bad_wr), a WR the binding cannot express ends
// the batch: the WRs before it are posted, and the error names it.
func (b *postBuf) postSend(qp *C.struct_ibv_qp, wrs []ibv.SendWR) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	in, sges, err := reserve[C.struct_qpd_send](b, len(wrs), sgeCount(wrs))
	if err != nil {
		return err
	}
	for i := range wrs {
		w := &wrs[i]
		if w.Opcode == ibv.WRBindMW || w.Opcode == ibv.WRTSO {
			// SendWR has no memory window or TSO header fields.
			return b.postPrefix(qp, i, w.Opcode)
		}
		in[i] = C.struct_qpd_send{
			wr_id:       C.uint64_t(w.ID),
			remote_addr: C.uint64_t(w.RemoteAddr),
			compare_add: C.uint64_t(w.CompareAdd),
			swap:        C.uint64_t(w.Swap),
			opcode:      C.uint32_t(w.Opcode),
			flags:       C.uint32_t(w.Flags),
			imm_data:    C.uint32_t(w.ImmData),
			rkey:        C.uint32_t(w.RKey),
			num_sge:     C.uint32_t(len(w.SGL)),
		}
		sges = fillSGEs(sges, w.SGL)
	}
	var bad C.int
	if rc := C.qpd_post_send(qp, b.buf, C.int(len(wrs)), &bad); rc != 0 {
		return &ibv.PostError{Index: int(bad), Err: rcErr(rc, ibv.ErrQueueFull)}
	}
	return nil
}

// postPrefix posts the n WRs already in the buffer, those before WR n,
// whose opcode op the binding cannot post, and reports WR n. It is out of
// postSend's loop so the common path stays as tight as it was.
func (b *postBuf) postPrefix(qp *C.struct_ibv_qp, n int, op ibv.WROpcode) error {
	if n > 0 {
		var bad C.int
		if rc := C.qpd_post_send(qp, b.buf, C.int(n), &bad); rc != 0 {
			return &ibv.PostError{Index: int(bad), Err: rcErr(rc, ibv.ErrQueueFull)}
		}
	}
	return &ibv.PostError{Index: n, Err: fmt.Errorf("opcode %s: %w", op, ibv.ErrNotSupported)}
}

// postRecv writes wrs into the buffer and posts them on qp or, when qp is
// nil, on srq.
func (b *postBuf) postRecv(qp *C.struct_ibv_qp, srq *C.struct_ibv_srq, wrs []ibv.RecvWR) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	in, sges, err := reserve[C.struct_qpd_recv](b, len(wrs), sgeCount(wrs))
	if err != nil {
		return err
	}
	for i := range wrs {
		in[i] = C.struct_qpd_recv{wr_id: C.uint64_t(wrs[i].ID), num_sge: C.uint32_t(len(wrs[i].SGL))}
		sges = fillSGEs(sges, wrs[i].SGL)
	}
	var bad C.int
	if rc := C.qpd_post_recv(qp, srq, b.buf, C.int(len(wrs)), &bad); rc != 0 {
		return &ibv.PostError{Index: int(bad), Err: rcErr(rc, ibv.ErrQueueFull)}
	}
	return nil
}

// verbsSRQ is a shared receive queue; its users are the QPs attached to it.
type verbsSRQ struct {
	life   lifecycle
	pd     *verbsPD
	srq    *C.struct_ibv_srq
	handle uintptr
	post   *postBuf
	trace  *objtrace.Record
}

func newSRQ(p *verbsPD, attr ibv.SRQAttr) (*verbsSRQ, error) {
	post, err := newPostBuf()
	if err != nil {
		return nil, fmt.Errorf("creating SRQ: %w", err)
	}
	s := &verbsSRQ{pd: p, post: post}
	s.handle = p.ctx.objs.add(s)
	init := C.struct_ibv_srq_init_attr{attr: C.struct_ibv_srq_attr{
		max_wr:    C.uint32_t(attr.MaxWR),
		max_sge:   C.uint32_t(attr.MaxSGE),
		srq_limit: C.uint32_t(attr.SRQLimit),
	}}
	srq, err := C.qpd_create_srq(p.pd, &init, C.uintptr_t(s.handle))
	if srq == nil {
		p.ctx.objs.remove(s.handle)
		post.free()
		return nil, fmt.Errorf("creating SRQ of %d WRs: %w", attr.MaxWR, cErr(err, ibv.ErrResourceLimit))
	}
	s.srq = srq
	p.life.users.Add(1)
	s.trace = objtrace.Track("libibverbs SRQ of %d WRs on %s", attr.MaxWR, p.ctx.name)
	return s, nil
}

func (s *verbsSRQ) PostRecv(wrs []ibv.RecvWR) error {
	if err := s.life.enter(); err != nil {
		return err
	}
	defer s.life.exit()
	if len(wrs) == 0 {
		return nil
	}
	return s.post.postRecv(nil, s.srq, wrs)
}

func (s *verbsSRQ) Query() (ibv.SRQAttr, error) {
	if err := s.life.enter(); err != nil {
		return ibv.SRQAttr{}, err
	}
	defer s.life.exit()
	var a C.struct_ibv_srq_attr
	if rc := C.qpd_ibv_query_srq(s.srq, &a); rc != 0 {
		return ibv.SRQAttr{}, fmt.Errorf("querying SRQ: %w", rcErr(rc))
	}
	return ibv.SRQAttr{MaxWR: uint32(a.max_wr), MaxSGE: uint32(a.max_sge), SRQLimit: uint32(a.srq_limit)}, nil
}

func (s *verbsSRQ) Modify(attr ibv.SRQAttr, mask ibv.SRQAttrMask) error {
	if err := s.life.enter(); err != nil {
		return err
	}
	defer s.life.exit()
	a := C.struct_ibv_srq_attr{
		max_wr:    C.uint32_t(attr.MaxWR),
		max_sge:   C.uint32_t(attr.MaxSGE),
		srq_limit: C.uint32_t(attr.SRQLimit),
	}
	return rcCheck(C.qpd_ibv_modify_srq(s.srq, &a, C.int(mask)), "modifying SRQ")
}

func (s *verbsSRQ) Close() error {
	return s.life.close("SRQ", s.trace, func() error {
		if rc := C.qpd_ibv_destroy_srq(s.srq); rc != 0 {
			return fmt.Errorf("destroying SRQ: %w", rcErr(rc))
		}
		s.pd.ctx.objs.remove(s.handle)
		s.post.free()
		return nil
	}, &s.pd.life)
}

// verbsQP is a queue pair. It keeps its PD, CQs and SRQ open until Close.
type verbsQP struct {
	life     lifecycle
	pd       *verbsPD
	qp       *C.struct_ibv_qp
	num      uint32
	typ      ibv.QPType
	sendCQ   *verbsCQ
	recvCQ   *verbsCQ
	srq      *verbsSRQ
	sigAll   bool
	handle   uintptr
	sendPost *postBuf
	recvPost *postBuf
	trace    *objtrace.Record
	resets   atomic.Uint64 // moves to RESET (Resets)
	// destroy, when not nil, destroys the QP instead of ibv_destroy_qp
	// (CreateQPWith).
	destroy func() error
}

// users lists the objects a QP holds open, each once, in the order it
// acquires them. Once matters: taking one RWMutex shared twice deadlocks
// when a Close queues for it in between.
func (q *verbsQP) users() []*lifecycle {
	l := []*lifecycle{&q.sendCQ.life}
	if q.recvCQ != q.sendCQ {
		l = append(l, &q.recvCQ.life)
	}
	if q.srq != nil {
		l = append(l, &q.srq.life)
	}
	return l
}

// qpCreator creates a QP from init (whose qp_context is already the QP's
// handle) on pd: ibv_create_qp, or the hook of CreateQPWith.
type qpCreator func(pd *C.struct_ibv_pd, init *C.struct_ibv_qp_init_attr) (*C.struct_ibv_qp, error)

func newQP(p *verbsPD, attr ibv.QPInitAttr, create qpCreator) (*verbsQP, error) {
	q := &verbsQP{pd: p, typ: attr.Type, sigAll: attr.SigAll}
	var ok bool
	if q.sendCQ, ok = attr.SendCQ.(*verbsCQ); !ok || q.sendCQ == nil || q.sendCQ.ctx != p.ctx {
		return nil, fmt.Errorf("creating QP: send CQ missing or of another device: %w", ibv.ErrInvalidArgument)
	}
	if q.recvCQ, ok = attr.RecvCQ.(*verbsCQ); !ok || q.recvCQ == nil || q.recvCQ.ctx != p.ctx {
		return nil, fmt.Errorf("creating QP: receive CQ missing or of another device: %w", ibv.ErrInvalidArgument)
	}
	if attr.SRQ != nil {
		if q.srq, ok = attr.SRQ.(*verbsSRQ); !ok || q.srq == nil || q.srq.pd.ctx != p.ctx {
			return nil, fmt.Errorf("creating QP: SRQ of another device: %w", ibv.ErrInvalidArgument)
		}
	}
	// Hold the CQs and SRQ open while the QP is created.
	for i, l := range q.users() {
		if err := l.enter(); err != nil {
			for _, u := range q.users()[:i] {
				u.exit()
			}
			return nil, fmt.Errorf("creating QP: %w", err)
		}
	}
	defer func() {
		for _, l := range q.users() {
			l.exit()
		}
	}()
	var err error
	if q.sendPost, err = newPostBuf(); err != nil {
		return nil, fmt.Errorf("creating QP: %w", err)
	}
	if q.recvPost, err = newPostBuf(); err != nil {
		q.sendPost.free()
		return nil, fmt.Errorf("creating QP: %w", err)
	}
	init := C.struct_ibv_qp_init_attr{
		send_cq: q.sendCQ.cq,
		recv_cq: q.recvCQ.cq,
		cap: C.struct_ibv_qp_cap{
			max_send_wr:     C.uint32_t(attr.Cap.MaxSendWR),
			max_recv_wr:     C.uint32_t(attr.Cap.MaxRecvWR),
			max_send_sge:    C.uint32_t(attr.Cap.MaxSendSGE),
			max_recv_sge:    C.uint32_t(attr.Cap.MaxRecvSGE),
			max_inline_data: C.uint32_t(attr.Cap.MaxInlineData),
		},
		qp_type: C.enum_ibv_qp_type(attr.Type),
	}
	if q.srq != nil {
		init.srq = q.srq.srq
	}
	if attr.SigAll {
		init.sq_sig_all = 1
	}
	q.handle = p.ctx.objs.add(q)
	C.qpd_set_qp_context(&init, C.uintptr_t(q.handle))
	qp, err := create(p.pd, &init)
	if qp == nil {
		p.ctx.objs.remove(q.handle)
		q.sendPost.free()
		q.recvPost.free()
		if _, isErrno := err.(syscall.Errno); !isErrno && err != nil {
			return nil, fmt.Errorf("creating %s QP: %w", attr.Type, err)
		}
		return nil, fmt.Errorf("creating %s QP: %w", attr.Type, cErr(err, ibv.ErrResourceLimit))
	}
	q.setQP(unsafe.Pointer(qp))
	p.life.users.Add(1)
	for _, l := range q.users() {
		l.users.Add(1)
	}
	q.trace = objtrace.Track("libibverbs %s QP %d on %s", attr.Type, q.num, p.ctx.name)
	return q, nil
}

// setQP gives q its struct ibv_qp. It takes an unsafe.Pointer so the
// benchmark of the binding's own cost can give it a QP of a fake provider
// (internal/testing/cverbs).
func (q *verbsQP) setQP(qp unsafe.Pointer) {
	q.qp = (*C.struct_ibv_qp)(qp)
	q.num = uint32(q.qp.qp_num)
}

func (q *verbsQP) Num() uint32      { return q.num }
func (q *verbsQP) Type() ibv.QPType { return q.typ }
func (q *verbsQP) SendCQ() ibv.CQ   { return q.sendCQ }
func (q *verbsQP) RecvCQ() ibv.CQ   { return q.recvCQ }

func (q *verbsQP) SRQ() ibv.SRQ {
	if q.srq == nil {
		return nil // a typed nil would not compare equal to nil
	}
	return q.srq
}

func (q *verbsQP) Modify(attr ibv.QPAttr, mask ibv.QPAttrMask) error {
	if err := q.life.enter(); err != nil {
		return err
	}
	defer q.life.exit()
	a := qpAttrToC(attr)
	if rc := C.qpd_ibv_modify_qp(q.qp, &a, C.int(mask)); rc != 0 {
		return fmt.Errorf("modifying QP %d (%s): %w", q.num, mask, rcErr(rc))
	}
	if mask&ibv.QPAttrState != 0 && attr.State == ibv.QPSReset {
		// The events the provider queued before the QP left its error
		// episode are read, and stamped with it, before the reset counts.
		c := q.pd.ctx
		c.readPending()
		q.resets.Add(1)
	}
	return nil
}

func (q *verbsQP) Resets() uint64 { return q.resets.Load() }

func (q *verbsQP) Query(mask ibv.QPAttrMask) (ibv.QPAttr, ibv.QPInitAttr, error) {
	if err := q.life.enter(); err != nil {
		return ibv.QPAttr{}, ibv.QPInitAttr{}, err
	}
	defer q.life.exit()
	var a C.struct_ibv_qp_attr
	var init C.struct_ibv_qp_init_attr
	if rc := C.qpd_ibv_query_qp(q.qp, &a, C.int(mask), &init); rc != 0 {
		return ibv.QPAttr{}, ibv.QPInitAttr{}, fmt.Errorf("querying QP %d: %w", q.num, rcErr(rc))
	}
	ia := ibv.QPInitAttr{
		SendCQ: q.sendCQ,
		RecvCQ: q.recvCQ,
		SRQ:    q.SRQ(),
		Cap:    qpCapFromC(init.cap),
		Type:   q.typ,
		SigAll: q.sigAll,
	}
	return qpAttrFromC(&a), ia, nil
}

func (q *verbsQP) PostSend(wrs []ibv.SendWR) error {
	if err := q.life.enter(); err != nil {
		return err
	}
	defer q.life.exit()
	if len(wrs) == 0 {
		return nil
	}
	return q.sendPost.postSend(q.qp, wrs)
}

func (q *verbsQP) PostRecv(wrs []ibv.RecvWR) error {
	if err := q.life.enter(); err != nil {
		return err
	}
	defer q.life.exit()
	if q.srq != nil {
		return &ibv.PostError{Index: 0, Err: fmt.Errorf("QP %d receives from an SRQ: %w", q.num, ibv.ErrInvalidArgument)}
	}
	if len(wrs) == 0 {
		return nil
	}
	return q.recvPost.postRecv(q.qp, nil, wrs)
}

func (q *verbsQP) Close() error {
	return q.life.close(fmt.Sprintf("QP %d", q.num), q.trace, func() error {
		if q.destroy != nil {
			if err := q.destroy(); err != nil {
				return fmt.Errorf("destroying QP %d: %w", q.num, err)
			}
		} else if rc := C.qpd_ibv_destroy_qp(q.qp); rc != 0 {
			return fmt.Errorf("destroying QP %d: %w", q.num, rcErr(rc))
		}
		q.pd.ctx.objs.remove(q.handle)
		q.sendPost.free()
		q.recvPost.free()
		return nil
	}, append(q.users(), &q.pd.life)...)
}

func qpCapFromC(c C.struct_ibv_qp_cap) ibv.QPCap {
	return ibv.QPCap{
		MaxSendWR:     uint32(c.max_send_wr),
		MaxRecvWR:     uint32(c.max_recv_wr),
		MaxSendSGE:    uint32(c.max_send_sge),
		MaxRecvSGE:    uint32(c.max_recv_sge),
		MaxInlineData: uint32(c.max_inline_data),
	}
}

func boolToU8(b bool) C.uint8_t {
	if b {
		return 1
	}
	return 0
}

func qpAttrToC(a ibv.QPAttr) C.struct_ibv_qp_attr {
	return C.struct_ibv_qp_attr{
		qp_state:        C.enum_ibv_qp_state(a.State),
		cur_qp_state:    C.enum_ibv_qp_state(a.CurState),
		path_mtu:        C.enum_ibv_mtu(a.PathMTU),
		qkey:            C.uint32_t(a.QKey),
		rq_psn:          C.uint32_t(a.RQPSN),
		sq_psn:          C.uint32_t(a.SQPSN),
		dest_qp_num:     C.uint32_t(a.DestQPNum),
		qp_access_flags: C.uint(a.AccessFlags),
		cap: C.struct_ibv_qp_cap{
			max_send_wr:     C.uint32_t(a.Cap.MaxSendWR),
			max_recv_wr:     C.uint32_t(a.Cap.MaxRecvWR),
			max_send_sge:    C.uint32_t(a.Cap.MaxSendSGE),
			max_recv_sge:    C.uint32_t(a.Cap.MaxRecvSGE),
			max_inline_data: C.uint32_t(a.Cap.MaxInlineData),
		},
		ah_attr: C.struct_ibv_ah_attr{
			grh: C.struct_ibv_global_route{
				dgid:          C.union_ibv_gid(a.AH.GRH.DGID),
				flow_label:    C.uint32_t(a.AH.GRH.FlowLabel),
				sgid_index:    C.uint8_t(a.AH.GRH.SGIDIndex),
				hop_limit:     C.uint8_t(a.AH.GRH.HopLimit),
				traffic_class: C.uint8_t(a.AH.GRH.TrafficClass),
			},
			dlid:          C.uint16_t(a.AH.DLID),
			sl:            C.uint8_t(a.AH.SL),
			src_path_bits: C.uint8_t(a.AH.SrcPathBits),
			static_rate:   C.uint8_t(a.AH.StaticRate),
			is_global:     boolToU8(a.AH.IsGlobal),
			port_num:      C.uint8_t(a.AH.PortNum),
		},
		pkey_index:          C.uint16_t(a.PKeyIndex),
		en_sqd_async_notify: boolToU8(a.EnSQDAsyncNotify),
		max_rd_atomic:       C.uint8_t(a.MaxRdAtomic),
		max_dest_rd_atomic:  C.uint8_t(a.MaxDestRdAtomic),
		min_rnr_timer:       C.uint8_t(a.MinRNRTimer),
		port_num:            C.uint8_t(a.PortNum),
		timeout:             C.uint8_t(a.Timeout),
		retry_cnt:           C.uint8_t(a.RetryCnt),
		rnr_retry:           C.uint8_t(a.RNRRetry),
	}
}

func qpAttrFromC(a *C.struct_ibv_qp_attr) ibv.QPAttr {
	return ibv.QPAttr{
		State:       ibv.QPState(a.qp_state),
		CurState:    ibv.QPState(a.cur_qp_state),
		PathMTU:     ibv.MTU(a.path_mtu),
		QKey:        uint32(a.qkey),
		RQPSN:       uint32(a.rq_psn),
		SQPSN:       uint32(a.sq_psn),
		DestQPNum:   uint32(a.dest_qp_num),
		AccessFlags: ibv.AccessFlags(a.qp_access_flags),
		Cap:         qpCapFromC(a.cap),
		AH: ibv.AHAttr{
			GRH: ibv.GlobalRoute{
				DGID:         ibv.GID(a.ah_attr.grh.dgid),
				FlowLabel:    uint32(a.ah_attr.grh.flow_label),
				SGIDIndex:    uint8(a.ah_attr.grh.sgid_index),
				HopLimit:     uint8(a.ah_attr.grh.hop_limit),
				TrafficClass: uint8(a.ah_attr.grh.traffic_class),
			},
			DLID:        uint16(a.ah_attr.dlid),
			SL:          uint8(a.ah_attr.sl),
			SrcPathBits: uint8(a.ah_attr.src_path_bits),
			StaticRate:  uint8(a.ah_attr.static_rate),
			IsGlobal:    a.ah_attr.is_global != 0,
			PortNum:     uint8(a.ah_attr.port_num),
		},
		PKeyIndex:        uint16(a.pkey_index),
		EnSQDAsyncNotify: a.en_sqd_async_notify != 0,
		SQDraining:       a.sq_draining != 0,
		MaxRdAtomic:      uint8(a.max_rd_atomic),
		MaxDestRdAtomic:  uint8(a.max_dest_rd_atomic),
		MinRNRTimer:      uint8(a.min_rnr_timer),
		PortNum:          uint8(a.port_num),
		Timeout:          uint8(a.timeout),
		RetryCnt:         uint8(a.retry_cnt),
		RNRRetry:         uint8(a.rnr_retry),
	}
}

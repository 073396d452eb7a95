//go:build linux && cgo

package libibverbs

/*
#include <stdlib.h>
#include "verbs_linux.h"
*/
import "C"

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/ibv/objtrace"
)

var (
	_ ibv.CQ          = (*verbsCQ)(nil)
	_ ibv.CompChannel = (*verbsCompChannel)(nil)
)

// verbsCompChannel is a completion channel whose fd is non-blocking, so
// WaitCQ can wait on it and on an eventfd that ctx or Close signal.
type verbsCompChannel struct {
	life    lifecycle
	ctx     *verbsContext
	ch      *C.struct_ibv_comp_channel
	fd      int32 // the channel's fd, copied: ch is freed by Close
	closing atomic.Bool
	woken   atomic.Bool // Wake called, not yet taken by a WaitCQ
	waitMu  sync.Mutex  // one WaitCQ at a time: they share wakeFD
	trace   *objtrace.Record

	// wakeMu orders a late wake-up (Wake's, context.AfterFunc's) before
	// Close closes wakeFD, so the wake never writes to a reused fd number.
	wakeMu     sync.RWMutex
	wakeFD     int
	wakeClosed bool
}

func newCompChannel(c *verbsContext) (*verbsCompChannel, error) {
	ch, err := C.qpd_ibv_create_comp_channel(c.ctx)
	if ch == nil {
		return nil, fmt.Errorf("creating completion channel on %s: %w", c.name, cErr(err, ibv.ErrResourceLimit))
	}
	fail := func(err error) (*verbsCompChannel, error) {
		C.qpd_ibv_destroy_comp_channel(ch)
		return nil, fmt.Errorf("creating completion channel on %s: %w", c.name, err)
	}
	if err := unix.SetNonblock(int(ch.fd), true); err != nil {
		return fail(err)
	}
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fail(err)
	}
	c.life.users.Add(1)
	cc := &verbsCompChannel{ctx: c, ch: ch, fd: int32(ch.fd), wakeFD: fd}
	cc.trace = objtrace.Track("libibverbs completion channel fd %d on %s", int(ch.fd), c.name)
	return cc, nil
}

func (cc *verbsCompChannel) WaitCQ(ctx context.Context) (ibv.CQ, error) {
	cc.waitMu.Lock()
	defer cc.waitMu.Unlock()
	stop := context.AfterFunc(ctx, cc.wake)
	defer stop()
	fds := []unix.PollFd{
		{Fd: cc.fd, Events: unix.POLLIN},
		{Fd: int32(cc.wakeFD), Events: unix.POLLIN},
	}
	for {
		if cc.closing.Load() {
			return nil, ibv.ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if cc.woken.Swap(false) {
			return nil, ibv.ErrWoken
		}
		var h C.uintptr_t
		rc := C.qpd_get_cq_event(cc.ch, &h)
		switch {
		case rc == 0:
			// A CQ closed after its event was read is no longer anyone's
			// business; keep waiting for the next.
			if cq, ok := cc.ctx.objs.get(uintptr(h)).(*verbsCQ); ok {
				return cq, nil
			}
			continue
		case rc != C.int(syscall.EAGAIN):
			return nil, fmt.Errorf("reading CQ event: %w", rcErr(rc))
		}
		if _, err := unix.Poll(fds, -1); err != nil && err != unix.EINTR {
			return nil, fmt.Errorf("waiting for CQ event: %w", err)
		}
		if fds[1].Revents != 0 {
			var buf [8]byte
			_, _ = unix.Read(cc.wakeFD, buf[:]) // reset; the loop re-checks why
		}
	}
}

func (cc *verbsCompChannel) Wake() {
	cc.woken.Store(true)
	cc.wake()
}

// wake interrupts a WaitCQ, unless Close has closed wakeFD already.
func (cc *verbsCompChannel) wake() {
	cc.wakeMu.RLock()
	defer cc.wakeMu.RUnlock()
	if !cc.wakeClosed {
		wakeEventfd(cc.wakeFD)
	}
}

func (cc *verbsCompChannel) Close() error {
	return cc.life.close("completion channel", cc.trace, func() error {
		// Wake a WaitCQ and wait for it to return before destroying the fd.
		cc.closing.Store(true)
		cc.wake()
		cc.waitMu.Lock()
		defer cc.waitMu.Unlock()
		if rc := C.qpd_ibv_destroy_comp_channel(cc.ch); rc != 0 {
			cc.closing.Store(false)
			return fmt.Errorf("destroying completion channel: %w", rcErr(rc))
		}
		cc.wakeMu.Lock()
		unix.Close(cc.wakeFD)
		cc.wakeClosed = true
		cc.wakeMu.Unlock()
		return nil
	}, &cc.ctx.life)
}

// pollBatch is the number of ibv_wc a CQ's poll array starts with; it grows
// to the largest batch asked for.
const pollBatch = 16

// verbsCQ is a completion queue; its users are the QPs that complete into
// it. Poll reuses one C array of ibv_wc, so a poll is one cgo call and no
// allocation.
type verbsCQ struct {
	life    lifecycle
	ctx     *verbsContext
	cq      *C.struct_ibv_cq
	channel *verbsCompChannel
	handle  uintptr
	cqe     int
	trace   *objtrace.Record

	pollMu sync.Mutex        // guards wc, and the CQ itself against Close
	wc     []C.struct_ibv_wc // nil once closed
}

func newCQ(c *verbsContext, cqe int, channel ibv.CompChannel) (*verbsCQ, error) {
	var ch *verbsCompChannel
	if channel != nil {
		var ok bool
		if ch, ok = channel.(*verbsCompChannel); !ok || ch == nil || ch.ctx != c {
			return nil, fmt.Errorf("creating CQ: completion channel of another device: %w", ibv.ErrInvalidArgument)
		}
		if err := ch.life.enter(); err != nil {
			return nil, fmt.Errorf("creating CQ: %w", err)
		}
		defer ch.life.exit()
	}
	if cqe <= 0 || cqe > math.MaxInt32 {
		return nil, fmt.Errorf("creating CQ of %d entries: %w", cqe, ibv.ErrInvalidArgument)
	}
	q := &verbsCQ{ctx: c, channel: ch}
	q.handle = c.objs.add(q)
	var cch *C.struct_ibv_comp_channel
	if ch != nil {
		cch = ch.ch
	}
	cq, err := C.qpd_create_cq(c.ctx, C.int(cqe), C.uintptr_t(q.handle), cch)
	if cq == nil {
		c.objs.remove(q.handle)
		return nil, fmt.Errorf("creating CQ of %d entries: %w", cqe, cErr(err, ibv.ErrResourceLimit))
	}
	if err := q.setCQ(unsafe.Pointer(cq)); err != nil {
		C.qpd_ibv_destroy_cq(cq)
		c.objs.remove(q.handle)
		return nil, fmt.Errorf("creating CQ: %w", err)
	}
	q.cqe = int(cq.cqe)
	c.life.users.Add(1)
	if ch != nil {
		ch.life.users.Add(1)
	}
	q.trace = objtrace.Track("libibverbs CQ of %d entries on %s", q.cqe, c.name)
	return q, nil
}

// setCQ gives q its struct ibv_cq and the poll array. It takes an
// unsafe.Pointer so the benchmark of the binding's own cost can give it a
// CQ of a fake provider (internal/testing/cverbs).
func (q *verbsCQ) setCQ(cq unsafe.Pointer) error {
	wc := C.calloc(pollBatch, C.sizeof_struct_ibv_wc)
	if wc == nil {
		return syscall.ENOMEM
	}
	q.cq = (*C.struct_ibv_cq)(cq)
	q.wc = unsafe.Slice((*C.struct_ibv_wc)(wc), pollBatch)
	return nil
}

func (q *verbsCQ) CQE() int { return q.cqe }

// Poll takes only pollMu, not the lifecycle lock as well: on the hot path
// every atomic counts, and Close holds pollMu while it destroys the CQ.
func (q *verbsCQ) Poll(wcs []ibv.WC) (int, error) {
	q.pollMu.Lock()
	defer q.pollMu.Unlock()
	if q.wc == nil {
		return 0, ibv.ErrClosed
	}
	if len(wcs) == 0 {
		return 0, nil
	}
	if len(wcs) > len(q.wc) {
		p := C.calloc(C.size_t(len(wcs)), C.sizeof_struct_ibv_wc)
		if p == nil {
			return 0, fmt.Errorf("polling CQ: %w", syscall.ENOMEM)
		}
		C.free(unsafe.Pointer(&q.wc[0]))
		q.wc = unsafe.Slice((*C.struct_ibv_wc)(p), len(wcs))
	}
	n := int(C.qpd_poll_cq(q.cq, C.int(len(wcs)), &q.wc[0]))
	if n < 0 {
		return 0, fmt.Errorf("polling CQ: ibv_poll_cq returned %d: %w", n, syscall.EIO)
	}
	for i := range n {
		w := &q.wc[i]
		wcs[i] = ibv.WC{
			ID:        uint64(w.wr_id),
			Status:    ibv.WCStatus(w.status),
			Opcode:    ibv.WCOpcode(w.opcode),
			VendorErr: uint32(w.vendor_err),
			ByteLen:   uint32(w.byte_len),
			QPNum:     uint32(w.qp_num),
			SrcQP:     uint32(w.src_qp),
			Flags:     ibv.WCFlags(w.wc_flags),
			PKeyIndex: uint16(w.pkey_index),
			SLID:      uint16(w.slid),
			SL:        uint8(w.sl),
			DLIDPath:  uint8(w.dlid_path_bits),
		}
		if wcs[i].Flags&ibv.WCFlagWithImm != 0 {
			// imm_data is the first member of an anonymous union, in
			// network byte order.
			wcs[i].ImmData = binary.BigEndian.Uint32(w.anon0[:])
		}
	}
	return n, nil
}

func (q *verbsCQ) ReqNotify(solicitedOnly bool) error {
	if err := q.life.enter(); err != nil {
		return err
	}
	defer q.life.exit()
	if q.channel == nil {
		return fmt.Errorf("arming CQ without a completion channel: %w", ibv.ErrInvalidArgument)
	}
	so := C.int(0)
	if solicitedOnly {
		so = 1
	}
	return rcCheck(C.qpd_req_notify_cq(q.cq, so), "arming CQ")
}

func (q *verbsCQ) Close() error {
	parents := []*lifecycle{&q.ctx.life}
	if q.channel != nil {
		parents = append(parents, &q.channel.life)
	}
	return q.life.close("CQ", q.trace, func() error {
		q.pollMu.Lock()
		defer q.pollMu.Unlock()
		if rc := C.qpd_ibv_destroy_cq(q.cq); rc != 0 {
			return fmt.Errorf("destroying CQ: %w", rcErr(rc))
		}
		q.ctx.objs.remove(q.handle)
		C.free(unsafe.Pointer(&q.wc[0]))
		q.wc = nil
		return nil
	}, parents...)
}

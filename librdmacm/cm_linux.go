//go:build linux && cgo

package librdmacm

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include <sys/socket.h>
#include "cm_linux.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/qpdrain/qpdrain/cm"
	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/ibv/objtrace"
	"github.com/qpdrain/qpdrain/internal/fifo"
	"github.com/qpdrain/qpdrain/libibverbs"
)

// librdmacm is the library's soname, as a linked program records it.
const librdmacm = "librdmacm.so.1"

var load = sync.OnceValue(func() error { return loadFrom(librdmacm) })

// loadFrom opens lib as librdmacm. Only load calls it outside tests: the C
// side keeps its error text in one static buffer.
func loadFrom(lib string) error {
	clib := C.CString(lib)
	defer C.free(unsafe.Pointer(clib))
	var what, why *C.char
	if C.qpd_cm_load(clib, &what, &why) != 0 {
		e := &cm.LoadError{Name: "librdmacm", Package: "librdmacm1", Library: lib, Reason: C.GoString(why)}
		if w := C.GoString(what); w != lib {
			e.Symbol = w
		}
		return e
	}
	return nil
}

// Load opens librdmacm.so.1 at run time, once, and resolves the entry
// points the binding calls. It returns nil, or a *cm.LoadError matching
// ibv.ErrNotSupported. It loads libibverbs too (libibverbs.Load): the
// IDs' devices are handed out through it.
func Load() error {
	if err := libibverbs.Load(); err != nil {
		return err
	}
	return load()
}

// Open returns the RDMA CM of librdmacm, or Load's error.
func Open() (cm.Manager, error) {
	if err := Load(); err != nil {
		return nil, fmt.Errorf("opening the RDMA CM: %w", err)
	}
	return manager{}, nil
}

// manager is librdmacm's cm.Manager.
type manager struct{}

func (manager) CreateID(ps cm.PortSpace) (cm.ID, error) {
	if ps != cm.PSTCP {
		// UD and IB port spaces would need UD QPs and multicast here.
		return nil, fmt.Errorf("creating CM ID in port space %#x: %w", int(ps), ibv.ErrNotSupported)
	}
	ch, err := C.qpd_create_channel()
	if ch == nil {
		return nil, fmt.Errorf("creating CM event channel: %w", errnoErr(err))
	}
	var cid *C.struct_rdma_cm_id
	if rc, err := C.qpd_rdma_create_id(ch, &cid, C.int(ps)); rc != 0 {
		C.qpd_rdma_destroy_event_channel(ch)
		return nil, fmt.Errorf("creating CM ID: %w", errnoErr(err))
	}
	return newID(cid, ch), nil
}

// errnoErr maps an errno of librdmacm to package ibv's sentinel for it
// (ibv.ErrnoError), or EIO when the call set none.
func errnoErr(err error) error {
	errno, ok := err.(syscall.Errno)
	if !ok || errno == 0 {
		return syscall.EIO
	}
	return ibv.ErrnoError(errno)
}

// devices are the ibv.Contexts of librdmacm's device contexts, shared by
// the IDs bound to each and closed (libibverbs.Adopt's Close: the reader
// stops, the device stays librdmacm's) when the last of them closes.
var devices = struct {
	sync.Mutex
	m map[*C.struct_ibv_context]*device
}{m: map[*C.struct_ibv_context]*device{}}

type device struct {
	ctx  ibv.Context
	refs int
}

// acquire returns the shared ibv.Context of vctx and counts one user.
func acquire(vctx *C.struct_ibv_context) (ibv.Context, error) {
	devices.Lock()
	defer devices.Unlock()
	d := devices.m[vctx]
	if d == nil {
		ctx, err := libibverbs.Adopt(unsafe.Pointer(vctx))
		if err != nil {
			return nil, err
		}
		d = &device{ctx: ctx}
		devices.m[vctx] = d
	}
	d.refs++
	return d.ctx, nil
}

// release drops one user of vctx's context, closing it after the last;
// when that fails (PDs or CQs still open: ibv.ErrBusy) the user stays.
func release(vctx *C.struct_ibv_context) error {
	devices.Lock()
	defer devices.Unlock()
	d := devices.m[vctx]
	if d.refs > 1 {
		d.refs--
		return nil
	}
	if err := d.ctx.Close(); err != nil {
		return err
	}
	delete(devices.m, vctx)
	return nil
}

// id is a librdmacm CM ID with its own event channel. mu serializes its
// operations and guards its fields; Close takes it exclusively, so no
// call or poll uses the ID or its channel while they are destroyed.
type id struct {
	mu     sync.RWMutex
	cid    *C.struct_rdma_cm_id
	ch     *C.struct_rdma_event_channel
	vctx   *C.struct_ibv_context // the device acquired, or nil
	ctx    ibv.Context
	closed bool
	qpOpen atomic.Bool
	qpNum  uint32
	trace  *objtrace.Record

	qmu    sync.Mutex // guards events and reqs, filled by read
	events []cm.Event
	reqs   []*id
}

var _ cm.ID = (*id)(nil)

func newID(cid *C.struct_rdma_cm_id, ch *C.struct_rdma_event_channel) *id {
	i := &id{cid: cid, ch: ch}
	i.trace = objtrace.Track("librdmacm CM ID")
	return i
}

// enter starts an operation: it holds mu shared and fails with ErrClosed
// after Close.
func (i *id) enter(op string) error {
	i.mu.RLock()
	if i.closed {
		i.mu.RUnlock()
		return fmt.Errorf("%s: %w", op, ibv.ErrClosed)
	}
	return nil
}

// bindDevice acquires the ID's device context once librdmacm has bound
// the ID to one. Called inside an operation.
func (i *id) bindDevice() error {
	i.qmu.Lock()
	defer i.qmu.Unlock()
	if i.vctx != nil || i.cid.verbs == nil {
		return nil
	}
	ctx, err := acquire(i.cid.verbs)
	if err != nil {
		return err
	}
	i.vctx, i.ctx = i.cid.verbs, ctx
	return nil
}

// pollSlice is the longest a wait polls the channel before it checks its
// context again.
const pollSlice = 10 * time.Millisecond

// wait reads the ID's channel until q has an element, which it pops, ctx
// ends or the ID is closed. Called inside an operation (mu held shared,
// and held again when it returns).
func wait[T any](ctx context.Context, i *id, op string, q *[]T) (T, error) {
	var zero T
	fds := []unix.PollFd{{Fd: int32(C.qpd_channel_fd(i.ch)), Events: unix.POLLIN}}
	for {
		if err := i.read(); err != nil {
			return zero, fmt.Errorf("%s: %w", op, err)
		}
		i.qmu.Lock()
		v, ok := fifo.Pop(q)
		i.qmu.Unlock()
		if ok {
			return v, nil
		}
		if err := ctx.Err(); err != nil {
			return zero, fmt.Errorf("%s: %w", op, err)
		}
		slice := pollSlice
		if d, ok := ctx.Deadline(); ok {
			slice = max(min(slice, time.Until(d)), time.Millisecond)
		}
		if _, err := unix.Poll(fds, int(slice/time.Millisecond)); err != nil && err != unix.EINTR {
			return zero, fmt.Errorf("%s: polling CM events: %w", op, err)
		}
		// Let a Close waiting for mu in: the wait then ends with ErrClosed
		// instead of holding Close off until ctx ends.
		i.mu.RUnlock()
		i.mu.RLock()
		if i.closed {
			return zero, fmt.Errorf("%s: %w", op, ibv.ErrClosed)
		}
	}
}

// read queues every event the channel has: connection requests, with
// their IDs migrated to channels of their own, for GetRequest, the rest
// for the waits and NextEvent.
func (i *id) read() error {
	for {
		var ev C.struct_qpd_cm_event
		rc := C.qpd_get_cm_event(i.ch, &ev)
		if rc == C.int(syscall.EAGAIN) {
			return nil
		}
		if rc != 0 {
			return fmt.Errorf("reading CM event: %w", errnoErr(syscall.Errno(rc)))
		}
		e := cm.Event{Type: cm.EventType(ev._type), Status: int(ev.status)}
		if n := int(ev.private_data_len); n > 0 {
			e.PrivateData = C.GoBytes(unsafe.Pointer(&ev.private_data[0]), C.int(n))
		}
		if e.Type == cm.EventConnectRequest {
			req, err := migrated(ev.id)
			if err != nil {
				return err
			}
			i.qmu.Lock()
			i.reqs = append(i.reqs, req)
			i.qmu.Unlock()
			continue
		}
		if ev.id != i.cid {
			continue // an event of an ID this channel no longer serves
		}
		i.qmu.Lock()
		i.events = append(i.events, e)
		i.qmu.Unlock()
	}
}

// migrated gives the ID of a connection request a channel of its own and
// its device.
func migrated(cid *C.struct_rdma_cm_id) (*id, error) {
	ch, err := C.qpd_create_channel()
	if ch == nil {
		C.qpd_rdma_destroy_id(cid) // rejects the request
		return nil, fmt.Errorf("creating the event channel of a connection request: %w", errnoErr(err))
	}
	if rc, err := C.qpd_rdma_migrate_id(cid, ch); rc != 0 {
		C.qpd_rdma_destroy_id(cid)
		C.qpd_rdma_destroy_event_channel(ch)
		return nil, fmt.Errorf("migrating a connection request's ID: %w", errnoErr(err))
	}
	r := newID(cid, ch)
	if err := r.bindDevice(); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// await waits for the ID's next event and checks it is want.
func (i *id) await(ctx context.Context, op string, want cm.EventType) error {
	e, err := wait(ctx, i, op, &i.events)
	if err != nil {
		return err
	}
	return e.Err(op, want)
}

// timeoutMS is the timeout librdmacm's resolution gets: 2 s (rping's), or
// what is left of ctx when that is less, so that the kernel's answer (an
// error event) comes before the context ends when it can.
func timeoutMS(ctx context.Context) C.int {
	d := 2 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl))
	}
	return C.int(max(d.Milliseconds(), 1))
}

// sockaddr writes ap into ss.
func sockaddr(ss *C.struct_sockaddr_storage, ap netip.AddrPort) {
	a := ap.Addr()
	if a.Is4() {
		b := a.As4()
		C.qpd_sockaddr(ss, C.AF_INET, (*C.uint8_t)(&b[0]), C.uint16_t(ap.Port()))
		return
	}
	b := a.As16()
	C.qpd_sockaddr(ss, C.AF_INET6, (*C.uint8_t)(&b[0]), C.uint16_t(ap.Port()))
}

func (i *id) ResolveAddr(ctx context.Context, src netip.Addr, dst netip.AddrPort) error {
	op := fmt.Sprintf("resolving address %s", dst)
	if err := i.enter(op); err != nil {
		return err
	}
	defer i.mu.RUnlock()
	var csrc, cdst C.struct_sockaddr_storage
	sockaddr(&cdst, dst)
	psrc := (*C.struct_sockaddr_storage)(nil)
	if src.IsValid() {
		sockaddr(&csrc, netip.AddrPortFrom(src, 0))
		psrc = &csrc
	}
	if rc, err := C.qpd_rdma_resolve_addr(i.cid, psrc, &cdst, timeoutMS(ctx)); rc != 0 {
		return fmt.Errorf("%s: %w", op, errnoErr(err))
	}
	if err := i.await(ctx, op, cm.EventAddrResolved); err != nil {
		return err
	}
	return i.bindDevice()
}

func (i *id) ResolveRoute(ctx context.Context) error {
	const op = "resolving route"
	if err := i.enter(op); err != nil {
		return err
	}
	defer i.mu.RUnlock()
	if rc, err := C.qpd_rdma_resolve_route(i.cid, timeoutMS(ctx)); rc != 0 {
		return fmt.Errorf("%s: %w", op, errnoErr(err))
	}
	return i.await(ctx, op, cm.EventRouteResolved)
}

func (i *id) Listen(addr netip.AddrPort, backlog int) error {
	op := fmt.Sprintf("listening on %s", addr)
	if err := i.enter(op); err != nil {
		return err
	}
	defer i.mu.RUnlock()
	var ca C.struct_sockaddr_storage
	sockaddr(&ca, addr)
	if rc, err := C.qpd_rdma_bind_addr(i.cid, &ca); rc != 0 {
		return fmt.Errorf("%s: binding: %w", op, errnoErr(err))
	}
	if rc, err := C.qpd_rdma_listen(i.cid, C.int(backlog)); rc != 0 {
		return fmt.Errorf("%s: %w", op, errnoErr(err))
	}
	return i.bindDevice()
}

func (i *id) GetRequest(ctx context.Context) (cm.ID, error) {
	const op = "waiting for a connection request"
	if err := i.enter(op); err != nil {
		return nil, err
	}
	defer i.mu.RUnlock()
	// Not returned directly: a nil *id would be a non-nil cm.ID.
	r, err := wait(ctx, i, op, &i.reqs)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// connParam is p in C memory; free releases its private data.
func connParam(p cm.ConnParam) (c C.struct_rdma_conn_param, free func()) {
	c.responder_resources = C.uint8_t(orDefault(p.ResponderResources, C.RDMA_MAX_RESP_RES))
	c.initiator_depth = C.uint8_t(orDefault(p.InitiatorDepth, C.RDMA_MAX_INIT_DEPTH))
	c.retry_count = C.uint8_t(orDefault(p.RetryCount, 7))
	c.rnr_retry_count = C.uint8_t(orDefault(p.RNRRetryCount, 7))
	free = func() {}
	if n := min(len(p.PrivateData), 255); n > 0 {
		data := C.CBytes(p.PrivateData[:n])
		c.private_data, c.private_data_len = data, C.uint8_t(n)
		free = func() { C.free(data) }
	}
	return c, free
}

func orDefault(v uint8, def int) int {
	if v == 0 {
		return def
	}
	return int(v)
}

func (i *id) Connect(ctx context.Context, param cm.ConnParam) error {
	return i.establish(ctx, "connecting", param, func(cid *C.struct_rdma_cm_id, cp *C.struct_rdma_conn_param) (C.int, error) {
		rc, err := C.qpd_rdma_connect(cid, cp)
		return rc, err
	})
}

func (i *id) Accept(ctx context.Context, param cm.ConnParam) error {
	return i.establish(ctx, "accepting a connection request", param, func(cid *C.struct_rdma_cm_id, cp *C.struct_rdma_conn_param) (C.int, error) {
		rc, err := C.qpd_rdma_accept(cid, cp)
		return rc, err
	})
}

// establish makes op, rdma_connect or rdma_accept (call), on the ID's QP
// with param, and waits for ESTABLISHED.
func (i *id) establish(ctx context.Context, op string, param cm.ConnParam, call func(*C.struct_rdma_cm_id, *C.struct_rdma_conn_param) (C.int, error)) error {
	if err := i.enter(op); err != nil {
		return err
	}
	defer i.mu.RUnlock()
	if !i.qpOpen.Load() {
		return fmt.Errorf("%s: the ID has no QP: %w", op, ibv.ErrInvalidArgument)
	}
	cp, free := connParam(param)
	defer free()
	if rc, err := call(i.cid, &cp); rc != 0 {
		return fmt.Errorf("%s: %w", op, errnoErr(err))
	}
	return i.await(ctx, op, cm.EventEstablished)
}

func (i *id) Reject(privateData []byte) error {
	const op = "rejecting a connection request"
	if err := i.enter(op); err != nil {
		return err
	}
	defer i.mu.RUnlock()
	var data unsafe.Pointer
	n := min(len(privateData), 255)
	if n > 0 {
		data = C.CBytes(privateData[:n])
		defer C.free(data)
	}
	if rc, err := C.qpd_rdma_reject(i.cid, data, C.uint8_t(n)); rc != 0 {
		return fmt.Errorf("%s: %w", op, errnoErr(err))
	}
	return nil
}

func (i *id) Disconnect() error {
	const op = "disconnecting"
	if err := i.enter(op); err != nil {
		return err
	}
	defer i.mu.RUnlock()
	if rc, err := C.qpd_rdma_disconnect(i.cid); rc != 0 {
		return fmt.Errorf("%s: %w", op, errnoErr(err))
	}
	return nil
}

func (i *id) NextEvent(ctx context.Context) (cm.Event, error) {
	const op = "waiting for a CM event"
	if err := i.enter(op); err != nil {
		return cm.Event{}, err
	}
	defer i.mu.RUnlock()
	return wait(ctx, i, op, &i.events)
}

func (i *id) Context() ibv.Context {
	i.qmu.Lock()
	defer i.qmu.Unlock()
	return i.ctx
}

func (i *id) CreateQP(pd ibv.PD, attr ibv.QPInitAttr) (ibv.QP, error) {
	const op = "creating the CM ID's QP"
	if err := i.enter(op); err != nil {
		return nil, err
	}
	defer i.mu.RUnlock()
	ctx := i.Context()
	switch {
	case ctx == nil || pd.Context() != ctx:
		return nil, fmt.Errorf("%s: the PD is not of the ID's device: %w", op, ibv.ErrInvalidArgument)
	case i.qpOpen.Load():
		return nil, fmt.Errorf("%s: the ID has a QP: %w", op, ibv.ErrInvalidArgument)
	}
	cid := i.cid
	qp, err := libibverbs.CreateQPWith(pd, attr,
		func(pd, init unsafe.Pointer) (unsafe.Pointer, error) {
			qp, err := C.qpd_rdma_create_qp(cid, (*C.struct_ibv_pd)(pd), (*C.struct_ibv_qp_init_attr)(init))
			return unsafe.Pointer(qp), err
		},
		func() error {
			C.qpd_rdma_destroy_qp(cid)
			i.qpOpen.Store(false)
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	i.qpOpen.Store(true)
	i.qpNum = qp.Num()
	return qp, nil
}

// addr is the ID's source (peer false) or destination address.
func (i *id) addr(peer bool) netip.AddrPort {
	if i.enter("") != nil {
		return netip.AddrPort{}
	}
	defer i.mu.RUnlock()
	var b [16]byte
	var port C.uint16_t
	p := C.int(0)
	if peer {
		p = 1
	}
	switch C.qpd_id_addr(i.cid, p, (*C.uint8_t)(&b[0]), &port) {
	case C.AF_INET:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[:4])), uint16(port))
	case C.AF_INET6:
		return netip.AddrPortFrom(netip.AddrFrom16(b), uint16(port))
	}
	return netip.AddrPort{}
}

func (i *id) LocalAddr() netip.AddrPort { return i.addr(false) }
func (i *id) PeerAddr() netip.AddrPort  { return i.addr(true) }

func (i *id) Close() error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.closed {
		return nil
	}
	if i.qpOpen.Load() {
		return fmt.Errorf("closing CM ID: its QP %d is open: %w", i.qpNum, ibv.ErrBusy)
	}
	if i.vctx != nil {
		if err := release(i.vctx); err != nil {
			return fmt.Errorf("closing CM ID: %w", err)
		}
		i.vctx, i.ctx = nil, nil
	}
	// Requests nobody took are rejected by destroying their IDs.
	for _, r := range i.reqs {
		if err := r.Close(); err != nil {
			return errors.Join(fmt.Errorf("closing CM ID: a request's ID: %w", err), i.destroy())
		}
	}
	i.reqs = nil
	return i.destroy()
}

// destroy destroys the ID and its channel. Called with mu held.
func (i *id) destroy() error {
	i.closed = true
	i.trace.Release()
	rc, err := C.qpd_rdma_destroy_id(i.cid)
	C.qpd_rdma_destroy_event_channel(i.ch)
	if rc != 0 {
		return fmt.Errorf("destroying CM ID: %w", errnoErr(err))
	}
	return nil
}

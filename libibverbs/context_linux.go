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
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/ibv/objtrace"
)

var _ ibv.Context = (*verbsContext)(nil)

// Devices lists the RDMA devices libibverbs sees. Without libibverbs it
// returns Load's *LoadError (ErrNotSupported); on a kernel without RDMA
// support an error matching ErrNoDevice; with support but no device an
// empty list.
func Devices() ([]ibv.DeviceInfo, error) {
	if err := load(); err != nil {
		return nil, fmt.Errorf("listing RDMA devices: %w", err)
	}
	var n C.int
	list, err := C.qpd_ibv_get_device_list(&n)
	if list == nil {
		return nil, fmt.Errorf("listing RDMA devices: %w (%w)", ibv.ErrNoDevice, cErr(err))
	}
	defer C.qpd_ibv_free_device_list(list)
	devs := unsafe.Slice(list, int(n))
	out := make([]ibv.DeviceInfo, 0, len(devs))
	for _, d := range devs {
		out = append(out, ibv.DeviceInfo{
			Name:      C.GoString(C.qpd_ibv_get_device_name(d)),
			GUID:      uint64(C.qpd_device_guid(d)),
			NodeType:  ibv.NodeType(d.node_type),
			Transport: ibv.TransportType(d.transport_type),
		})
	}
	return out, nil
}

// Open opens the RDMA device called name through libibverbs and starts the
// goroutine that reads its async events; Close stops it. Without libibverbs
// it returns Load's *LoadError (ErrNotSupported); a name libibverbs does
// not list is ErrNoDevice.
func Open(name string) (ibv.Context, error) {
	if err := load(); err != nil {
		return nil, fmt.Errorf("opening RDMA device %q: %w", name, err)
	}
	var n C.int
	list, err := C.qpd_ibv_get_device_list(&n)
	if list == nil {
		return nil, fmt.Errorf("opening RDMA device %q: %w (%w)", name, ibv.ErrNoDevice, cErr(err))
	}
	defer C.qpd_ibv_free_device_list(list)
	var dev *C.struct_ibv_device
	for _, d := range unsafe.Slice(list, int(n)) {
		if C.GoString(C.qpd_ibv_get_device_name(d)) == name {
			dev = d
			break
		}
	}
	if dev == nil {
		return nil, fmt.Errorf("opening RDMA device %q: %w", name, ibv.ErrNoDevice)
	}
	cctx, err := C.qpd_ibv_open_device(dev)
	if cctx == nil {
		return nil, fmt.Errorf("opening RDMA device %q: %w", name, cErr(err))
	}
	c, err := newContext(cctx, name, true)
	if err != nil {
		C.qpd_ibv_close_device(cctx)
		return nil, fmt.Errorf("opening RDMA device %q: %w", name, err)
	}
	return c, nil
}

// newContext wraps cctx and starts its async event reader. An owned
// context closes the device on Close; one Adopt wrapped leaves it to its
// owner.
func newContext(cctx *C.struct_ibv_context, name string, owned bool) (*verbsContext, error) {
	c := &verbsContext{
		ctx:    cctx,
		name:   name,
		owned:  owned,
		notify: make(chan struct{}, 1),
		done:   make(chan struct{}),
	}
	if err := c.startAsync(); err != nil {
		return nil, err
	}
	c.trace = objtrace.Track("libibverbs context %s", name)
	return c, nil
}

// verbsContext is a device opened through libibverbs.
type verbsContext struct {
	life lifecycle
	ctx  *C.struct_ibv_context
	name string
	objs handles
	// owned: Close closes the device (Open); otherwise its owner does
	// (Adopt).
	owned bool

	// The async event reader: stop wakes it, asyncDone closes when it ends.
	stopFD    int
	asyncDone chan struct{}

	// readMu serializes reading the async fd (readPending).
	readMu sync.Mutex
	// Events read and not yet returned by NextAsyncEvent. notify holds a
	// token while events are queued; done closes on Close.
	evMu     sync.Mutex
	events   []ibv.AsyncEvent
	asyncErr error
	notify   chan struct{}
	done     chan struct{}

	trace *objtrace.Record
}

func (c *verbsContext) Name() string { return c.name }

func (c *verbsContext) Info() ibv.DeviceInfo {
	d := c.ctx.device
	return ibv.DeviceInfo{Name: c.name, GUID: uint64(C.qpd_device_guid(d)),
		NodeType: ibv.NodeType(d.node_type), Transport: ibv.TransportType(d.transport_type)}
}

func (c *verbsContext) QueryDevice() (ibv.DeviceAttr, error) {
	if err := c.life.enter(); err != nil {
		return ibv.DeviceAttr{}, err
	}
	defer c.life.exit()
	var a C.struct_ibv_device_attr
	if rc := C.qpd_ibv_query_device(c.ctx, &a); rc != 0 {
		return ibv.DeviceAttr{}, fmt.Errorf("querying device %s: %w", c.name, rcErr(rc))
	}
	return ibv.DeviceAttr{
		FWVer:           C.GoString(&a.fw_ver[0]),
		NodeGUID:        be64(unsafe.Pointer(&a.node_guid)),
		SysImageGUID:    be64(unsafe.Pointer(&a.sys_image_guid)),
		MaxMRSize:       uint64(a.max_mr_size),
		PageSizeCap:     uint64(a.page_size_cap),
		VendorID:        uint32(a.vendor_id),
		VendorPartID:    uint32(a.vendor_part_id),
		HWVer:           uint32(a.hw_ver),
		MaxQP:           int(a.max_qp),
		MaxQPWR:         int(a.max_qp_wr),
		DeviceCapFlags:  uint32(a.device_cap_flags),
		MaxSGE:          int(a.max_sge),
		MaxCQ:           int(a.max_cq),
		MaxCQE:          int(a.max_cqe),
		MaxMR:           int(a.max_mr),
		MaxPD:           int(a.max_pd),
		MaxQPRdAtom:     int(a.max_qp_rd_atom),
		MaxQPInitRdAtom: int(a.max_qp_init_rd_atom),
		MaxSRQ:          int(a.max_srq),
		MaxSRQWR:        int(a.max_srq_wr),
		MaxSRQSGE:       int(a.max_srq_sge),
		AtomicCap:       ibv.AtomicCap(a.atomic_cap),
		PhysPortCnt:     uint8(a.phys_port_cnt),
	}, nil
}

// be64 reads a big-endian (__be64) field.
func be64(p unsafe.Pointer) uint64 { return binary.BigEndian.Uint64(unsafe.Slice((*byte)(p), 8)) }

func (c *verbsContext) QueryPort(port uint8) (ibv.PortAttr, error) {
	if err := c.life.enter(); err != nil {
		return ibv.PortAttr{}, err
	}
	defer c.life.exit()
	var a C.struct_ibv_port_attr
	if rc := C.qpd_query_port(c.ctx, C.uint8_t(port), &a); rc != 0 {
		return ibv.PortAttr{}, fmt.Errorf("querying port %s/%d: %w", c.name, port, rcErr(rc))
	}
	return ibv.PortAttr{
		State:        ibv.PortState(a.state),
		MaxMTU:       ibv.MTU(a.max_mtu),
		ActiveMTU:    ibv.MTU(a.active_mtu),
		GIDTblLen:    int(a.gid_tbl_len),
		PortCapFlags: uint32(a.port_cap_flags),
		MaxMsgSz:     uint32(a.max_msg_sz),
		LID:          uint16(a.lid),
		SMLID:        uint16(a.sm_lid),
		LMC:          uint8(a.lmc),
		ActiveWidth:  uint8(a.active_width),
		ActiveSpeed:  uint8(a.active_speed),
		PhysState:    uint8(a.phys_state),
		LinkLayer:    ibv.LinkLayer(a.link_layer),
	}, nil
}

func (c *verbsContext) QueryGID(port uint8, index int) (ibv.GID, error) {
	if err := c.life.enter(); err != nil {
		return ibv.GID{}, err
	}
	defer c.life.exit()
	if index < 0 || index > math.MaxInt32 {
		return ibv.GID{}, fmt.Errorf("querying GID %s/%d index %d: %w", c.name, port, index, ibv.ErrInvalidArgument)
	}
	var g C.union_ibv_gid
	if rc, err := C.qpd_ibv_query_gid(c.ctx, C.uint8_t(port), C.int(index), &g); rc != 0 {
		return ibv.GID{}, fmt.Errorf("querying GID %s/%d index %d: %w", c.name, port, index, cErr(err))
	}
	return ibv.GID(g), nil
}

func (c *verbsContext) QueryGIDTable() ([]ibv.GIDEntry, error) {
	if err := c.life.enter(); err != nil {
		return nil, err
	}
	defer c.life.exit()
	var a C.struct_ibv_device_attr
	if rc := C.qpd_ibv_query_device(c.ctx, &a); rc != 0 {
		return nil, fmt.Errorf("querying GID table of %s: %w", c.name, rcErr(rc))
	}
	total := 0
	for p := 1; p <= int(a.phys_port_cnt); p++ {
		var pa C.struct_ibv_port_attr
		if rc := C.qpd_query_port(c.ctx, C.uint8_t(p), &pa); rc != 0 {
			return nil, fmt.Errorf("querying GID table of %s/%d: %w", c.name, p, rcErr(rc))
		}
		total += int(pa.gid_tbl_len)
	}
	if total == 0 {
		return nil, nil
	}
	entries := (*C.struct_ibv_gid_entry)(C.calloc(C.size_t(total), C.sizeof_struct_ibv_gid_entry))
	if entries == nil {
		return nil, fmt.Errorf("querying GID table of %s: %w", c.name, syscall.ENOMEM)
	}
	defer C.free(unsafe.Pointer(entries))
	n := C.qpd_query_gid_table(c.ctx, entries, C.size_t(total))
	if n < 0 {
		return nil, fmt.Errorf("querying GID table of %s: %w", c.name, errnoErr(syscall.Errno(-n)))
	}
	out := make([]ibv.GIDEntry, 0, int(n))
	for _, e := range unsafe.Slice(entries, int(n)) {
		out = append(out, ibv.GIDEntry{
			GID:         ibv.GID(e.gid),
			Index:       uint32(e.gid_index),
			Port:        uint8(e.port_num),
			Type:        ibv.GIDType(e.gid_type),
			NetdevIndex: uint32(e.ndev_ifindex),
		})
	}
	return out, nil
}

func (c *verbsContext) AllocPD() (ibv.PD, error) {
	if err := c.life.enter(); err != nil {
		return nil, err
	}
	defer c.life.exit()
	pd, err := C.qpd_ibv_alloc_pd(c.ctx)
	if pd == nil {
		return nil, fmt.Errorf("allocating PD on %s: %w", c.name, cErr(err, ibv.ErrResourceLimit))
	}
	c.life.users.Add(1)
	p := &verbsPD{ctx: c, pd: pd}
	p.trace = objtrace.Track("libibverbs PD %d on %s", pd.handle, c.name)
	return p, nil
}

func (c *verbsContext) CreateCompChannel() (ibv.CompChannel, error) {
	if err := c.life.enter(); err != nil {
		return nil, err
	}
	defer c.life.exit()
	return newCompChannel(c)
}

func (c *verbsContext) CreateCQ(cqe int, channel ibv.CompChannel) (ibv.CQ, error) {
	if err := c.life.enter(); err != nil {
		return nil, err
	}
	defer c.life.exit()
	return newCQ(c, cqe, channel)
}

// startAsync makes the async fd non-blocking and starts the goroutine that
// reads it.
func (c *verbsContext) startAsync() error {
	if err := unix.SetNonblock(int(c.ctx.async_fd), true); err != nil {
		return fmt.Errorf("making async fd non-blocking: %w", err)
	}
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("creating eventfd: %w", err)
	}
	c.stopFD = fd
	c.asyncDone = make(chan struct{})
	go c.readAsync()
	return nil
}

// stopAsync stops the reader goroutine and waits until it has returned.
func (c *verbsContext) stopAsync() {
	wakeEventfd(c.stopFD)
	<-c.asyncDone
	unix.Close(c.stopFD)
}

// readAsync reads, acks and queues async events until stopFD is signalled.
func (c *verbsContext) readAsync() {
	defer close(c.asyncDone)
	fds := []unix.PollFd{
		{Fd: int32(c.ctx.async_fd), Events: unix.POLLIN},
		{Fd: int32(c.stopFD), Events: unix.POLLIN},
	}
	for {
		if _, err := unix.Poll(fds, -1); err != nil {
			if err == unix.EINTR {
				continue
			}
			c.failAsync(fmt.Errorf("waiting for async events of %s: %w", c.name, err))
			return
		}
		if fds[1].Revents != 0 {
			return
		}
		if fds[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 {
			c.failAsync(fmt.Errorf("async fd of %s: poll revents %#x: %w", c.name, fds[0].Revents, syscall.EIO))
			return
		}
		if !c.readPending() {
			return
		}
	}
}

// readPending reads, acks and queues every event the device has queued,
// each stamped with its QP's Resets. It holds readMu, which a QP's Modify
// to RESET takes too, to read the events queued before the modify
// returned before it counts the reset. It returns false once the async fd
// failed.
func (c *verbsContext) readPending() bool {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	for {
		var ev C.struct_qpd_async
		rc := C.qpd_get_async_event(c.ctx, &ev)
		if rc == C.int(syscall.EAGAIN) {
			return true
		}
		if rc != 0 {
			c.failAsync(fmt.Errorf("reading async event of %s: %w", c.name, rcErr(rc)))
			return false
		}
		if e, ok := c.mapEvent(ev); ok {
			if q, isQP := e.QP.(*verbsQP); isQP {
				e.QPResets = q.resets.Load()
			}
			c.queue(e)
		}
	}
}

// mapEvent finds the Go object an event concerns. An event for an object
// already closed is dropped: its owner has let go of it (NextAsyncEvent
// drops one whose object closes while it is queued).
func (c *verbsContext) mapEvent(ev C.struct_qpd_async) (ibv.AsyncEvent, bool) {
	e := ibv.AsyncEvent{Type: ibv.EventType(ev._type)}
	ok := true
	switch obj := c.objs.get(uintptr(ev.handle)); ev.elem {
	case C.QPD_ELEM_QP:
		e.QP, ok = obj.(*verbsQP)
	case C.QPD_ELEM_CQ:
		e.CQ, ok = obj.(*verbsCQ)
	case C.QPD_ELEM_SRQ:
		e.SRQ, ok = obj.(*verbsSRQ)
	case C.QPD_ELEM_PORT:
		e.Port = uint8(ev.port)
	}
	return e, ok
}

// ofClosedObject reports whether e concerns a QP, CQ or SRQ closed since
// the event was read: such an event is dropped at delivery too, so no
// caller ever receives an event of an object it has closed.
func (c *verbsContext) ofClosedObject(e ibv.AsyncEvent) bool {
	var h uintptr
	switch {
	case e.QP != nil:
		h = e.QP.(*verbsQP).handle
	case e.CQ != nil:
		h = e.CQ.(*verbsCQ).handle
	case e.SRQ != nil:
		h = e.SRQ.(*verbsSRQ).handle
	default:
		return false
	}
	return c.objs.get(h) == nil
}

func (c *verbsContext) queue(e ibv.AsyncEvent) {
	c.evMu.Lock()
	c.events = append(c.events, e)
	c.evMu.Unlock()
	c.wake()
}

func (c *verbsContext) failAsync(err error) {
	c.evMu.Lock()
	c.asyncErr = err
	c.evMu.Unlock()
	c.wake()
}

// wake leaves notify's token for NextAsyncEvent, unless it is there already.
func (c *verbsContext) wake() {
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

func (c *verbsContext) NextAsyncEvent(ctx context.Context) (ibv.AsyncEvent, error) {
	for {
		c.evMu.Lock()
		if len(c.events) > 0 {
			e := c.events[0]
			c.events[0] = ibv.AsyncEvent{}
			c.events = c.events[1:]
			more := len(c.events) > 0
			c.evMu.Unlock()
			if more {
				c.wake()
			}
			if c.ofClosedObject(e) {
				continue
			}
			return e, nil
		}
		asyncErr := c.asyncErr
		c.evMu.Unlock()
		if asyncErr != nil {
			return ibv.AsyncEvent{}, asyncErr
		}
		select {
		case <-c.notify:
		case <-c.done:
			return ibv.AsyncEvent{}, ibv.ErrClosed
		case <-ctx.Done():
			return ibv.AsyncEvent{}, ctx.Err()
		}
	}
}

func (c *verbsContext) Close() error {
	return c.life.close("device "+c.name, c.trace, func() error {
		c.stopAsync()
		if !c.owned {
			close(c.done)
			return nil
		}
		if rc, err := C.qpd_ibv_close_device(c.ctx); rc != 0 {
			// Keep the context usable so Close can be retried.
			if serr := c.startAsync(); serr != nil {
				return fmt.Errorf("closing device %s: %w (restarting its event reader: %w)", c.name, cErr(err), serr)
			}
			return fmt.Errorf("closing device %s: %w", c.name, cErr(err))
		}
		close(c.done)
		return nil
	})
}

// wakeEventfd adds one to an eventfd counter, waking whoever polls it.
func wakeEventfd(fd int) {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	// The write fails only when the counter would overflow, and then the
	// eventfd is readable already.
	_, _ = unix.Write(fd, one[:])
}

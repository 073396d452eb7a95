package ibv

import "context"

// Context is an open RDMA device (struct ibv_context) and the root of every
// object created on it.
type Context interface {
	// Name is the device name ("rxe0", "mlx5_0", "soft0").
	Name() string
	// Info is the device as libibverbs lists it (struct ibv_device: name,
	// node GUID, node type, transport). Its transport tells an iWARP
	// device (IBV_TRANSPORT_IWARP, node type IBV_NODE_RNIC), whose RC QPs
	// connect only through the RDMA CM, from an InfiniBand or RoCE one.
	// It needs no verbs call and works after Close.
	Info() DeviceInfo
	// QueryDevice returns the device's attributes and limits
	// (ibv_query_device). It fails with ErrClosed after Close.
	QueryDevice() (DeviceAttr, error)
	// QueryPort returns the attributes of port (1-based, ibv_query_port).
	// A port the device does not have is ErrInvalidArgument; after Close,
	// ErrClosed.
	QueryPort(port uint8) (PortAttr, error)
	// QueryGID returns entry index of port's GID table (ibv_query_gid). An
	// index that is negative or does not fit a C int is ErrInvalidArgument
	// (soft: any index or port out of range); after Close, ErrClosed.
	QueryGID(port uint8, index int) (GID, error)
	// QueryGIDTable returns the valid entries of every port's GID table
	// (ibv_query_gid_table). It fails with ErrClosed after Close.
	QueryGIDTable() ([]GIDEntry, error)
	// AllocPD allocates a protection domain. Beyond the device's MaxPD it
	// fails with ErrResourceLimit; after Close, ErrClosed.
	AllocPD() (PD, error)
	// CreateCompChannel creates a completion event channel for CQs. It
	// fails with ErrResourceLimit when memory runs out (ENOMEM) and
	// ErrClosed after Close.
	CreateCompChannel() (CompChannel, error)
	// CreateCQ creates a CQ with room for at least cqe completions. With a
	// non-nil channel, ReqNotify arms it to signal that channel. A cqe of 0
	// or less or above DeviceAttr.MaxCQE, or a channel of another device,
	// is ErrInvalidArgument; beyond MaxCQ CQs, ErrResourceLimit; a closed
	// context or channel, ErrClosed.
	CreateCQ(cqe int, channel CompChannel) (CQ, error)
	// NextAsyncEvent waits for the next asynchronous event of this device.
	// It returns ctx.Err() when ctx ends first and ErrClosed once the
	// context is closed. The event is already acknowledged; an event of a
	// QP, CQ or SRQ closed before it would be returned is dropped.
	NextAsyncEvent(ctx context.Context) (AsyncEvent, error)
	// Close releases the device. It fails with ErrBusy while PDs, CQs or
	// completion channels are still open, and returns nil when already
	// closed.
	Close() error
}

// PD is a protection domain (struct ibv_pd).
type PD interface {
	// Context is the device the PD belongs to.
	Context() Context
	// RegMR registers buf for the access given. buf must not be Go heap
	// memory when the device is real hardware: use AllocBuffer. An empty
	// buf, unknown access flags, or remote write or atomic access without
	// local write (ibv_reg_mr(3)) is ErrInvalidArgument; beyond the
	// device's MaxMR, ErrResourceLimit; a closed PD, ErrClosed.
	RegMR(buf []byte, access AccessFlags) (MR, error)
	// CreateQP creates a QP in RESET (ibv_create_qp) that keeps its CQs
	// and SRQ open until Close. A missing CQ, a CQ or SRQ of another
	// device, or a capability above the device's (DeviceAttr.MaxQPWR,
	// MaxSGE, the provider's inline limit) is ErrInvalidArgument; a QP type
	// the device lacks is ErrNotSupported; beyond MaxQP QPs,
	// ErrResourceLimit; a closed PD, CQ or SRQ, ErrClosed.
	CreateQP(attr QPInitAttr) (QP, error)
	// CreateSRQ creates a shared receive queue (ibv_create_srq). A MaxWR of
	// 0 or above DeviceAttr.MaxSRQWR, a MaxSGE above MaxSRQSGE or a
	// SRQLimit above MaxWR is ErrInvalidArgument; beyond MaxSRQ SRQs,
	// ErrResourceLimit; a closed PD, ErrClosed.
	CreateSRQ(attr SRQAttr) (SRQ, error)
	// Close deallocates the PD. It fails with ErrBusy while MRs, QPs or
	// SRQs of it are open, and returns nil when already closed.
	Close() error
}

// MR is a registered memory region (struct ibv_mr).
type MR interface {
	// LKey is the key local SGEs name the region by.
	LKey() uint32
	// RKey is the key remote RDMA and atomic operations name it by.
	RKey() uint32
	// Addr is the virtual address of the region's first byte, as SGEs and
	// remote peers address it.
	Addr() uint64
	// Buf is the registered memory.
	Buf() []byte
	// Close deregisters the region; the memory stays the caller's. It
	// returns nil when already closed.
	Close() error
}

// CompChannel delivers CQ events (struct ibv_comp_channel).
type CompChannel interface {
	// WaitCQ waits until an armed CQ on this channel has a new completion,
	// returns it and acknowledges the event. The CQ must be re-armed with
	// ReqNotify before it signals again. It returns ctx.Err() when ctx ends
	// first, ErrWoken when Wake ended it, and ErrClosed once the channel is
	// closed.
	WaitCQ(ctx context.Context) (CQ, error)
	// Wake ends the WaitCQ in progress, or else the next one, with
	// ErrWoken, from any goroutine; wakes before a WaitCQ takes them count
	// as one. It is the prompt way for another goroutine to end a wait:
	// ctx's end reaches WaitCQ through a goroutine of context.AfterFunc's,
	// which waits for a processor, while Wake signals the waiting thread
	// from the caller's. After Close it does nothing.
	Wake()
	// Close fails with ErrBusy while a CQ still uses the channel, and
	// returns nil when already closed.
	Close() error
}

// CQ is a completion queue (struct ibv_cq).
type CQ interface {
	// CQE is the number of completions the CQ can hold.
	CQE() int
	// Poll moves up to len(wcs) completions into wcs, oldest first, and
	// returns how many it moved. It does not block. It fails with
	// ErrClosed after Close.
	Poll(wcs []WC) (int, error)
	// ReqNotify arms the CQ to signal its completion channel on the next
	// completion (or the next solicited one). A CQ without a channel is
	// ErrInvalidArgument; after Close, ErrClosed.
	ReqNotify(solicitedOnly bool) error
	// Close fails with ErrBusy while a QP still uses the CQ, and returns
	// nil when already closed.
	Close() error
}

// SRQ is a shared receive queue (struct ibv_srq).
type SRQ interface {
	// PostRecv posts receive WRs. On failure it returns a *PostError whose
	// Index is the first WR not posted: too many SGEs is
	// ErrInvalidArgument, a full SRQ ErrQueueFull, a closed one ErrClosed.
	PostRecv(wrs []RecvWR) error
	// Query returns the SRQ's size and armed limit (0: not armed). It
	// fails with ErrClosed after Close.
	Query() (SRQAttr, error)
	// Modify resizes the SRQ (SRQAttrMaxWR) or arms its limit
	// (SRQAttrLimit) (ibv_modify_srq). An unknown mask bit, a size below
	// the WRs it holds or above DeviceAttr.MaxSRQWR, or a limit above the
	// size is ErrInvalidArgument; after Close, ErrClosed.
	Modify(attr SRQAttr, mask SRQAttrMask) error
	// Close fails with ErrBusy while a QP is still attached, and returns
	// nil when already closed.
	Close() error
}

// QP is a queue pair (struct ibv_qp).
type QP interface {
	// Num is the QP number.
	Num() uint32
	// Type is the transport service the QP was created with.
	Type() QPType
	// Modify changes the QP's state and the attributes mask selects
	// (ibv_modify_qp). A transition ib_modify_qp_is_ok refuses (not in the
	// state table, a required attribute missing, one not allowed given)
	// and a bad attribute value are both ErrInvalidArgument, as libibverbs
	// returns EINVAL for both; the QP is left as it was. After Close,
	// ErrClosed.
	Modify(attr QPAttr, mask QPAttrMask) error
	// Query returns the attributes mask selects and the QP's creation
	// attributes (ibv_query_qp). It fails with ErrClosed after Close.
	Query(mask QPAttrMask) (QPAttr, QPInitAttr, error)
	// PostSend posts send WRs. On failure it returns a *PostError whose
	// Index is the first WR not posted; the WRs before it were posted. An
	// opcode the device lacks is ErrNotSupported; too many SGEs, inline
	// data beyond MaxInlineData or a bad opcode, ErrInvalidArgument; a
	// full send queue, ErrQueueFull; a state that forbids sends (RESET,
	// INIT, RTR), ErrInvalidArgument at WR 0 (rxe_post_send's EINVAL);
	// after Close, ErrClosed.
	PostSend(wrs []SendWR) error
	// PostRecv posts receive WRs; a QP attached to an SRQ refuses them
	// with ErrInvalidArgument. Failures are *PostError as for PostSend: a
	// full receive queue is ErrQueueFull, a QP in RESET
	// ErrInvalidArgument.
	PostRecv(wrs []RecvWR) error
	// SendCQ is the CQ the send queue completes into.
	SendCQ() CQ
	// RecvCQ is the CQ the receive queue completes into.
	RecvCQ() CQ
	// SRQ is the SRQ the QP receives from, or nil.
	SRQ() SRQ
	// Resets is how many times Modify has moved the QP to RESET. A QP
	// leaves ERROR only for RESET (IBTA §10.3.1; qp_state_table in the
	// kernel's drivers/infiniband/core/verbs.c), so it numbers
	// the QP's error episodes: an event whose AsyncEvent.QPResets differs
	// was raised in an earlier one, however late it is delivered.
	Resets() uint64
	// Close destroys the QP and releases its PD, CQs and SRQ. It returns
	// nil when already closed.
	Close() error
}

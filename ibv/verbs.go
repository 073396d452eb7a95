package ibv

import "context"

// Context is an open RDMA device (struct ibv_context) and the root of every
// object created on it.
type Context interface {
	// Name is the device name ("rxe0", "mlx5_0", "soft0").
	Name() string
	QueryDevice() (DeviceAttr, error)
	QueryPort(port uint8) (PortAttr, error)
	QueryGID(port uint8, index int) (GID, error)
	// QueryGIDTable returns the valid entries of every port's GID table.
	QueryGIDTable() ([]GIDEntry, error)
	AllocPD() (PD, error)
	// CreateCompChannel creates a completion event channel for CQs.
	CreateCompChannel() (CompChannel, error)
	// CreateCQ creates a CQ with room for at least cqe completions. With a
	// non-nil channel, ReqNotify arms it to signal that channel.
	CreateCQ(cqe int, channel CompChannel) (CQ, error)
	// NextAsyncEvent waits for the next asynchronous event of this device.
	// It returns ctx.Err() when ctx ends first and ErrClosed once the
	// context is closed. The event is already acknowledged.
	NextAsyncEvent(ctx context.Context) (AsyncEvent, error)
	// Close releases the device. It fails with ErrBusy while PDs, CQs or
	// completion channels are still open.
	Close() error
}

// PD is a protection domain (struct ibv_pd).
type PD interface {
	Context() Context
	// RegMR registers buf for the access given. buf must not be Go heap
	// memory when the device is real hardware: use AllocBuffer.
	RegMR(buf []byte, access AccessFlags) (MR, error)
	CreateQP(attr QPInitAttr) (QP, error)
	CreateSRQ(attr SRQAttr) (SRQ, error)
	Close() error
}

// MR is a registered memory region (struct ibv_mr).
type MR interface {
	LKey() uint32
	RKey() uint32
	// Addr is the virtual address of the region's first byte, as SGEs and
	// remote peers address it.
	Addr() uint64
	// Buf is the registered memory.
	Buf() []byte
	Close() error
}

// CompChannel delivers CQ events (struct ibv_comp_channel).
type CompChannel interface {
	// WaitCQ waits until an armed CQ on this channel has a new completion,
	// returns it and acknowledges the event. The CQ must be re-armed with
	// ReqNotify before it signals again. It returns ctx.Err() when ctx ends
	// first.
	WaitCQ(ctx context.Context) (CQ, error)
	// Close fails with ErrBusy while a CQ still uses the channel.
	Close() error
}

// CQ is a completion queue (struct ibv_cq).
type CQ interface {
	// CQE is the number of completions the CQ can hold.
	CQE() int
	// Poll moves up to len(wcs) completions into wcs, oldest first, and
	// returns how many it moved. It does not block.
	Poll(wcs []WC) (int, error)
	// ReqNotify arms the CQ to signal its completion channel on the next
	// completion (or the next solicited one).
	ReqNotify(solicitedOnly bool) error
	// Close fails with ErrBusy while a QP still uses the CQ.
	Close() error
}

// SRQ is a shared receive queue (struct ibv_srq).
type SRQ interface {
	// PostRecv posts receive WRs. On failure it returns a *PostError whose
	// Index is the first WR not posted.
	PostRecv(wrs []RecvWR) error
	Query() (SRQAttr, error)
	Modify(attr SRQAttr, mask SRQAttrMask) error
	// Close fails with ErrBusy while a QP is still attached.
	Close() error
}

// QP is a queue pair (struct ibv_qp).
type QP interface {
	// Num is the QP number.
	Num() uint32
	Type() QPType
	Modify(attr QPAttr, mask QPAttrMask) error
	Query(mask QPAttrMask) (QPAttr, QPInitAttr, error)
	// PostSend posts send WRs. On failure it returns a *PostError whose
	// Index is the first WR not posted; the WRs before it were posted.
	PostSend(wrs []SendWR) error
	// PostRecv posts receive WRs; it fails for a QP attached to an SRQ.
	PostRecv(wrs []RecvWR) error
	SendCQ() CQ
	RecvCQ() CQ
	// SRQ is the SRQ the QP receives from, or nil.
	SRQ() SRQ
	Close() error
}

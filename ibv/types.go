package ibv

import (
	"fmt"
	"net/netip"
)

// SGE is a scatter/gather element (struct ibv_sge): Length bytes at virtual
// address Addr inside the memory region whose local key is LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendWR is a send work request (struct ibv_send_wr). RemoteAddr and RKey
// address the peer's memory for RDMA and atomic operations; CompareAdd and
// Swap are the atomic operands. ImmData is in host byte order. For
// WRSendWithInv and WRLocalInv, RKey is the key to invalidate.
type SendWR struct {
	ID         uint64
	Opcode     WROpcode
	Flags      SendFlags
	SGL        []SGE
	ImmData    uint32
	RemoteAddr uint64
	RKey       uint32
	CompareAdd uint64
	Swap       uint64
}

// RecvWR is a receive work request (struct ibv_recv_wr).
type RecvWR struct {
	ID  uint64
	SGL []SGE
}

// WC is a work completion (struct ibv_wc). When Status is not WCSuccess only
// ID, Status, QPNum and VendorErr are valid.
type WC struct {
	ID        uint64
	Status    WCStatus
	Opcode    WCOpcode
	VendorErr uint32
	ByteLen   uint32
	ImmData   uint32 // host byte order; valid when Flags has WCFlagWithImm
	QPNum     uint32
	SrcQP     uint32
	Flags     WCFlags
	PKeyIndex uint16
	SLID      uint16
	SL        uint8
	DLIDPath  uint8
}

// String formats the fields valid for the completion's status.
func (wc WC) String() string {
	if wc.Status != WCSuccess {
		return fmt.Sprintf("wr_id=%d qpn=%d status=%s vendor_err=%#x", wc.ID, wc.QPNum, wc.Status, wc.VendorErr)
	}
	return fmt.Sprintf("wr_id=%d qpn=%d status=%s opcode=%s byte_len=%d", wc.ID, wc.QPNum, wc.Status, wc.Opcode, wc.ByteLen)
}

// GID is a 128-bit global identifier (union ibv_gid). For RoCE it holds an
// IPv6 address or an IPv4-mapped one.
type GID [16]byte

// String formats the GID as an IPv6 address, the way sysfs and iproute2 do.
func (g GID) String() string { return netip.AddrFrom16(g).String() }

// IsZero reports whether the GID is all zeros (an unused table entry).
func (g GID) IsZero() bool { return g == GID{} }

// GIDEntry is one entry of a port's GID table (struct ibv_gid_entry).
type GIDEntry struct {
	GID         GID
	Index       uint32
	Port        uint8
	Type        GIDType
	NetdevIndex uint32 // ifindex of the netdev the GID belongs to (RoCE), 0 if none
}

// GlobalRoute is the GRH part of an address vector (struct ibv_global_route).
type GlobalRoute struct {
	DGID         GID
	FlowLabel    uint32
	SGIDIndex    uint8
	HopLimit     uint8
	TrafficClass uint8
}

// AHAttr is an address vector (struct ibv_ah_attr). RoCE needs IsGlobal and GRH.
type AHAttr struct {
	GRH         GlobalRoute
	DLID        uint16
	SL          uint8
	SrcPathBits uint8
	StaticRate  uint8
	IsGlobal    bool
	PortNum     uint8
}

// QPCap is the size of a QP's queues (struct ibv_qp_cap).
type QPCap struct {
	MaxSendWR     uint32
	MaxRecvWR     uint32
	MaxSendSGE    uint32
	MaxRecvSGE    uint32
	MaxInlineData uint32
}

// QPInitAttr describes a QP to create (struct ibv_qp_init_attr). With SRQ
// set the QP takes its receive WQEs from that SRQ and MaxRecvWR is ignored.
// RecvCQ may equal SendCQ. SigAll makes every send WR signaled.
type QPInitAttr struct {
	SendCQ CQ
	RecvCQ CQ
	SRQ    SRQ
	Cap    QPCap
	Type   QPType
	SigAll bool
}

// QPAttr holds QP attributes (struct ibv_qp_attr); a QPAttrMask says which
// fields a Modify or Query uses.
type QPAttr struct {
	State            QPState
	CurState         QPState
	PathMTU          MTU
	QKey             uint32
	RQPSN            uint32
	SQPSN            uint32
	DestQPNum        uint32
	AccessFlags      AccessFlags
	Cap              QPCap
	AH               AHAttr
	PKeyIndex        uint16
	EnSQDAsyncNotify bool
	SQDraining       bool
	MaxRdAtomic      uint8
	MaxDestRdAtomic  uint8
	MinRNRTimer      uint8
	PortNum          uint8
	Timeout          uint8
	RetryCnt         uint8
	RNRRetry         uint8
}

// SRQAttr holds SRQ attributes (struct ibv_srq_attr). A non-zero SRQLimit
// arms the limit: when fewer WQEs than that remain, the SRQ raises
// EventSRQLimitReached once and disarms.
type SRQAttr struct {
	MaxWR    uint32
	MaxSGE   uint32
	SRQLimit uint32
}

// DeviceAttr are a device's capabilities and limits (struct ibv_device_attr).
type DeviceAttr struct {
	FWVer           string
	NodeGUID        uint64
	SysImageGUID    uint64
	MaxMRSize       uint64
	PageSizeCap     uint64
	VendorID        uint32
	VendorPartID    uint32
	HWVer           uint32
	MaxQP           int
	MaxQPWR         int
	DeviceCapFlags  uint32
	MaxSGE          int
	MaxCQ           int
	MaxCQE          int
	MaxMR           int
	MaxPD           int
	MaxQPRdAtom     int
	MaxQPInitRdAtom int
	MaxSRQ          int
	MaxSRQWR        int
	MaxSRQSGE       int
	AtomicCap       AtomicCap
	PhysPortCnt     uint8
}

// PortAttr is a port's state and limits (struct ibv_port_attr).
type PortAttr struct {
	State        PortState
	MaxMTU       MTU
	ActiveMTU    MTU
	GIDTblLen    int
	PortCapFlags uint32
	MaxMsgSz     uint32
	LID          uint16
	SMLID        uint16
	LMC          uint8
	ActiveWidth  uint8
	ActiveSpeed  uint8
	PhysState    uint8
	LinkLayer    LinkLayer
}

// AsyncEvent is an asynchronous event (struct ibv_async_event), mapped to the
// object it concerns: QP for QP events, CQ for EventCQErr, SRQ for SRQ
// events, Port for port events. The other object fields are nil.
type AsyncEvent struct {
	Type EventType
	QP   QP
	CQ   CQ
	SRQ  SRQ
	Port uint8
	// QPResets is, for a QP event, the QP's Resets when the event was
	// raised: the error episode it belongs to (see QP.Resets).
	QPResets uint64
}

// String names the event and the object it concerns.
func (e AsyncEvent) String() string {
	switch {
	case e.QP != nil:
		return fmt.Sprintf("%s qpn=%d", e.Type, e.QP.Num())
	case e.CQ != nil:
		return fmt.Sprintf("%s cq", e.Type)
	case e.SRQ != nil:
		return fmt.Sprintf("%s srq", e.Type)
	case e.Port != 0:
		return fmt.Sprintf("%s port=%d", e.Type, e.Port)
	}
	return e.Type.String()
}

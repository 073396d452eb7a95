package ibv

import (
	"fmt"
	"strings"
)

// QPState is a queue pair state (enum ibv_qp_state).
type QPState uint32

// QP states.
const (
	QPSReset   QPState = 0
	QPSInit    QPState = 1
	QPSRTR     QPState = 2
	QPSRTS     QPState = 3
	QPSSQD     QPState = 4
	QPSSQE     QPState = 5
	QPSErr     QPState = 6
	QPSUnknown QPState = 7
)

var qpStateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR", "UNKNOWN"}

// String returns the state as iproute2's rdma tool prints it ("RTS", "ERR").
func (s QPState) String() string { return enumName(qpStateNames[:], uint64(s), "QPState") }

// QPType is a transport service type (enum ibv_qp_type).
type QPType uint32

// QP types.
const (
	QPTRC        QPType = 2
	QPTUC        QPType = 3
	QPTUD        QPType = 4
	QPTRawPacket QPType = 8
	QPTXRCSend   QPType = 9
	QPTXRCRecv   QPType = 10
	QPTDriver    QPType = 0xff
)

var qpTypeNames = [...]string{
	QPTRC: "RC", QPTUC: "UC", QPTUD: "UD", QPTRawPacket: "RAW_PACKET",
	QPTXRCSend: "XRC_SEND", QPTXRCRecv: "XRC_RECV", QPTDriver: "DRIVER",
}

// String returns the type as iproute2 prints it ("RC", "UD").
func (t QPType) String() string { return enumName(qpTypeNames[:], uint64(t), "QPType") }

// WCStatus is the status of a work completion (enum ibv_wc_status).
type WCStatus uint32

// Work completion statuses.
const (
	WCSuccess          WCStatus = 0
	WCLocLenErr        WCStatus = 1
	WCLocQPOpErr       WCStatus = 2
	WCLocEECOpErr      WCStatus = 3
	WCLocProtErr       WCStatus = 4
	WCWRFlushErr       WCStatus = 5
	WCMWBindErr        WCStatus = 6
	WCBadRespErr       WCStatus = 7
	WCLocAccessErr     WCStatus = 8
	WCRemInvReqErr     WCStatus = 9
	WCRemAccessErr     WCStatus = 10
	WCRemOpErr         WCStatus = 11
	WCRetryExcErr      WCStatus = 12
	WCRNRRetryExcErr   WCStatus = 13
	WCLocRDDViolErr    WCStatus = 14
	WCRemInvRdReqErr   WCStatus = 15
	WCRemAbortErr      WCStatus = 16
	WCInvEECNErr       WCStatus = 17
	WCInvEECStateErr   WCStatus = 18
	WCFatalErr         WCStatus = 19
	WCRespTimeoutErr   WCStatus = 20
	WCGeneralErr       WCStatus = 21
	WCTMErr            WCStatus = 22
	WCTMRndvIncomplete WCStatus = 23
)

var wcStatusNames = [...]string{
	"SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR",
	"WR_FLUSH_ERR", "MW_BIND_ERR", "BAD_RESP_ERR", "LOC_ACCESS_ERR", "REM_INV_REQ_ERR",
	"REM_ACCESS_ERR", "REM_OP_ERR", "RETRY_EXC_ERR", "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR",
	"REM_INV_RD_REQ_ERR", "REM_ABORT_ERR", "INV_EECN_ERR", "INV_EEC_STATE_ERR", "FATAL_ERR",
	"RESP_TIMEOUT_ERR", "GENERAL_ERR", "TM_ERR", "TM_RNDV_INCOMPLETE",
}

// String returns the status without its IBV_WC_ prefix ("WR_FLUSH_ERR").
func (s WCStatus) String() string { return enumName(wcStatusNames[:], uint64(s), "WCStatus") }

// WCOpcode is the operation a successful work completion reports (enum ibv_wc_opcode).
type WCOpcode uint32

// Work completion opcodes. Receive opcodes have bit 7 set.
const (
	WCSend            WCOpcode = 0
	WCRDMAWrite       WCOpcode = 1
	WCRDMARead        WCOpcode = 2
	WCCompSwap        WCOpcode = 3
	WCFetchAdd        WCOpcode = 4
	WCBindMW          WCOpcode = 5
	WCLocalInv        WCOpcode = 6
	WCTSO             WCOpcode = 7
	WCRecv            WCOpcode = 1 << 7
	WCRecvRDMAWithImm WCOpcode = WCRecv + 1
)

var wcOpcodeNames = [...]string{
	WCSend: "SEND", WCRDMAWrite: "RDMA_WRITE", WCRDMARead: "RDMA_READ", WCCompSwap: "COMP_SWAP",
	WCFetchAdd: "FETCH_ADD", WCBindMW: "BIND_MW", WCLocalInv: "LOCAL_INV", WCTSO: "TSO",
	WCRecv: "RECV", WCRecvRDMAWithImm: "RECV_RDMA_WITH_IMM",
}

// String returns the opcode without its IBV_WC_ prefix ("RECV").
func (o WCOpcode) String() string { return enumName(wcOpcodeNames[:], uint64(o), "WCOpcode") }

// WCFlags qualify a work completion (enum ibv_wc_flags).
type WCFlags uint32

// Work completion flags.
const (
	WCFlagGRH      WCFlags = 1 << 0
	WCFlagWithImm  WCFlags = 1 << 1
	WCFlagIPCsumOK WCFlags = 1 << 2
	WCFlagWithInv  WCFlags = 1 << 3
)

// WROpcode is the operation of a send work request (enum ibv_wr_opcode).
type WROpcode uint32

// Send work request opcodes.
const (
	WRRDMAWrite         WROpcode = 0
	WRRDMAWriteWithImm  WROpcode = 1
	WRSend              WROpcode = 2
	WRSendWithImm       WROpcode = 3
	WRRDMARead          WROpcode = 4
	WRAtomicCmpAndSwp   WROpcode = 5
	WRAtomicFetchAndAdd WROpcode = 6
	WRLocalInv          WROpcode = 7
	WRBindMW            WROpcode = 8
	WRSendWithInv       WROpcode = 9
	WRTSO               WROpcode = 10
)

var wrOpcodeNames = [...]string{
	"RDMA_WRITE", "RDMA_WRITE_WITH_IMM", "SEND", "SEND_WITH_IMM", "RDMA_READ",
	"ATOMIC_CMP_AND_SWP", "ATOMIC_FETCH_AND_ADD", "LOCAL_INV", "BIND_MW", "SEND_WITH_INV", "TSO",
}

// String returns the opcode without its IBV_WR_ prefix ("SEND_WITH_IMM").
func (o WROpcode) String() string { return enumName(wrOpcodeNames[:], uint64(o), "WROpcode") }

// SendFlags modify a send work request (enum ibv_send_flags).
type SendFlags uint32

// Send flags.
const (
	SendFence     SendFlags = 1 << 0
	SendSignaled  SendFlags = 1 << 1
	SendSolicited SendFlags = 1 << 2
	SendInline    SendFlags = 1 << 3
	SendIPCsum    SendFlags = 1 << 4
)

// AccessFlags grant local and remote access to memory and QPs (enum ibv_access_flags).
type AccessFlags uint32

// Access flags.
const (
	AccessLocalWrite   AccessFlags = 1 << 0
	AccessRemoteWrite  AccessFlags = 1 << 1
	AccessRemoteRead   AccessFlags = 1 << 2
	AccessRemoteAtomic AccessFlags = 1 << 3
	AccessMWBind       AccessFlags = 1 << 4
	AccessZeroBased    AccessFlags = 1 << 5
	AccessOnDemand     AccessFlags = 1 << 6
	AccessHugeTLB      AccessFlags = 1 << 7
)

// EventType is the kind of an asynchronous event (enum ibv_event_type).
type EventType uint32

// Asynchronous event types.
const (
	EventCQErr            EventType = 0
	EventQPFatal          EventType = 1
	EventQPReqErr         EventType = 2
	EventQPAccessErr      EventType = 3
	EventCommEst          EventType = 4
	EventSQDrained        EventType = 5
	EventPathMig          EventType = 6
	EventPathMigErr       EventType = 7
	EventDeviceFatal      EventType = 8
	EventPortActive       EventType = 9
	EventPortErr          EventType = 10
	EventLIDChange        EventType = 11
	EventPKeyChange       EventType = 12
	EventSMChange         EventType = 13
	EventSRQErr           EventType = 14
	EventSRQLimitReached  EventType = 15
	EventQPLastWQEReached EventType = 16
	EventClientReregister EventType = 17
	EventGIDChange        EventType = 18
	EventWQFatal          EventType = 19
)

var eventTypeNames = [...]string{
	"CQ_ERR", "QP_FATAL", "QP_REQ_ERR", "QP_ACCESS_ERR", "COMM_EST", "SQ_DRAINED", "PATH_MIG",
	"PATH_MIG_ERR", "DEVICE_FATAL", "PORT_ACTIVE", "PORT_ERR", "LID_CHANGE", "PKEY_CHANGE",
	"SM_CHANGE", "SRQ_ERR", "SRQ_LIMIT_REACHED", "QP_LAST_WQE_REACHED", "CLIENT_REREGISTER",
	"GID_CHANGE", "WQ_FATAL",
}

// String returns the event type without its IBV_EVENT_ prefix ("QP_LAST_WQE_REACHED").
func (e EventType) String() string { return enumName(eventTypeNames[:], uint64(e), "EventType") }

// QPAttrMask says which fields of a QPAttr a Modify or Query uses (enum ibv_qp_attr_mask).
type QPAttrMask uint32

// QP attribute mask bits.
const (
	QPAttrState            QPAttrMask = 1 << 0
	QPAttrCurState         QPAttrMask = 1 << 1
	QPAttrEnSQDAsyncNotify QPAttrMask = 1 << 2
	QPAttrAccessFlags      QPAttrMask = 1 << 3
	QPAttrPKeyIndex        QPAttrMask = 1 << 4
	QPAttrPort             QPAttrMask = 1 << 5
	QPAttrQKey             QPAttrMask = 1 << 6
	QPAttrAV               QPAttrMask = 1 << 7
	QPAttrPathMTU          QPAttrMask = 1 << 8
	QPAttrTimeout          QPAttrMask = 1 << 9
	QPAttrRetryCnt         QPAttrMask = 1 << 10
	QPAttrRNRRetry         QPAttrMask = 1 << 11
	QPAttrRQPSN            QPAttrMask = 1 << 12
	QPAttrMaxQPRdAtomic    QPAttrMask = 1 << 13
	QPAttrAltPath          QPAttrMask = 1 << 14
	QPAttrMinRNRTimer      QPAttrMask = 1 << 15
	QPAttrSQPSN            QPAttrMask = 1 << 16
	QPAttrMaxDestRdAtomic  QPAttrMask = 1 << 17
	QPAttrPathMigState     QPAttrMask = 1 << 18
	QPAttrCap              QPAttrMask = 1 << 19
	QPAttrDestQPN          QPAttrMask = 1 << 20
)

var qpAttrMaskNames = [...]string{
	"STATE", "CUR_STATE", "EN_SQD_ASYNC_NOTIFY", "ACCESS_FLAGS", "PKEY_INDEX", "PORT", "QKEY",
	"AV", "PATH_MTU", "TIMEOUT", "RETRY_CNT", "RNR_RETRY", "RQ_PSN", "MAX_QP_RD_ATOMIC",
	"ALT_PATH", "MIN_RNR_TIMER", "SQ_PSN", "MAX_DEST_RD_ATOMIC", "PATH_MIG_STATE", "CAP", "DEST_QPN",
}

// String lists the set bits, joined by "|" ("STATE|PORT|ACCESS_FLAGS").
func (m QPAttrMask) String() string {
	var parts []string
	for i, name := range qpAttrMaskNames {
		if m&(1<<i) != 0 {
			parts = append(parts, name)
			m &^= 1 << i
		}
	}
	if m != 0 {
		parts = append(parts, fmt.Sprintf("%#x", uint32(m)))
	}
	if len(parts) == 0 {
		return "0"
	}
	return strings.Join(parts, "|")
}

// SRQAttrMask says which fields of an SRQAttr a Modify uses (enum ibv_srq_attr_mask).
type SRQAttrMask uint32

// SRQ attribute mask bits.
const (
	SRQAttrMaxWR SRQAttrMask = 1 << 0
	SRQAttrLimit SRQAttrMask = 1 << 1
)

// MTU is a path MTU (enum ibv_mtu).
type MTU uint32

// MTUs.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the MTU in bytes, or 0 for an invalid value.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

// String returns the MTU in bytes ("1024").
func (m MTU) String() string {
	if b := m.Bytes(); b != 0 {
		return fmt.Sprint(b)
	}
	return fmt.Sprintf("MTU(%d)", uint32(m))
}

// PortState is the logical state of a port (enum ibv_port_state).
type PortState uint32

// Port states.
const (
	PortNOP         PortState = 0
	PortDown        PortState = 1
	PortInit        PortState = 2
	PortArmed       PortState = 3
	PortActive      PortState = 4
	PortActiveDefer PortState = 5
)

var portStateNames = [...]string{"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"}

// String returns the state as iproute2 prints it ("ACTIVE").
func (s PortState) String() string { return enumName(portStateNames[:], uint64(s), "PortState") }

// LinkLayer is the link layer of a port (IBV_LINK_LAYER_*).
type LinkLayer uint8

// Link layers.
const (
	LinkLayerUnspecified LinkLayer = 0
	LinkLayerInfiniBand  LinkLayer = 1
	LinkLayerEthernet    LinkLayer = 2
)

var linkLayerNames = [...]string{"Unspecified", "InfiniBand", "Ethernet"}

// String returns the link layer as ibv_devinfo prints it ("Ethernet").
func (l LinkLayer) String() string { return enumName(linkLayerNames[:], uint64(l), "LinkLayer") }

// NodeType is the kind of an RDMA device (enum ibv_node_type).
type NodeType int32

// Node types.
const (
	NodeUnknown     NodeType = -1
	NodeCA          NodeType = 1
	NodeSwitch      NodeType = 2
	NodeRouter      NodeType = 3
	NodeRNIC        NodeType = 4
	NodeUSNIC       NodeType = 5
	NodeUSNICUDP    NodeType = 6
	NodeUnspecified NodeType = 7
)

var nodeTypeNames = [...]string{"", "CA", "SWITCH", "ROUTER", "RNIC", "USNIC", "USNIC_UDP", "UNSPECIFIED"}

// String returns the node type ("CA").
func (n NodeType) String() string {
	if n < 0 {
		return "UNKNOWN"
	}
	return enumName(nodeTypeNames[:], uint64(n), "NodeType")
}

// TransportType is the transport of an RDMA device (enum ibv_transport_type).
type TransportType int32

// Transport types.
const (
	TransportUnknown     TransportType = -1
	TransportIB          TransportType = 0
	TransportIWARP       TransportType = 1
	TransportUSNIC       TransportType = 2
	TransportUSNICUDP    TransportType = 3
	TransportUnspecified TransportType = 4
)

var transportTypeNames = [...]string{"InfiniBand", "iWARP", "usNIC", "usNIC UDP", "unspecified"}

// String returns the transport as ibv_devinfo prints it ("InfiniBand").
func (t TransportType) String() string {
	if t < 0 {
		return "unknown"
	}
	return enumName(transportTypeNames[:], uint64(t), "TransportType")
}

// GIDType is the type of a GID table entry (enum ibv_gid_type).
type GIDType uint32

// GID types.
const (
	GIDTypeIB     GIDType = 0
	GIDTypeRoCEv1 GIDType = 1
	GIDTypeRoCEv2 GIDType = 2
)

var gidTypeNames = [...]string{"IB", "RoCE v1", "RoCE v2"}

// String returns the GID type as the kernel's sysfs spells it ("RoCE v2").
func (t GIDType) String() string { return enumName(gidTypeNames[:], uint64(t), "GIDType") }

// AtomicCap says how a device performs atomics (enum ibv_atomic_cap).
type AtomicCap uint32

// Atomic capabilities.
const (
	AtomicNone AtomicCap = 0
	AtomicHCA  AtomicCap = 1
	AtomicGlob AtomicCap = 2
)

// enumName is the name of v in names, indexed by value ("" for a value
// without one), or typ(v) for a value it does not name.
func enumName(names []string, v uint64, typ string) string {
	if v < uint64(len(names)) && names[v] != "" {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", typ, v)
}

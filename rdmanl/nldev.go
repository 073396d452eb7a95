package rdmanl

import "fmt"

// nldevClient is RDMA_NL_NLDEV: message types are client<<10 | op.
const nldevClient = 5

// familyRDMA is NETLINK_RDMA (include/uapi/linux/netlink.h).
const familyRDMA = 20

// Command is an nldev command (enum rdma_nldev_command).
type Command uint16

// The nldev commands this package sends.
const (
	CmdGet        Command = 1  // RDMA_NLDEV_CMD_GET
	CmdNewLink    Command = 3  // RDMA_NLDEV_CMD_NEWLINK
	CmdDelLink    Command = 4  // RDMA_NLDEV_CMD_DELLINK
	CmdPortGet    Command = 5  // RDMA_NLDEV_CMD_PORT_GET
	CmdResGet     Command = 9  // RDMA_NLDEV_CMD_RES_GET
	CmdResQPGet   Command = 10 // RDMA_NLDEV_CMD_RES_QP_GET
	CmdResPDGet   Command = 14 // RDMA_NLDEV_CMD_RES_PD_GET
	CmdGetChardev Command = 15 // RDMA_NLDEV_CMD_GET_CHARDEV
	CmdResCtxGet  Command = 22 // RDMA_NLDEV_CMD_RES_CTX_GET
)

var commandNames = map[Command]string{
	CmdGet: "GET", CmdNewLink: "NEWLINK", CmdDelLink: "DELLINK", CmdPortGet: "PORT_GET",
	CmdResGet: "RES_GET", CmdResQPGet: "RES_QP_GET", CmdResPDGet: "RES_PD_GET",
	CmdGetChardev: "GET_CHARDEV", CmdResCtxGet: "RES_CTX_GET",
}

// String is the command's name without the RDMA_NLDEV_CMD_ prefix.
func (c Command) String() string {
	if s, ok := commandNames[c]; ok {
		return s
	}
	return fmt.Sprintf("Command(%d)", uint16(c))
}

// action says what a command does, for error messages.
func (c Command) action() string {
	switch c {
	case CmdGet:
		return "listing devices"
	case CmdNewLink:
		return "adding link"
	case CmdDelLink:
		return "deleting link"
	case CmdPortGet:
		return "listing ports"
	case CmdResGet:
		return "reading the resource summary"
	case CmdResQPGet:
		return "dumping QPs"
	case CmdResPDGet:
		return "dumping PDs"
	case CmdGetChardev:
		return "looking up the char device"
	case CmdResCtxGet:
		return "dumping contexts"
	}
	return "running " + c.String()
}

// Attribute numbers (enum rdma_nldev_attr, ABI: the kernel never renumbers
// them).
const (
	attrDevIndex        = 1
	attrDevName         = 2
	attrPortIndex       = 3
	attrFWVersion       = 5
	attrNodeGUID        = 6
	attrSysImageGUID    = 7
	attrLID             = 9
	attrPortState       = 12
	attrPortPhysState   = 13
	attrDevNodeType     = 14
	attrResSummary      = 15
	attrResSummaryEntry = 16
	attrResSummaryName  = 17
	attrResSummaryCurr  = 18
	attrResQP           = 19
	attrResQPEntry      = 20
	attrResLQPN         = 21
	attrResRQPN         = 22
	attrResRQPSN        = 23
	attrResSQPSN        = 24
	attrResPathMigState = 25
	attrResType         = 26
	attrResState        = 27
	attrResPID          = 28
	attrResKernName     = 29
	attrResPD           = 46
	attrResPDEntry      = 47
	attrNdevIndex       = 50
	attrNdevName        = 51
	attrResPDN          = 60
	attrResCtxN         = 64
	attrLinkType        = 65
	attrDevProtocol     = 67
	attrChardevType     = 69
	attrChardevName     = 70
	attrChardevABI      = 71
	attrChardev         = 72
	attrUverbsDriverID  = 73
	attrResCtx          = 86
	attrResCtxEntry     = 87
	attrResSubtype      = 98
)

// QPType is a QP's transport service type as RDMA/core numbers it (enum
// ib_qp_type in include/rdma/ib_verbs.h, which RDMA_NLDEV_ATTR_RES_TYPE
// carries). It differs from libibverbs's enum ibv_qp_type for SMI and GSI.
type QPType uint8

// QP types with the names iproute2 prints.
const (
	QPTypeSMI          QPType = 0
	QPTypeGSI          QPType = 1
	QPTypeRC           QPType = 2
	QPTypeUC           QPType = 3
	QPTypeUD           QPType = 4
	QPTypeRawIPv6      QPType = 5
	QPTypeRawEthertype QPType = 6
	QPTypeRawPacket    QPType = 8
	QPTypeXRCIni       QPType = 9
	QPTypeXRCTgt       QPType = 10
)

// qpTypeNames is iproute2's qp_types_to_str (rdma/res.c); 7 is reserved.
var qpTypeNames = [...]string{"SMI", "GSI", "RC", "UC", "UD", "RAW_IPV6", "RAW_ETHERTYPE", "UNKNOWN", "RAW_PACKET", "XRC_INI", "XRC_TGT"}

// String is the type as `rdma resource show qp` prints it ("RC", "UD",
// "UNKNOWN" for a number it does not know).
func (t QPType) String() string {
	if int(t) < len(qpTypeNames) {
		return qpTypeNames[t]
	}
	return "UNKNOWN"
}

// QPState is a QP's state (enum ib_qp_state, the IBTA states of 10.3.1).
type QPState uint8

// QP states with the names iproute2 prints.
const (
	QPStateReset QPState = 0
	QPStateInit  QPState = 1
	QPStateRTR   QPState = 2
	QPStateRTS   QPState = 3
	QPStateSQD   QPState = 4
	QPStateSQE   QPState = 5
	QPStateErr   QPState = 6
)

var qpStateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}

// String is the state as `rdma resource show qp` prints it ("RTS", "ERR").
func (s QPState) String() string {
	if int(s) < len(qpStateNames) {
		return qpStateNames[s]
	}
	return "UNKNOWN"
}

// PathMigState is a QP's path migration state (enum ib_mig_state).
type PathMigState uint8

var pathMigNames = [...]string{"MIGRATED", "REARM", "ARMED"}

// String is the state as iproute2 prints it ("MIGRATED", "REARM", "ARMED").
func (p PathMigState) String() string {
	if int(p) < len(pathMigNames) {
		return pathMigNames[p]
	}
	return "UNKNOWN"
}

// PortState is a port's logical state (enum ib_port_state).
type PortState uint8

var portStateNames = [...]string{"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"}

// String is the state as `rdma link` prints it ("ACTIVE", "DOWN").
func (s PortState) String() string {
	if int(s) < len(portStateNames) {
		return portStateNames[s]
	}
	return "UNKNOWN"
}

// MarshalText encodes the type as rdma prints it ("RC"), for JSON.
func (t QPType) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// MarshalText encodes the state as rdma prints it ("ERR"), for JSON.
func (s QPState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// MarshalText encodes the path migration state as rdma prints it, for JSON.
func (p PathMigState) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// MarshalText encodes the port state as rdma prints it ("ACTIVE"), for JSON.
func (s PortState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

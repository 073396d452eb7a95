package rdmanl

// Device is one RDMA device (a reply of RDMA_NLDEV_CMD_GET).
type Device struct {
	// Index is the RDMA device index ("ifindex" in rdma's JSON).
	Index uint32
	// Name is the device name ("rxe0", "mlx5_0").
	Name string
	// Ports is the number of ports.
	Ports uint32
	// FWVersion is the firmware version, empty when the driver has none.
	FWVersion string
	// NodeGUID and SysImageGUID are in host byte order.
	NodeGUID     uint64
	SysImageGUID uint64
	// NodeType is enum rdma_node_type (1 CA, 4 RNIC, ...).
	NodeType uint8
	// Protocol is "ib", "roce", "iw" or "opa" (RDMA_NLDEV_ATTR_DEV_PROTOCOL).
	Protocol string
}

// Port is one port of a device (a reply of RDMA_NLDEV_CMD_PORT_GET).
type Port struct {
	Device     uint32
	DeviceName string
	Port       uint32
	State      PortState
	// PhysState is enum ib_port_phys_state (5 LinkUp).
	PhysState uint8
	LID       uint32
	// Netdev and NetdevIndex name the net device of a RoCE or iWARP port.
	Netdev      string
	NetdevIndex uint32
}

// ResourceCount is one row of the resource summary: how many objects of a
// kind ("pd", "cq", "qp", "cm_id", "mr", "ctx", "srq") the device has now.
type ResourceCount struct {
	Name    string
	Current uint64
}

// Summary is a device's resource summary (RDMA_NLDEV_CMD_RES_GET). The
// kernel gives current counts only; the maximum is the device's max_qp and
// friends (ibv_query_device).
type Summary struct {
	Device     uint32
	DeviceName string
	Counts     []ResourceCount
}

// Count is the current number of objects named name ("qp"), and whether the
// summary has that row.
func (s Summary) Count(name string) (uint64, bool) {
	for _, c := range s.Counts {
		if c.Name == name {
			return c.Current, true
		}
	}
	return 0, false
}

// Has says which optional attributes an entry carried; the kernel omits
// rather than zeroes what does not apply (no RQPN for a UD QP, no port for a
// QP in RESET, no PID for a kernel QP or once the creator is gone).
type Has uint16

// The optional attributes of QP, PD and context entries.
const (
	HasPort Has = 1 << iota
	HasRQPN
	HasRQPSN
	HasSQPSN
	HasPathMigState
	HasPID
	HasKernName
	HasPDN
	HasCtxN
	HasSubtype
)

// QP is one entry of a device's QP table (RDMA_NLDEV_ATTR_RES_QP_ENTRY).
type QP struct {
	Device     uint32
	DeviceName string
	// Port is 0 when Has&HasPort is clear (a QP in RESET has no port yet).
	Port         uint32
	LQPN         uint32
	RQPN         uint32
	RQPSN        uint32
	SQPSN        uint32
	PathMigState PathMigState
	Type         QPType
	State        QPState
	// PID is the creating thread's id as the reader's PID namespace sees
	// it; absent once that thread has exited or its process is a zombie.
	PID uint32
	// KernName names the kernel module that owns a kernel QP ("ib_core").
	KernName string
	// PDN is the QP's PD number; user QPs only.
	PDN uint32
	// Subtype is the driver's QP subtype (6.10 and later, driver QPs).
	Subtype string
	Has     Has
}

// ID is the QP's index in its device's QP table (rdma_restrack_add in
// drivers/infiniband/core/restrack.c): its number, with the port in the
// top byte for the SMI and GSI QPs, whose numbers (0, 1) every port
// repeats. A dump lists QPs in ID order; LookupQP asks for one by it.
func (q *QP) ID() uint32 {
	if q.Type == QPTypeSMI || q.Type == QPTypeGSI {
		return q.LQPN | q.Port<<24
	}
	return q.LQPN
}

// PD is one entry of a device's PD table (RDMA_NLDEV_ATTR_RES_PD_ENTRY).
type PD struct {
	Device uint32
	PDN    uint32
	// CtxN is the context (uverbs file) the PD belongs to; user PDs only.
	CtxN     uint32
	PID      uint32
	KernName string
	Has      Has
}

// Ctx is one entry of a device's context table (RDMA_NLDEV_ATTR_RES_CTX_ENTRY):
// one open uverbs file, however many processes share it.
type Ctx struct {
	Device uint32
	CtxN   uint32
	PID    uint32
	Has    Has
}

// Chardev is the char device through which user space reaches a device
// (RDMA_NLDEV_CMD_GET_CHARDEV): "uverbs0" for type "uverbs".
type Chardev struct {
	Name string
	// Dev is the device number encoded as stat(2)'s st_rdev (the kernel
	// sends huge_encode_dev of it): unix.Major and unix.Minor split it.
	Dev uint64
	ABI uint64
	// DriverID is the uverbs driver (enum rdma_driver_id, include/uapi/rdma/ib_user_ioctl_verbs.h): DriverRXE for Soft-RoCE.
	DriverID uint32
}

// Drivers by their uverbs driver id (enum rdma_driver_id).
const (
	DriverRXE uint32 = 14 // RDMA_DRIVER_RXE, Soft-RoCE
	DriverSIW uint32 = 18 // RDMA_DRIVER_SIW, Soft-iWARP
)

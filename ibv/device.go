package ibv

// DeviceInfo describes an RDMA device found by Devices.
type DeviceInfo struct {
	Name      string
	GUID      uint64
	NodeType  NodeType
	Transport TransportType
}

package devtest

import (
	"slices"
	"testing"

	"github.com/qpdrain/qpdrain/ibv"
)

// TestQuery: the device, its port and its GID table describe a usable
// device, QueryGID agrees with the table, and a libibverbs device is in
// ibv.Devices.
func TestQuery(t *testing.T) {
	ctx := Open(t)
	attr, err := ctx.QueryDevice()
	if err != nil {
		t.Fatal(err)
	}
	if attr.PhysPortCnt < 1 || attr.MaxQP < 1 || attr.MaxCQE < 1 || attr.MaxSRQ < 1 || attr.MaxQPWR < 16 {
		t.Errorf("device attributes %+v: want a port and room for QPs, CQs and SRQs", attr)
	}
	pa, err := ctx.QueryPort(Port)
	if err != nil {
		t.Fatal(err)
	}
	if pa.State != ibv.PortActive || pa.ActiveMTU.Bytes() == 0 || pa.GIDTblLen < 1 {
		t.Errorf("port %d attributes %+v: want ACTIVE with an MTU and a GID table", Port, pa)
	}
	table, err := ctx.QueryGIDTable()
	if err != nil {
		t.Fatal(err)
	}
	roceV2 := false
	for _, e := range table {
		if e.Port != Port {
			continue
		}
		g, err := ctx.QueryGID(e.Port, int(e.Index))
		if err != nil || g != e.GID {
			t.Errorf("QueryGID(%d, %d) = %v, %v; the table has %v", e.Port, e.Index, g, err, e.GID)
		}
		roceV2 = roceV2 || e.Type == ibv.GIDTypeRoCEv2
	}
	// An iWARP port is Ethernet too, but iWARP reaches its peer by IP
	// over TCP: siw's one GID is its netdev's MAC address (siw_query_gid
	// in drivers/infiniband/sw/siw/siw_verbs.c), and no RoCE GID is owed.
	if pa.LinkLayer == ibv.LinkLayerEthernet && !IWARP() && !roceV2 {
		t.Errorf("RoCE port without a RoCE v2 GID: %v", table)
	}
	if CurrentProvider() == ProviderSoft {
		return
	}
	devs, err := ibv.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(devs, func(d ibv.DeviceInfo) bool { return d.Name == ctx.Name() && d.GUID != 0 }) {
		t.Errorf("ibv.Devices() = %+v, want %s with its GUID", devs, ctx.Name())
	}
}

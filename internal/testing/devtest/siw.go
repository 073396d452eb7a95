package devtest

import (
	"testing"

	"github.com/qpdrain/qpdrain/ibv"
)

// siwVendorID is the vendor_id siw gives ibv_query_device: "bmt" in ASCII
// (SIW_VENDOR_ID, drivers/infiniband/sw/siw/siw.h).
const siwVendorID = 0x626d74

// SIW reports whether ctx, a device from Open, is the kernel's soft iWARP
// (drivers/infiniband/sw/siw with rdma-core's libsiw): an iWARP device
// (IWARP) whose ibv_query_device gives siw's vendor_id. The tests that
// expect one of siw's documented differences (docs/TESTING.md, "Soft
// iWARP") ask it, the device, rather than its name; the soft device with
// siw's rules (DeviceIWARP) is not siw.
func SIW(t testing.TB, ctx ibv.Context) bool {
	t.Helper()
	if CurrentProvider() == ProviderSoft || !IWARP() {
		return false
	}
	attr, err := ctx.QueryDevice()
	if err != nil {
		t.Fatalf("querying %s: %v", ctx.Name(), err)
	}
	return attr.VendorID == siwVendorID
}

// IdleState is the state ibv_query_qp gives a QP of ctx that was created and
// never connected, or moved back to RESET: RESET, except on siw, whose one
// IDLE state stands for RESET, INIT and RTR and reads INIT
// (ib_qp_state_to_siw_qp_state and siw_qp_state_to_ib_qp_state in
// drivers/infiniband/sw/siw/siw_verbs.c).
func IdleState(t testing.TB, ctx ibv.Context) ibv.QPState {
	t.Helper()
	if SIW(t, ctx) {
		return ibv.QPSInit
	}
	return ibv.QPSReset
}

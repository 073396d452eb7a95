package devtest

import "fmt"

// RXEChange is a behaviour of kernel rxe (drivers/infiniband/sw/rxe) that
// differs between the kernels the device tests run on. The tests that
// expect one side of it ask RXEHas or RXELacks instead of comparing kernel
// versions themselves, so that the kernel each behaviour starts at is
// written once, in rxeChanges, with what justifies it.
type RXEChange int

// The rxe behaviours the tests depend on (docs/PROVIDERS.md).
const (
	// RXELastWQEReached: an SRQ-attached QP moved to ERROR raises
	// IBV_EVENT_QP_LAST_WQE_REACHED (IBTA o11-5.2.5).
	RXELastWQEReached RXEChange = iota
	// RXELastWQERepeated: Last WQE Reached comes again after a second
	// modify to ERROR and after each send posted in ERROR.
	RXELastWQERepeated
	// RXERecvInErrorFlushed: a receive posted while the QP is in ERROR is
	// flushed, if only once something else is posted to the QP.
	RXERecvInErrorFlushed
	// RXEResponderAccessEvent: the responder of an RDMA WRITE that
	// violates its MR's access raises IBV_EVENT_QP_ACCESS_ERR (IBTA Table
	// 58, class C) besides entering ERROR.
	RXEResponderAccessEvent
)

// KernelRelease is a kernel's major and minor version.
type KernelRelease struct{ Major, Minor int }

// Before reports whether k is an older release than o.
func (k KernelRelease) Before(o KernelRelease) bool {
	return k.Major < o.Major || k.Major == o.Major && k.Minor < o.Minor
}

func (k KernelRelease) String() string { return fmt.Sprintf("%d.%d", k.Major, k.Minor) }

// rxeRange is one entry of the table: rxe has the behaviour on the kernels
// from Since on, and lacks it before.
type rxeRange struct {
	Since KernelRelease
	// Why is the kernel change or the observation that puts the boundary
	// at Since, with the releases seen on either side of it.
	Why string
}

// rxeChanges is the table of rxe's behaviours by kernel range. A boundary
// backed by runs only lies somewhere between the last release seen without
// the behaviour and the first seen with it; the kernels in between are
// assumed to behave like the older side until the tests run there.
var rxeChanges = map[RXEChange]rxeRange{
	RXELastWQEReached: {Since: KernelRelease{6, 5},
		Why: "commit c3e1bf626eb3 (\"RDMA/rxe: Send last wqe reached event on qp cleanup\", merged for v6.5): rxe_resp.c's flush_recv_queue raises it for an SRQ QP entering ERROR; observed: none on 6.1.192, raised on 6.12.95 and 7.3.4"},
	RXELastWQERepeated: {Since: KernelRelease{6, 12},
		Why: "observed: on 6.12.95 and 7.3.4; 6.1.192 raises no Last WQE Reached at all"},
	RXERecvInErrorFlushed: {Since: KernelRelease{6, 12},
		Why: "observed: never on 6.1.192; on 6.12.95 and 7.3.4 once a later send is posted; 6.2-6.11 not run"},
	RXEResponderAccessEvent: {Since: KernelRelease{7, 3},
		Why: "observed: no event on 6.12.95, QP_ACCESS_ERR on 7.3.4; 6.13-7.2 not run, and the rxe_resp.c change is not pinned"},
}

// RXESince returns the first kernel release with rxe behaviour c and what
// puts the boundary there. An RXEChange outside the table is a bug of the
// caller and panics.
func RXESince(c RXEChange) (KernelRelease, string) {
	r, ok := rxeChanges[c]
	if !ok {
		panic(fmt.Sprintf("devtest: RXEChange %d has no entry in rxeChanges", c))
	}
	return r.Since, r.Why
}

// RXEHas reports whether the test device is rxe on a kernel with behaviour
// c; false on every other device.
func RXEHas(c RXEChange) bool {
	since, _ := RXESince(c)
	return CurrentProvider() == ProviderRXE && !Kernel().Before(since)
}

// RXELacks reports whether the test device is rxe on a kernel without
// behaviour c; false on every other device.
func RXELacks(c RXEChange) bool {
	since, _ := RXESince(c)
	return CurrentProvider() == ProviderRXE && Kernel().Before(since)
}

// Kernel is KernelVersion as a KernelRelease.
func Kernel() KernelRelease {
	major, minor := KernelVersion()
	return KernelRelease{major, minor}
}

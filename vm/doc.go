// Package vm runs programs against the Linux kernel's own Soft-RoCE (rdma_rxe)
// and, on request, soft iWARP (siw, its module built per kernel from the
// kernel's Debian source and headers packages) inside qemu, once per Debian
// kernel of a matrix and provider, and gives one verdict: the engine behind
// `qpdrain vm`.
//
// The work is done by shell scripts embedded in the binary (scripts/), which
// Prepare writes into the cache directory, so an installed qpdrain needs no
// source tree. For each kernel they download Debian's kernel package through a
// private apt configuration (never installing it, no root needed), build a
// busybox initramfs with the host's rdma-core user space, the payload and every
// library ldd names, boot it, and judge the run from sentinel lines the guest
// writes to a second serial port (never from qemu's exit status). The Go side
// checks the arguments (Run: also that the guest's memory holds the payload,
// payload.go), resolves kernel names, picks KVM or TCG, serializes
// runs on one cache with a lock, and maps the verdict to an error.
//
// The cache directory holds kernels/ (one directory per kernel version, with
// siw/siw.ko once built, and
// SUITE.ref: the version a suite resolved to, pinned until RXE_REFRESH=1),
// debs/, apt/ (the private apt state), run/ (the last run's images and logs)
// and scripts/.
package vm

// Package leaks finds leaked QPs in a sequence of samples of the host's QPs
// and says, for each finding, why (a Reason), what the samples show, and
// what an operator can do.
//
// RDMA netlink reports no QP age (include/uapi/rdma/rdma_netlink.h has no
// such attribute), so every dwell is what the samples show: a QP in ERR in
// every sample of a 3 s window has been in error for at least 3 s, where a
// correct drain (ERROR, Last WQE Reached, drain WR, destroy) takes
// milliseconds. A QP that is busy or idle in RTS is never a finding: only
// its state in every sample, its owner being gone in every sample, or its
// owner's counts rising in every sample make one.
//
// Analyze is a pure function over samples; Watch takes them from a Sampler,
// which reads the host (the CLI's reads RDMA netlink and /proc). Neither
// changes anything on the host.
package leaks

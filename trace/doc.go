// Package trace checks the teardown of an unchanged RDMA program on a real
// provider. Run starts the program with a small C shim preloaded over
// libibverbs (BuildShim compiles it with the host's C compiler; its source is
// embedded, see shim/shim.c) that records, per context, the life of every QP,
// CQ and SRQ: creation and sizes, state changes, every posted WR, every polled
// completion, async events and their acknowledgements, destroys. Parse reads
// those records and Analyze judges them into findings, each with its evidence
// and the rule it breaks: a QP destroyed with WRs outstanding, an SRQ QP
// destroyed before Last WQE Reached on a device that raises it, a completion
// polled for a destroyed QP, a CQ holding more outstanding completions than
// its size or overrunning, async events never acknowledged, and WRs posted in
// ERROR that were never flushed.
//
// The ibv_qp_ex send path (ibv_wr_start, ibv_wr_*, ibv_wr_complete) and the
// ibv_cq_ex poll path (ibv_start_poll, ibv_next_poll) keep their function
// pointers in each QP and CQ: the shim takes those over, per object. A
// program that dlopen()s libibverbs gets the shim's verbs from its handle
// too. What the shim cannot follow (an ibv_qp_ex operation newer than it
// knows, a full table) is named in the report's notes and its queues are
// not judged.
package trace

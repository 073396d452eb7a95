//go:build linux && cgo

// C helpers for the libibverbs implementation of package ibv. They exist
// where libibverbs offers only macros or static inline functions, and where
// one cgo call must do a whole batch (post a WR list, poll a CQ).
#ifndef QPDRAIN_VERBS_LINUX_H
#define QPDRAIN_VERBS_LINUX_H

#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>

// QPD_SYMS lists each entry point with the symbol version a program linked
// against libibverbs.so.1 binds to (objdump -T libibverbs.so.1: the default
// "@@" version; the IBVERBS_1.0 duplicates are the pre-1.1 compatibility
// ABI). dlvsym asks for exactly that version.
#define QPD_SYMS(X)                                      \
	X(ibv_get_device_list, "IBVERBS_1.1")            \
	X(ibv_free_device_list, "IBVERBS_1.1")           \
	X(ibv_get_device_name, "IBVERBS_1.1")            \
	X(ibv_get_device_guid, "IBVERBS_1.1")            \
	X(ibv_open_device, "IBVERBS_1.1")                \
	X(ibv_close_device, "IBVERBS_1.1")               \
	X(ibv_query_device, "IBVERBS_1.1")               \
	X(ibv_query_port, "IBVERBS_1.1")                 \
	X(ibv_query_gid, "IBVERBS_1.1")                  \
	X(_ibv_query_gid_table, "IBVERBS_1.11")          \
	X(ibv_alloc_pd, "IBVERBS_1.1")                   \
	X(ibv_dealloc_pd, "IBVERBS_1.1")                 \
	X(ibv_reg_mr_iova2, "IBVERBS_1.8")               \
	X(ibv_dereg_mr, "IBVERBS_1.1")                   \
	X(ibv_create_comp_channel, "IBVERBS_1.0")        \
	X(ibv_destroy_comp_channel, "IBVERBS_1.0")       \
	X(ibv_create_cq, "IBVERBS_1.1")                  \
	X(ibv_destroy_cq, "IBVERBS_1.1")                 \
	X(ibv_get_cq_event, "IBVERBS_1.1")               \
	X(ibv_ack_cq_events, "IBVERBS_1.1")              \
	X(ibv_create_qp, "IBVERBS_1.1")                  \
	X(ibv_modify_qp, "IBVERBS_1.1")                  \
	X(ibv_query_qp, "IBVERBS_1.1")                   \
	X(ibv_destroy_qp, "IBVERBS_1.1")                 \
	X(ibv_create_srq, "IBVERBS_1.1")                 \
	X(ibv_query_srq, "IBVERBS_1.1")                  \
	X(ibv_modify_srq, "IBVERBS_1.1")                 \
	X(ibv_destroy_srq, "IBVERBS_1.1")                \
	X(ibv_get_async_event, "IBVERBS_1.1")            \
	X(ibv_ack_async_event, "IBVERBS_1.1")

// The table qpd_load fills. A function-like macro (ibv_query_port, ibv_reg_mr) is not
// expanded in __typeof__(name), so each slot has the declared prototype.
#define QPD_SLOT(sym, ver) __typeof__(sym) *p_##sym;
struct qpd_fn {
	QPD_SYMS(QPD_SLOT)
};
extern struct qpd_fn qpd_fn;

int qpd_load(const char *lib, const char **what, const char **why);

// Thin wrappers for the entry points Go calls directly (cgo cannot call a
// function pointer).
struct ibv_device **qpd_ibv_get_device_list(int *n);
void qpd_ibv_free_device_list(struct ibv_device **l);
const char *qpd_ibv_get_device_name(struct ibv_device *d);
struct ibv_context *qpd_ibv_open_device(struct ibv_device *d);
int qpd_ibv_close_device(struct ibv_context *c);
int qpd_ibv_query_device(struct ibv_context *c, struct ibv_device_attr *a);
int qpd_ibv_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid);
struct ibv_pd *qpd_ibv_alloc_pd(struct ibv_context *c);
int qpd_ibv_dealloc_pd(struct ibv_pd *pd);
int qpd_ibv_dereg_mr(struct ibv_mr *mr);
struct ibv_comp_channel *qpd_ibv_create_comp_channel(struct ibv_context *c);
int qpd_ibv_destroy_comp_channel(struct ibv_comp_channel *ch);
int qpd_ibv_destroy_cq(struct ibv_cq *cq);
int qpd_ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask);
int qpd_ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, struct ibv_qp_init_attr *init);
int qpd_ibv_destroy_qp(struct ibv_qp *qp);
int qpd_ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *a);
int qpd_ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *a, int mask);
int qpd_ibv_destroy_srq(struct ibv_srq *srq);


// qpd_send is one send WR as Go writes it into C memory: flat, without the
// unions and pointers of struct ibv_send_wr. Its SGEs are the num_sge
// entries of the post buffer's SGE array that follow the previous WR's.
struct qpd_send {
	uint64_t wr_id;
	uint64_t remote_addr;
	uint64_t compare_add;
	uint64_t swap;
	uint32_t opcode;
	uint32_t flags;
	uint32_t imm_data; // host byte order
	uint32_t rkey;
	uint32_t num_sge;
};

// qpd_recv is one receive WR as Go writes it into C memory.
struct qpd_recv {
	uint64_t wr_id;
	uint32_t num_sge;
};

// qpd_postbuf is the C memory a QP or SRQ reuses for every post: the WRs
// Go fills (in), their SGEs, and the ibv_*_wr chain linked from them.
struct qpd_postbuf {
	void *in;
	struct ibv_sge *sge;
	void *chain;
	int wr_cap;
	int sge_cap;
};

struct qpd_postbuf *qpd_postbuf_new(void);
int qpd_postbuf_reserve(struct qpd_postbuf *b, int nwr, int nsge, int send);
void qpd_postbuf_free(struct qpd_postbuf *b);

int qpd_post_send(struct ibv_qp *qp, struct qpd_postbuf *b, int n, int *bad);
int qpd_post_recv(struct ibv_qp *qp, struct ibv_srq *srq, struct qpd_postbuf *b, int n, int *bad);

int qpd_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);

// Object kinds an async event can concern.
enum {
	QPD_ELEM_NONE = 0,
	QPD_ELEM_QP = 1,
	QPD_ELEM_CQ = 2,
	QPD_ELEM_SRQ = 3,
	QPD_ELEM_PORT = 4,
};

// qpd_async is a copied async event: its type, the kind of object it
// concerns and that object's handle (the *_context the object was created
// with) or port number.
struct qpd_async {
	uint32_t type;
	uint32_t elem;
	uintptr_t handle;
	uint32_t port;
};

int qpd_get_async_event(struct ibv_context *ctx, struct qpd_async *out);
int qpd_get_cq_event(struct ibv_comp_channel *ch, uintptr_t *handle);

int qpd_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
uint64_t qpd_device_guid(struct ibv_device *dev);
struct ibv_mr *qpd_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access);
struct ibv_cq *qpd_create_cq(struct ibv_context *ctx, int cqe, uintptr_t handle, struct ibv_comp_channel *ch);
void qpd_set_qp_context(struct ibv_qp_init_attr *attr, uintptr_t handle);
struct ibv_qp *qpd_ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
struct ibv_srq *qpd_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr, uintptr_t handle);
int qpd_req_notify_cq(struct ibv_cq *cq, int solicited_only);
ssize_t qpd_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *entries, size_t max);

#endif

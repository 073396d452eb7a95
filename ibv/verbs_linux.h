//go:build linux && cgo

// C helpers for the libibverbs implementation of package ibv. They exist
// where libibverbs offers only macros or static inline functions, and where
// one cgo call must do a whole batch (post a WR list, poll a CQ).
#ifndef QPDRAIN_VERBS_LINUX_H
#define QPDRAIN_VERBS_LINUX_H

#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>

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
struct ibv_qp *qpd_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr, uintptr_t handle);
struct ibv_srq *qpd_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr, uintptr_t handle);
int qpd_req_notify_cq(struct ibv_cq *cq, int solicited_only);
ssize_t qpd_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *entries, size_t max);

#endif

//go:build linux && cgo

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <endian.h>
#include "verbs_linux.h"

struct qpd_postbuf *qpd_postbuf_new(void)
{
	return calloc(1, sizeof(struct qpd_postbuf));
}

// qpd_postbuf_reserve grows b to hold nwr WRs and nsge SGEs. It never
// shrinks, so a QP that posts batches of the same size allocates once.
int qpd_postbuf_reserve(struct qpd_postbuf *b, int nwr, int nsge, int send)
{
	if (nwr > b->wr_cap) {
		size_t in_sz = send ? sizeof(struct qpd_send) : sizeof(struct qpd_recv);
		size_t chain_sz = send ? sizeof(struct ibv_send_wr) : sizeof(struct ibv_recv_wr);
		void *in = calloc(nwr, in_sz);
		void *chain = calloc(nwr, chain_sz);
		if (!in || !chain) {
			free(in);
			free(chain);
			return ENOMEM;
		}
		free(b->in);
		free(b->chain);
		b->in = in;
		b->chain = chain;
		b->wr_cap = nwr;
	}
	if (nsge > b->sge_cap) {
		struct ibv_sge *sge = calloc(nsge, sizeof(struct ibv_sge));
		if (!sge)
			return ENOMEM;
		free(b->sge);
		b->sge = sge;
		b->sge_cap = nsge;
	}
	return 0;
}

void qpd_postbuf_free(struct qpd_postbuf *b)
{
	if (!b)
		return;
	free(b->in);
	free(b->chain);
	free(b->sge);
	free(b);
}

// post_rc is a post verb's result, rc, as an errno value, maybe negated
// (libsiw returns -EINVAL). libsiw also returns write(2)'s -1 when the
// kernel refuses its doorbell (siw_db in rdma-core's providers/siw/siw.h),
// the reason left in errno, which the caller cleared before the verb: a
// -1 with errno set is that errno, not EPERM.
static int post_rc(int rc)
{
	return rc == -1 && errno ? errno : rc;
}

int qpd_post_send(struct ibv_qp *qp, struct qpd_postbuf *b, int n, int *bad)
{
	struct qpd_send *in = b->in;
	struct ibv_send_wr *wr = b->chain, *bad_wr = NULL;
	struct ibv_sge *sge = b->sge;
	int i, rc;

	for (i = 0; i < n; i++) {
		struct ibv_send_wr *w = &wr[i];

		memset(w, 0, sizeof(*w));
		w->wr_id = in[i].wr_id;
		w->next = i + 1 < n ? &wr[i + 1] : NULL;
		w->sg_list = in[i].num_sge ? sge : NULL;
		w->num_sge = in[i].num_sge;
		sge += in[i].num_sge;
		w->opcode = in[i].opcode;
		w->send_flags = in[i].flags;
		switch (in[i].opcode) {
		case IBV_WR_RDMA_WRITE_WITH_IMM:
		case IBV_WR_SEND_WITH_IMM:
			w->imm_data = htonl(in[i].imm_data);
			break;
		case IBV_WR_SEND_WITH_INV:
		case IBV_WR_LOCAL_INV:
			w->invalidate_rkey = in[i].rkey;
			break;
		}
		switch (in[i].opcode) {
		case IBV_WR_RDMA_WRITE:
		case IBV_WR_RDMA_WRITE_WITH_IMM:
		case IBV_WR_RDMA_READ:
			w->wr.rdma.remote_addr = in[i].remote_addr;
			w->wr.rdma.rkey = in[i].rkey;
			break;
		case IBV_WR_ATOMIC_CMP_AND_SWP:
		case IBV_WR_ATOMIC_FETCH_AND_ADD:
			w->wr.atomic.remote_addr = in[i].remote_addr;
			w->wr.atomic.rkey = in[i].rkey;
			w->wr.atomic.compare_add = in[i].compare_add;
			w->wr.atomic.swap = in[i].swap;
			break;
		}
	}
	errno = 0;
	rc = post_rc(ibv_post_send(qp, wr, &bad_wr));
	*bad = rc && bad_wr ? (int)(bad_wr - wr) : (rc ? 0 : n);
	return rc;
}

// link_recv turns the flat receive WRs of b into an ibv_recv_wr chain.
static struct ibv_recv_wr *link_recv(struct qpd_postbuf *b, int n)
{
	struct qpd_recv *in = b->in;
	struct ibv_recv_wr *wr = b->chain;
	struct ibv_sge *sge = b->sge;
	int i;

	for (i = 0; i < n; i++) {
		wr[i].wr_id = in[i].wr_id;
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
		wr[i].sg_list = in[i].num_sge ? sge : NULL;
		wr[i].num_sge = in[i].num_sge;
		sge += in[i].num_sge;
	}
	return wr;
}

// qpd_post_recv posts the receive WRs of b on qp or, when qp is NULL, on srq.
int qpd_post_recv(struct ibv_qp *qp, struct ibv_srq *srq, struct qpd_postbuf *b, int n, int *bad)
{
	struct ibv_recv_wr *wr = link_recv(b, n), *bad_wr = NULL;
	int rc;

	errno = 0;
	rc = post_rc(qp ? ibv_post_recv(qp, wr, &bad_wr) : ibv_post_srq_recv(srq, wr, &bad_wr));

	*bad = rc && bad_wr ? (int)(bad_wr - wr) : (rc ? 0 : n);
	return rc;
}

int qpd_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	return ibv_poll_cq(cq, n, wc);
}

// qpd_get_async_event reads one event from the (non-blocking) async fd,
// copies what Go needs and acknowledges it before returning: the object's
// handle is read while the object is certain to exist, because its destroy
// waits for this ack.
int qpd_get_async_event(struct ibv_context *ctx, struct qpd_async *out)
{
	struct ibv_async_event ev;

	if (qpd_fn.p_ibv_get_async_event(ctx, &ev))
		return errno;
	out->type = ev.event_type;
	out->elem = QPD_ELEM_NONE;
	out->handle = 0;
	out->port = 0;
	switch (ev.event_type) {
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		out->elem = QPD_ELEM_QP;
		out->handle = (uintptr_t)ev.element.qp->qp_context;
		break;
	case IBV_EVENT_CQ_ERR:
		out->elem = QPD_ELEM_CQ;
		out->handle = (uintptr_t)ev.element.cq->cq_context;
		break;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED:
		out->elem = QPD_ELEM_SRQ;
		out->handle = (uintptr_t)ev.element.srq->srq_context;
		break;
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		out->elem = QPD_ELEM_PORT;
		out->port = ev.element.port_num;
		break;
	default:
		break;
	}
	qpd_fn.p_ibv_ack_async_event(&ev);
	return 0;
}

// qpd_get_cq_event reads one CQ event from the (non-blocking) channel fd and
// acknowledges it at once, so destroying the CQ never waits for Go.
int qpd_get_cq_event(struct ibv_comp_channel *ch, uintptr_t *handle)
{
	struct ibv_cq *cq;
	void *cq_ctx;

	if (qpd_fn.p_ibv_get_cq_event(ch, &cq, &cq_ctx))
		return errno;
	qpd_fn.p_ibv_ack_cq_events(cq, 1);
	*handle = (uintptr_t)cq_ctx;
	return 0;
}

// qpd_query_port is what the ibv_query_port macro does: the provider's
// extended query_port when it has one, else the compatibility entry point.
int qpd_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
	struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);

	if (vctx)
		return vctx->query_port(ctx, port, attr, sizeof(*attr));
	memset(attr, 0, sizeof(*attr));
	return qpd_fn.p_ibv_query_port(ctx, port, (struct _compat_ibv_port_attr *)attr);
}

uint64_t qpd_device_guid(struct ibv_device *dev)
{
	return be64toh(qpd_fn.p_ibv_get_device_guid(dev));
}

// qpd_reg_mr is what the ibv_reg_mr macro does for access flags that are
// not a compile-time constant: ibv_reg_mr_iova2 with the address as IOVA.
struct ibv_mr *qpd_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	return qpd_fn.p_ibv_reg_mr_iova2(pd, addr, len, (uintptr_t)addr, (unsigned int)access);
}

struct ibv_cq *qpd_create_cq(struct ibv_context *ctx, int cqe, uintptr_t handle, struct ibv_comp_channel *ch)
{
	return qpd_fn.p_ibv_create_cq(ctx, cqe, (void *)handle, ch, 0);
}

void qpd_set_qp_context(struct ibv_qp_init_attr *attr, uintptr_t handle) { attr->qp_context = (void *)handle; }

struct ibv_qp *qpd_ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr) { return qpd_fn.p_ibv_create_qp(pd, attr); }

struct ibv_srq *qpd_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr, uintptr_t handle)
{
	attr->srq_context = (void *)handle;
	return qpd_fn.p_ibv_create_srq(pd, attr);
}

int qpd_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	return ibv_req_notify_cq(cq, solicited_only);
}

ssize_t qpd_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *entries, size_t max)
{
	return qpd_fn.p__ibv_query_gid_table(ctx, entries, max, 0, sizeof(*entries));
}

/*
 * fakeverbs: a stand-in libibverbs.so.1 for the host tests of the trace shim,
 * where there is no RDMA device. It gives one device, "fake0", whose RC QPs
 * deliver a send to the connected QP's receive at once and complete every
 * WR on its CQ; a QP entering ERROR flushes its receives, or raises Last WQE
 * Reached when it is on an SRQ; an armed SRQ limit raises its event. Posts
 * and polls go through the context's ops table as with real providers, so
 * the shim wraps them the same way. Single-threaded programs only, but for
 * one thread polling a CQ while another posts (its head and tail are
 * atomic); bounded rings. With QPDRAIN_FAKE_POST_WAITS_POLL set when the
 * device is opened, a post that completes WRs returns only once another
 * thread has polled those completions and called ibv_poll_cq again (so
 * its poll has returned): what siw, which sends inside ibv_post_send, and
 * rxe let happen by chance. Its verbs are versioned IBVERBS_1.1, as
 * rdma-core's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define RING 4096
#define MAXQP 64

struct fcq {
	struct ibv_cq cq;
	struct ibv_wc wc[RING];
	unsigned head, tail; /* atomic: a poller thread reads what a poster pushes */
	unsigned calls;      /* ibv_poll_cq calls begun */
};

struct fsrq {
	struct ibv_srq srq;
	uint64_t id[RING];
	unsigned head, tail;
	unsigned limit; /* armed: raise SRQ_LIMIT_REACHED below it */
};

struct fqp {
	struct ibv_qp qp;
	uint32_t dest;
	int sig_all;
	uint64_t rid[RING];
	unsigned rhead, rtail;
};

static struct ibv_device dev = { .name = "fake0" };
static struct ibv_device *devs[2] = { &dev, NULL };
static struct fqp *qps[MAXQP];
static uint32_t next_qpn = 17;
static int evpipe[2] = { -1, -1 };
static int post_waits_poll;

static void cq_push(struct ibv_cq *cq, uint64_t id, enum ibv_wc_status st, enum ibv_wc_opcode op, uint32_t qpn)
{
	struct fcq *c = (struct fcq *)cq;

	unsigned tail = __atomic_load_n(&c->tail, __ATOMIC_RELAXED);

	/* a full CQ drops the completion, as an overrun does */
	if (tail - __atomic_load_n(&c->head, __ATOMIC_ACQUIRE) >= (unsigned)c->cq.cqe)
		return;
	c->wc[tail % RING] = (struct ibv_wc){ .wr_id = id, .status = st, .opcode = op, .qp_num = qpn };
	__atomic_store_n(&c->tail, tail + 1, __ATOMIC_RELEASE);
}

/* wait_polled waits, at most a second for each, until cq's completions
 * are all polled and a later ibv_poll_cq has begun (post_waits_poll). */
static void wait_polled(struct ibv_cq *cq)
{
	struct fcq *c = (struct fcq *)cq;
	struct timespec ms = { 0, 1000000 };
	unsigned calls;
	int i;

	for (i = 0; i < 1000 && __atomic_load_n(&c->head, __ATOMIC_ACQUIRE) != __atomic_load_n(&c->tail, __ATOMIC_ACQUIRE); i++)
		nanosleep(&ms, NULL);
	calls = __atomic_load_n(&c->calls, __ATOMIC_ACQUIRE);
	for (i = 0; i < 1000 && __atomic_load_n(&c->calls, __ATOMIC_ACQUIRE) == calls; i++)
		nanosleep(&ms, NULL);
}

static struct fqp *by_qpn(uint32_t qpn)
{
	for (int i = 0; i < MAXQP; i++)
		if (qps[i] && qps[i]->qp.qp_num == qpn)
			return qps[i];
	return NULL;
}

static int take_recv(struct fqp *q, uint64_t *id)
{
	if (q->qp.srq) {
		struct fsrq *s = (struct fsrq *)q->qp.srq;

		if (s->head == s->tail)
			return 0;
		*id = s->id[s->head++ % RING];
		if (s->limit && s->tail - s->head < s->limit) {
			struct ibv_async_event ev = { .element.srq = &s->srq, .event_type = IBV_EVENT_SRQ_LIMIT_REACHED };

			s->limit = 0;
			if (write(evpipe[1], &ev, sizeof(ev)) != sizeof(ev))
				abort();
		}
		return 1;
	}
	if (q->rhead == q->rtail)
		return 0;
	*id = q->rid[q->rhead++ % RING];
	return 1;
}

static int post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct fqp *q = (struct fqp *)qp;

	for (; wr; wr = wr->next) {
		struct fqp *d = by_qpn(q->dest);
		uint64_t rid;

		if (qp->state == IBV_QPS_ERR) {
			cq_push(qp->send_cq, wr->wr_id, IBV_WC_WR_FLUSH_ERR, 0, qp->qp_num);
			continue;
		}
		if (qp->state != IBV_QPS_RTS || !d || !take_recv(d, &rid)) {
			*bad = wr;
			return EINVAL;
		}
		cq_push(d->qp.recv_cq, rid, IBV_WC_SUCCESS, IBV_WC_RECV, d->qp.qp_num);
		if (q->sig_all || (wr->send_flags & IBV_SEND_SIGNALED))
			cq_push(qp->send_cq, wr->wr_id, IBV_WC_SUCCESS, IBV_WC_SEND, qp->qp_num);
		if (post_waits_poll) {
			wait_polled(d->qp.recv_cq);
			wait_polled(qp->send_cq);
		}
	}
	return 0;
}

static int post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct fqp *q = (struct fqp *)qp;

	for (; wr; wr = wr->next) {
		if (qp->state == IBV_QPS_ERR) {
			cq_push(qp->recv_cq, wr->wr_id, IBV_WC_WR_FLUSH_ERR, 0, qp->qp_num);
			continue;
		}
		if (q->rtail - q->rhead >= RING) {
			*bad = wr;
			return ENOMEM;
		}
		q->rid[q->rtail++ % RING] = wr->wr_id;
	}
	return 0;
}

static int post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct fsrq *s = (struct fsrq *)srq;

	for (; wr; wr = wr->next) {
		if (s->tail - s->head >= RING) {
			*bad = wr;
			return ENOMEM;
		}
		s->id[s->tail++ % RING] = wr->wr_id;
	}
	return 0;
}

static int poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	struct fcq *c = (struct fcq *)cq;
	unsigned head = __atomic_load_n(&c->head, __ATOMIC_RELAXED);
	int i = 0;

	__atomic_add_fetch(&c->calls, 1, __ATOMIC_RELEASE);
	while (i < n && head != __atomic_load_n(&c->tail, __ATOMIC_ACQUIRE))
		wc[i++] = c->wc[head++ % RING];
	__atomic_store_n(&c->head, head, __ATOMIC_RELEASE);
	return i;
}

struct ibv_device **ibv_get_device_list(int *n)
{
	if (n)
		*n = 1;
	return devs;
}

void ibv_free_device_list(struct ibv_device **list) { (void)list; }

const char *ibv_get_device_name(struct ibv_device *d) { return d->name; }

/* The contexts come from a static pool, not malloc: a thread that opens
 * and closes them in a loop then never waits on malloc's lock, which fork
 * takes (fork_lock needs that thread inside the shim's lock at a fork). */
#define MAXCTX 8
static struct verbs_context ctxs[MAXCTX];
static int ctx_used[MAXCTX];

struct ibv_context *ibv_open_device(struct ibv_device *d)
{
	struct verbs_context *v = NULL;

	for (int i = 0; i < MAXCTX && !v; i++)
		if (!__atomic_exchange_n(&ctx_used[i], 1, __ATOMIC_ACQ_REL))
			v = &ctxs[i];
	if (!v || (evpipe[0] < 0 && pipe(evpipe))) {
		errno = ENOMEM;
		return NULL;
	}
	memset(v, 0, sizeof(*v));
	post_waits_poll = getenv("QPDRAIN_FAKE_POST_WAITS_POLL") != NULL;
	v->context.device = d;
	v->context.async_fd = evpipe[0];
	v->context.ops.post_send = post_send;
	v->context.ops.post_recv = post_recv;
	v->context.ops.post_srq_recv = post_srq_recv;
	v->context.ops.poll_cq = poll_cq;
	return &v->context;
}

int ibv_close_device(struct ibv_context *ctx)
{
	struct verbs_context *v = (struct verbs_context *)((char *)ctx - offsetof(struct verbs_context, context));

	__atomic_store_n(&ctx_used[v - ctxs], 0, __ATOMIC_RELEASE);
	return 0;
}

int ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
	(void)ctx, (void)port, (void)index;
	memset(gid, 0, sizeof(*gid));
	return 0;
}

struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
	struct ibv_pd *pd = calloc(1, sizeof(*pd));

	if (pd)
		pd->context = ctx;
	return pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
	free(pd);
	return 0;
}

struct ibv_mr *(ibv_reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	struct ibv_mr *mr = calloc(1, sizeof(*mr));

	(void)access;
	if (mr)
		*mr = (struct ibv_mr){ .context = pd->context, .pd = pd, .addr = addr, .length = len, .lkey = 1 };
	return mr;
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
	free(mr);
	return 0;
}

struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context, struct ibv_comp_channel *ch, int vec)
{
	struct fcq *c = calloc(1, sizeof(*c));

	(void)cq_context, (void)ch, (void)vec;
	if (!c)
		return NULL;
	c->cq.context = ctx;
	c->cq.cqe = cqe < RING ? cqe : RING;
	return &c->cq;
}

int ibv_destroy_cq(struct ibv_cq *cq)
{
	free(cq);
	return 0;
}

struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	struct fsrq *s = calloc(1, sizeof(*s));

	(void)attr;
	if (!s)
		return NULL;
	s->srq.context = pd->context;
	s->srq.pd = pd;
	return &s->srq;
}

int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int mask)
{
	if (mask & IBV_SRQ_LIMIT)
		((struct fsrq *)srq)->limit = attr->srq_limit;
	return 0;
}

int ibv_destroy_srq(struct ibv_srq *srq)
{
	free(srq);
	return 0;
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
	struct fqp *q = calloc(1, sizeof(*q));
	int i;

	for (i = 0; i < MAXQP && qps[i]; i++)
		;
	if (!q || i == MAXQP) {
		free(q);
		errno = ENOMEM;
		return NULL;
	}
	q->qp = (struct ibv_qp){ .context = pd->context, .pd = pd, .send_cq = a->send_cq, .recv_cq = a->recv_cq,
				 .srq = a->srq, .qp_num = next_qpn++, .qp_type = a->qp_type, .state = IBV_QPS_RESET };
	q->sig_all = a->sq_sig_all;
	qps[i] = q;
	return &q->qp;
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	struct fqp *q = (struct fqp *)qp;
	uint64_t id;

	if (!(mask & IBV_QP_STATE))
		return 0;
	if (mask & IBV_QP_DEST_QPN)
		q->dest = attr->dest_qp_num;
	if (attr->qp_state == IBV_QPS_ERR && qp->state != IBV_QPS_ERR) {
		/* a QP on an SRQ flushes nothing of the SRQ's: it raises Last WQE Reached */
		if (qp->srq) {
			struct ibv_async_event ev = { .element.qp = qp, .event_type = IBV_EVENT_QP_LAST_WQE_REACHED };

			if (write(evpipe[1], &ev, sizeof(ev)) != sizeof(ev))
				return EIO;
		} else {
			while (take_recv(q, &id))
				cq_push(qp->recv_cq, id, IBV_WC_WR_FLUSH_ERR, 0, qp->qp_num);
		}
	}
	qp->state = attr->qp_state;
	return 0;
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
	for (int i = 0; i < MAXQP; i++)
		if (qps[i] == (struct fqp *)qp)
			qps[i] = NULL;
	free(qp);
	return 0;
}

int ibv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *ev)
{
	return read(ctx->async_fd, ev, sizeof(*ev)) == sizeof(*ev) ? 0 : -1;
}

void ibv_ack_async_event(struct ibv_async_event *ev) { (void)ev; }

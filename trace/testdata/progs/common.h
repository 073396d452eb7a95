/*
 * Shared by the trace tests' planted programs: open the test device
 * (QPDRAIN_TEST_DEVICE, else the first one), and connect RC QPs to each
 * other in loopback over port 1 with the RoCE v2 GID QPDRAIN_TEST_GID_INDEX,
 * as ibv_rc_pingpong does. Every failure exits 2 with the verb named, so a
 * planted program fails loudly instead of producing a wrong trace.
 */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <poll.h>
#include <unistd.h>

#define die(what) do { perror(what); exit(2); } while (0)

struct rig {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	char *buf;
	int gid_index;
	union ibv_gid gid;
};

static inline void rig_open(struct rig *r)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	const char *want = getenv("QPDRAIN_TEST_DEVICE");
	const char *gidx = getenv("QPDRAIN_TEST_GID_INDEX");

	if (!list || n == 0)
		die("ibv_get_device_list: no device");
	r->ctx = NULL;
	for (int i = 0; i < n && !r->ctx; i++)
		if (!want || !strcmp(ibv_get_device_name(list[i]), want))
			r->ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!r->ctx)
		die("ibv_open_device");
	r->gid_index = gidx ? atoi(gidx) : 1;
	if (ibv_query_gid(r->ctx, 1, r->gid_index, &r->gid))
		die("ibv_query_gid");
	if (!(r->pd = ibv_alloc_pd(r->ctx)))
		die("ibv_alloc_pd");
	r->buf = calloc(1, 1 << 16);
	if (!(r->mr = ibv_reg_mr(r->pd, r->buf, 1 << 16, IBV_ACCESS_LOCAL_WRITE)))
		die("ibv_reg_mr");
}

static inline void rig_close(struct rig *r)
{
	if (ibv_dereg_mr(r->mr) || ibv_dealloc_pd(r->pd) || ibv_close_device(r->ctx))
		die("rig_close");
	free(r->buf);
}

static inline struct ibv_cq *cq_new(struct rig *r, int cqe)
{
	struct ibv_cq *cq = ibv_create_cq(r->ctx, cqe, NULL, NULL, 0);

	if (!cq)
		die("ibv_create_cq");
	return cq;
}

static inline struct ibv_qp *qp_new(struct rig *r, struct ibv_cq *scq, struct ibv_cq *rcq, struct ibv_srq *srq, int depth)
{
	struct ibv_qp_init_attr a = {
		.send_cq = scq, .recv_cq = rcq, .srq = srq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = depth, .max_recv_wr = srq ? 0 : depth, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(r->pd, &a);

	if (!qp)
		die("ibv_create_qp");
	return qp;
}

/* qp_connect moves qp through INIT, RTR (to remote_qpn on this port's GID) and RTS. */
static inline void qp_connect(struct rig *r, struct ibv_qp *qp, uint32_t remote_qpn)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = IBV_ACCESS_LOCAL_WRITE };

	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("ibv_modify_qp INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = remote_qpn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = r->gid;
	a.ah_attr.grh.sgid_index = r->gid_index;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("ibv_modify_qp RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				  IBV_QP_MAX_QP_RD_ATOMIC))
		die("ibv_modify_qp RTS");
}

static inline void qp_pair(struct rig *r, struct ibv_qp *a, struct ibv_qp *b)
{
	qp_connect(r, a, b->qp_num);
	qp_connect(r, b, a->qp_num);
}

/* pair_new creates two RC QPs completing into scq and rcq, *a with queues of
 * 8 WRs and *b with queues of depth (receiving from srq unless it is NULL),
 * and connects them to each other. */
static inline void pair_new(struct rig *r, struct ibv_cq *scq, struct ibv_cq *rcq, struct ibv_srq *srq, int depth,
			    struct ibv_qp **a, struct ibv_qp **b)
{
	*a = qp_new(r, scq, rcq, NULL, 8);
	*b = qp_new(r, scq, rcq, srq, depth);
	qp_pair(r, *a, *b);
}

/* rig_open_pair opens the rig and, on one CQ of 16 entries for all their
 * queues, a connected pair of RC QPs of 8 WRs each (pair_new); it returns
 * the CQ. It is the whole setup of a program whose subject comes after. */
static inline struct ibv_cq *rig_open_pair(struct rig *r, struct ibv_qp **a, struct ibv_qp **b)
{
	struct ibv_cq *cq;

	rig_open(r);
	cq = cq_new(r, 16);
	pair_new(r, cq, cq, NULL, 8, a, b);
	return cq;
}

static inline void to_error(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		die("ibv_modify_qp ERR");
}

static inline void post_recv(struct rig *r, struct ibv_qp *qp, uint64_t id)
{
	struct ibv_sge s = { .addr = (uintptr_t)r->buf + 4096, .length = 1024, .lkey = r->mr->lkey };
	struct ibv_recv_wr w = { .wr_id = id, .sg_list = &s, .num_sge = 1 }, *bad;

	if (ibv_post_recv(qp, &w, &bad))
		die("ibv_post_recv");
}

static inline void post_srq_recv(struct rig *r, struct ibv_srq *srq, uint64_t id)
{
	struct ibv_sge s = { .addr = (uintptr_t)r->buf + 8192, .length = 1024, .lkey = r->mr->lkey };
	struct ibv_recv_wr w = { .wr_id = id, .sg_list = &s, .num_sge = 1 }, *bad;

	if (ibv_post_srq_recv(srq, &w, &bad))
		die("ibv_post_srq_recv");
}

/* srq_new creates an SRQ of max_wr WRs and posts n receives to it (wr_id 1 to n). */
static inline struct ibv_srq *srq_new(struct rig *r, uint32_t max_wr, int n)
{
	struct ibv_srq_init_attr a = { .attr = { .max_wr = max_wr, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(r->pd, &a);

	if (!srq)
		die("ibv_create_srq");
	for (int i = 1; i <= n; i++)
		post_srq_recv(r, srq, i);
	return srq;
}

static inline void post_send(struct rig *r, struct ibv_qp *qp, uint64_t id)
{
	struct ibv_sge s = { .addr = (uintptr_t)r->buf, .length = 64, .lkey = r->mr->lkey };
	struct ibv_send_wr w = { .wr_id = id, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;

	if (ibv_post_send(qp, &w, &bad))
		die("ibv_post_send");
}

static inline long now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* poll_n polls cq until it has n completions or ms pass; it returns how many it got. */
static inline int poll_n(struct ibv_cq *cq, int n, int ms)
{
	struct ibv_wc wc[16];
	int got = 0;
	long end = now_ms() + ms;

	while (got < n && now_ms() < end) {
		int k = ibv_poll_cq(cq, n - got < 16 ? n - got : 16, wc);

		if (k < 0)
			die("ibv_poll_cq");
		got += k;
		if (!k)
			usleep(1000);
	}
	return got;
}

static inline void need(int got, int want, const char *what)
{
	if (got != want) {
		fprintf(stderr, "%s: %d completions, want %d\n", what, got, want);
		exit(2);
	}
}

/* await_event waits (2 s at most) for the next async event of type t; others are acknowledged. */
static inline void await_event(struct rig *r, enum ibv_event_type t, struct ibv_async_event *ev)
{
	for (;;) {
		struct pollfd p = { .fd = r->ctx->async_fd, .events = POLLIN };

		if (poll(&p, 1, 2000) != 1) {
			fprintf(stderr, "no async event %d within 2 s\n", t);
			exit(2);
		}
		if (ibv_get_async_event(r->ctx, ev))
			die("ibv_get_async_event");
		if (ev->event_type == t)
			return;
		ibv_ack_async_event(ev);
	}
}

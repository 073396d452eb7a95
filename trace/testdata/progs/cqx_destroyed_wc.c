/* cqx_destroyed_wc: destroyed_wc with its send CQ made by ibv_create_cq_ex
 * (without IBV_WC_EX_WITH_QP_NUM) and polled with ibv_start_poll,
 * ibv_next_poll and ibv_end_poll: a send completes but is not polled before
 * its QP is destroyed; the program then polls it, and one more round trip
 * before. Expected: completion-for-destroyed-qp (which the trace finds only
 * by seeing the extended poll path). */
#include "common.h"

/* poll_ex polls cq until it has n completions or 2 s pass. */
static int poll_ex(struct ibv_cq_ex *cq, int n)
{
	struct ibv_poll_cq_attr attr = { 0 };
	int got = 0;
	long end = now_ms() + 2000;

	while (got < n && now_ms() < end) {
		int ret = ibv_start_poll(cq, &attr);

		if (ret == ENOENT) {
			usleep(1000);
			continue;
		}
		if (ret)
			die("ibv_start_poll");
		do
			got++;
		while (got < n && (ret = ibv_next_poll(cq)) == 0);
		if (ret && ret != ENOENT)
			die("ibv_next_poll");
		ibv_end_poll(cq);
	}
	return got;
}

int main(void)
{
	struct rig r;
	struct ibv_qp *a, *b;

	rig_open(&r);
	struct ibv_cq_init_attr_ex ca = { .cqe = 16, .wc_flags = IBV_WC_EX_WITH_BYTE_LEN };
	struct ibv_cq_ex *sx = ibv_create_cq_ex(r.ctx, &ca);
	if (!sx)
		die("ibv_create_cq_ex");
	struct ibv_cq *scq = ibv_cq_ex_to_cq(sx), *rcq = cq_new(&r, 16);
	pair_new(&r, scq, rcq, NULL, 8, &a, &b);
	post_recv(&r, b, 1);
	post_send(&r, a, 2);
	need(poll_n(rcq, 1, 2000), 1, "the first receive");
	need(poll_ex(sx, 1), 1, "the first send");
	post_recv(&r, b, 3);
	post_send(&r, a, 4);
	need(poll_n(rcq, 1, 2000), 1, "the receive");
	usleep(100000); /* the send's completion is in scq by now */
	if (ibv_destroy_qp(a))
		die("ibv_destroy_qp");
	need(poll_ex(sx, 1), 1, "the send of the destroyed QP");
	to_error(b);
	if (ibv_destroy_qp(b) || ibv_destroy_cq(scq) || ibv_destroy_cq(rcq))
		die("destroy");
	rig_close(&r);
	return 0;
}

/* cq_oversize: 32 receives posted to a QP whose receive CQ holds 8; the
 * traffic is polled one message at a time, so the CQ never overruns, but a
 * flush would have overrun it. Expected: cq-over-size. */
#include "common.h"

int main(void)
{
	struct rig r;
	struct ibv_qp *a, *b;

	rig_open(&r);
	struct ibv_cq *scq = cq_new(&r, 16), *rcq = cq_new(&r, 8);
	pair_new(&r, scq, rcq, NULL, 64, &a, &b);
	for (int i = 1; i <= 32; i++)
		post_recv(&r, b, i);
	for (int i = 1; i <= 32; i++) {
		post_send(&r, a, 1000 + i);
		need(poll_n(scq, 1, 2000), 1, "a send");
		need(poll_n(rcq, 1, 2000), 1, "its receive");
	}
	to_error(a);
	to_error(b);
	if (ibv_destroy_qp(a) || ibv_destroy_qp(b) || ibv_destroy_cq(scq) || ibv_destroy_cq(rcq))
		die("destroy");
	rig_close(&r);
	return 0;
}

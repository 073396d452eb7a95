/* destroyed_wc: a send completes but is not polled before its QP is
 * destroyed; the program then polls it. Expected: completion-for-destroyed-qp. */
#include "common.h"

int main(void)
{
	struct rig r;
	struct ibv_qp *a, *b;

	rig_open(&r);
	struct ibv_cq *scq = cq_new(&r, 16), *rcq = cq_new(&r, 16);
	pair_new(&r, scq, rcq, NULL, 8, &a, &b);
	post_recv(&r, b, 1);
	post_send(&r, a, 2);
	need(poll_n(rcq, 1, 2000), 1, "the receive");
	usleep(100000); /* the send's completion is in scq by now */
	if (ibv_destroy_qp(a))
		die("ibv_destroy_qp");
	need(poll_n(scq, 1, 2000), 1, "the send of the destroyed QP");
	to_error(b);
	if (ibv_destroy_qp(b) || ibv_destroy_cq(scq) || ibv_destroy_cq(rcq))
		die("destroy");
	rig_close(&r);
	return 0;
}

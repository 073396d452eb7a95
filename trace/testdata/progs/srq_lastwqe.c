/* srq_lastwqe: a QP on an SRQ moved to ERROR and destroyed without waiting
 * for its Last WQE Reached. Expected: srq-destroyed-before-last-wqe. */
#include "common.h"

int main(void)
{
	struct rig r;
	struct ibv_qp *a, *b;

	rig_open(&r);
	struct ibv_cq *cq = cq_new(&r, 32);
	struct ibv_srq *srq = srq_new(&r, 16, 4);
	pair_new(&r, cq, cq, srq, 8, &a, &b);
	post_send(&r, a, 100);
	need(poll_n(cq, 2, 2000), 2, "send and its SRQ receive");
	to_error(a);
	to_error(b);
	if (ibv_destroy_qp(b))
		die("ibv_destroy_qp");
	/* the peer is drained properly: it had nothing outstanding */
	if (ibv_destroy_qp(a) || ibv_destroy_srq(srq) || ibv_destroy_cq(cq))
		die("destroy");
	rig_close(&r);
	return 0;
}

/* srq_lastwqe: a QP on an SRQ moved to ERROR and destroyed without waiting
 * for its Last WQE Reached. Expected: srq-destroyed-before-last-wqe. */
#include "common.h"

int main(void)
{
	struct rig r;
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 16, .max_sge = 1 } };

	rig_open(&r);
	struct ibv_cq *cq = cq_new(&r, 32);
	struct ibv_srq *srq = ibv_create_srq(r.pd, &sa);
	if (!srq)
		die("ibv_create_srq");
	for (int i = 1; i <= 4; i++)
		post_srq_recv(&r, srq, i);
	struct ibv_qp *a = qp_new(&r, cq, cq, NULL, 8), *b = qp_new(&r, cq, cq, srq, 8);
	qp_pair(&r, a, b);
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

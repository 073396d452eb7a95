/* unacked: the program gets its SRQ QP's Last WQE Reached but never
 * acknowledges it (its destroy would block, so it exits without one).
 * Expected: async-event-not-acked. */
#include "common.h"

int main(void)
{
	struct rig r;
	struct ibv_async_event ev;
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 16, .max_sge = 1 } };

	rig_open(&r);
	struct ibv_cq *cq = cq_new(&r, 32);
	struct ibv_srq *srq = ibv_create_srq(r.pd, &sa);
	if (!srq)
		die("ibv_create_srq");
	struct ibv_qp *a = qp_new(&r, cq, cq, NULL, 8), *b = qp_new(&r, cq, cq, srq, 8);
	qp_pair(&r, a, b);
	to_error(b);
	await_event(&r, IBV_EVENT_QP_LAST_WQE_REACHED, &ev);
	to_error(a);
	if (ibv_destroy_qp(a))
		die("ibv_destroy_qp");
	printf("unacked: Last WQE Reached of qpn %u got, not acknowledged\n", ev.element.qp->qp_num);
	return 0; /* exit frees the rest */
}

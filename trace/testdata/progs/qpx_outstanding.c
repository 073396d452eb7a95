/* qpx_outstanding: a send posted through the ibv_qp_ex path (ibv_wr_start,
 * ibv_wr_send, ibv_wr_complete) completes, but its completion is never
 * polled before the QP is destroyed. Expected: destroyed-with-outstanding,
 * 1 on the send queue (which the shim sees only by taking over the QP's
 * builders). */
#include "common.h"

int main(void)
{
	struct rig r;

	rig_open(&r);
	struct ibv_cq *scq = cq_new(&r, 16), *rcq = cq_new(&r, 16);
	struct ibv_qp_init_attr_ex xa = {
		.send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_RC, .pd = r.pd,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.send_ops_flags = IBV_QP_EX_WITH_SEND,
	};
	struct ibv_qp *a = ibv_create_qp_ex(r.ctx, &xa);
	if (!a)
		die("ibv_create_qp_ex");
	struct ibv_qp *b = qp_new(&r, scq, rcq, NULL, 8);
	qp_pair(&r, a, b);
	post_recv(&r, b, 1);
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(a);
	ibv_wr_start(x);
	x->wr_id = 0x77;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(x);
	ibv_wr_set_sge(x, r.mr->lkey, (uintptr_t)r.buf, 64);
	if (ibv_wr_complete(x))
		die("ibv_wr_complete");
	need(poll_n(rcq, 1, 2000), 1, "the receive");
	usleep(100000);
	if (ibv_destroy_qp(a))
		die("ibv_destroy_qp");
	to_error(b);
	if (ibv_destroy_qp(b) || ibv_destroy_cq(scq) || ibv_destroy_cq(rcq))
		die("destroy");
	rig_close(&r);
	return 0;
}

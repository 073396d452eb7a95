/* qpx_bind_mw: a QP made with ibv_qp_ex operations beyond the plain sends
 * (IBV_QP_EX_WITH_BIND_MW) binds a memory window and sends through
 * ibv_wr_bind_mw and ibv_wr_send in one batch; neither completion is polled
 * before the QP is destroyed. Expected: destroyed-with-outstanding, 2 on the
 * send queue (the shim takes over the bind builder too: the QP is judged). */
#include "common.h"

int main(void)
{
	struct rig r;

	rig_open(&r);
	struct ibv_mr *mr = ibv_reg_mr(r.pd, r.buf + 4096, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	struct ibv_mw *mw = ibv_alloc_mw(r.pd, IBV_MW_TYPE_2);
	if (!mr || !mw)
		die("ibv_reg_mr/ibv_alloc_mw");
	struct ibv_cq *scq = cq_new(&r, 16), *rcq = cq_new(&r, 16);
	struct ibv_qp_init_attr_ex xa = {
		.send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_RC, .pd = r.pd,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_BIND_MW,
	};
	struct ibv_qp *a = ibv_create_qp_ex(r.ctx, &xa);
	if (!a)
		die("ibv_create_qp_ex");
	struct ibv_qp *b = qp_new(&r, scq, rcq, NULL, 8);
	qp_pair(&r, a, b);
	post_recv(&r, b, 1);
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(a);
	struct ibv_mw_bind_info bind = { .mr = mr, .addr = (uintptr_t)r.buf + 4096, .length = 4096, .mw_access_flags = IBV_ACCESS_REMOTE_READ };
	ibv_wr_start(x);
	x->wr_id = 0x66;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(x, mw, ibv_inc_rkey(mw->rkey), &bind);
	x->wr_id = 0x77;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(x);
	ibv_wr_set_sge(x, r.mr->lkey, (uintptr_t)r.buf, 64);
	if (ibv_wr_complete(x))
		die("ibv_wr_complete");
	need(poll_n(rcq, 1, 2000), 1, "the receive");
	usleep(100000);
	/* the window first: rxe's destroy of a QP a type 2 window is bound
	 * to waits for it (about 50 s on Linux 6.12) */
	if (ibv_dealloc_mw(mw) || ibv_destroy_qp(a))
		die("ibv_dealloc_mw/ibv_destroy_qp");
	to_error(b);
	if (ibv_destroy_qp(b) || ibv_destroy_cq(scq) || ibv_destroy_cq(rcq) || ibv_dereg_mr(mr))
		die("destroy");
	rig_close(&r);
	return 0;
}

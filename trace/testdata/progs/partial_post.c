/* partial_post: a chain of two sends of which the provider takes the first
 * only (the fake fails a send whose peer has no receive posted, bad_wr the
 * second), then the first's completions polled and the QPs destroyed. For
 * the fake only (rxe would post both). Expected: clean, 2 WRs posted. */
#include "common.h"

int main(void)
{
	struct rig r;
	struct ibv_qp *a, *b;
	struct ibv_sge s = { 0 };
	struct ibv_send_wr w[2] = { 0 }, *bad = NULL;

	struct ibv_cq *cq = rig_open_pair(&r, &a, &b);
	s = (struct ibv_sge){ .addr = (uintptr_t)r.buf, .length = 64, .lkey = r.mr->lkey };
	for (int i = 0; i < 2; i++)
		w[i] = (struct ibv_send_wr){ .wr_id = i + 1, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
	w[0].next = &w[1];
	post_recv(&r, b, 7);
	if (ibv_post_send(a, w, &bad) == 0 || bad != &w[1]) {
		fprintf(stderr, "partial_post: want the second send refused\n");
		return 2;
	}
	need(poll_n(cq, 2, 2000), 2, "the first send");
	if (ibv_destroy_qp(a) || ibv_destroy_qp(b) || ibv_destroy_cq(cq))
		die("destroy");
	rig_close(&r);
	return 0;
}

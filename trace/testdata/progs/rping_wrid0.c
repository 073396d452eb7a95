/* rping_wrid0: rping's pattern: every WR has wr_id 0, sends and receives of
 * both QPs complete to one CQ, and the last ones are flushed at disconnect
 * (a send may complete or flush, racing the move to ERROR). Every WR's
 * completion is polled before the destroy. Expected: clean. */
#include "common.h"

int main(void)
{
	struct rig r;
	struct ibv_qp *a, *b;

	struct ibv_cq *cq = rig_open_pair(&r, &a, &b);
	for (int i = 0; i < 3; i++) {
		post_recv(&r, a, 0);
		post_recv(&r, b, 0);
		post_send(&r, a, 0);
		need(poll_n(cq, 2, 2000), 2, "a to b");
		post_send(&r, b, 0);
		need(poll_n(cq, 2, 2000), 2, "b to a");
	}
	post_recv(&r, a, 0);
	post_recv(&r, b, 0);
	post_send(&r, a, 0);
	to_error(a);
	to_error(b);
	need(poll_n(cq, 3, 2000), 3, "disconnect");
	if (ibv_destroy_qp(a) || ibv_destroy_qp(b) || ibv_destroy_cq(cq))
		die("destroy");
	rig_close(&r);
	return 0;
}

/* clean: a message over two loopback RC QPs, then the teardown every rule
 * asks for: ERROR, every flush polled, destroy, CQ last. Expected: clean. */
#include "common.h"

int main(void)
{
	struct rig r;
	struct ibv_qp *a, *b;

	struct ibv_cq *cq = rig_open_pair(&r, &a, &b);
	post_recv(&r, b, 1);
	post_recv(&r, b, 2);
	post_send(&r, a, 3);
	need(poll_n(cq, 2, 2000), 2, "send and its receive");
	to_error(a);
	to_error(b);
	need(poll_n(cq, 1, 2000), 1, "the flush of the second receive");
	if (ibv_destroy_qp(a) || ibv_destroy_qp(b) || ibv_destroy_cq(cq))
		die("destroy");
	rig_close(&r);
	printf("clean: done\n");
	return 0;
}

/* outstanding: receives posted, the QP moved to ERROR and destroyed at once,
 * its flushes never polled. Expected: destroyed-with-outstanding (4 on the
 * receive queue of the second QP). */
#include "common.h"

int main(void)
{
	struct rig r;
	struct ibv_qp *a, *b;

	struct ibv_cq *cq = rig_open_pair(&r, &a, &b);
	for (int i = 1; i <= 4; i++)
		post_recv(&r, b, i);
	to_error(a);
	to_error(b);
	if (ibv_destroy_qp(b) || ibv_destroy_qp(a) || ibv_destroy_cq(cq))
		die("destroy");
	rig_close(&r);
	return 0;
}

/* unacked: the program gets its SRQ's limit event (IBV_EVENT_SRQ_LIMIT_REACHED,
 * which rxe raises on every kernel) but never acknowledges it, so it exits
 * without destroying the SRQ (that destroy would block). Expected:
 * async-event-not-acked. */
#include "common.h"

int main(void)
{
	struct rig r;
	struct ibv_qp *a, *b;
	struct ibv_async_event ev;
	struct ibv_srq_attr lim = { .srq_limit = 4 };

	rig_open(&r);
	struct ibv_cq *cq = cq_new(&r, 32);
	struct ibv_srq *srq = srq_new(&r, 16, 4);
	if (ibv_modify_srq(srq, &lim, IBV_SRQ_LIMIT))
		die("ibv_modify_srq");
	pair_new(&r, cq, cq, srq, 8, &a, &b);
	post_send(&r, a, 100);
	need(poll_n(cq, 2, 2000), 2, "send and its SRQ receive");
	await_event(&r, IBV_EVENT_SRQ_LIMIT_REACHED, &ev);
	printf("unacked: the SRQ's limit event got, not acknowledged\n");
	return 0; /* exit frees the rest */
}

/* two_sites: two QPs, each with 3 receives posted, moved to ERROR and
 * destroyed without polling their flushes, by two functions that differ
 * only in their names, so that the findings differ only in their call
 * sites. Expected: destroyed-with-outstanding twice, one called at
 * destroy_kept, one at destroy_accepted (a suppression's caller= tells
 * them apart). */
#include "common.h"

/* noinline, and work after the call: the call must not become a tail call
 * (its return address would be main's) */
__attribute__((noinline)) void destroy_kept(struct ibv_qp *qp)
{
	if (ibv_destroy_qp(qp))
		die("ibv_destroy_qp");
}

__attribute__((noinline)) void destroy_accepted(struct ibv_qp *qp)
{
	if (ibv_destroy_qp(qp))
		die("ibv_destroy_qp");
}

int main(void)
{
	struct rig r;
	struct ibv_qp *a, *b;

	struct ibv_cq *cq = rig_open_pair(&r, &a, &b);
	for (int i = 1; i <= 3; i++) {
		post_recv(&r, a, i);
		post_recv(&r, b, 10 + i);
	}
	to_error(a);
	to_error(b);
	destroy_kept(a);
	destroy_accepted(b);
	if (ibv_destroy_cq(cq))
		die("ibv_destroy_cq");
	rig_close(&r);
	return 0;
}

/* posted_in_error: a receive posted to a QP in ERROR, after the provider has
 * settled, waited for 1 s; rxe flushes it late or never (docs/PROVIDERS.md).
 * Expected: posted-in-error-not-flushed, or clean where the provider
 * flushes it. */
#include "common.h"

int main(void)
{
	struct rig r;
	struct ibv_qp *a, *b;

	struct ibv_cq *cq = rig_open_pair(&r, &a, &b);
	to_error(a);
	to_error(b);
	usleep(200000);
	post_recv(&r, b, 7);
	int got = poll_n(cq, 1, 1000);
	printf("posted_in_error: %d completion(s) of the receive posted in ERROR within 1 s\n", got);
	if (ibv_destroy_qp(a) || ibv_destroy_qp(b) || ibv_destroy_cq(cq))
		die("destroy");
	rig_close(&r);
	return 0;
}

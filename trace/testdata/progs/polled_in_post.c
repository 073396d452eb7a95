/* polled_in_post: a second thread polls the CQ in a loop while the first
 * posts, so a provider that completes a WR inside its post (siw sends from
 * ibv_post_send; rxe's worker may complete it before the call returns) lets
 * the poller get the completion before the post has returned: the fake
 * provider of the host tests is told to wait in its post until that has
 * happened (QPDRAIN_FAKE_POST_WAITS_POLL; real providers ignore it). rping's
 * pattern: one CQ, every wr_id 0. Every completion is polled before the
 * destroy. Expected: clean. */
#include <pthread.h>

#include "common.h"

#define ROUNDS 3

static struct ibv_cq *cq;
static int got, stop;

static void *poller(void *arg)
{
	long end = now_ms() + 10000;

	(void)arg;
	while (!__atomic_load_n(&stop, __ATOMIC_ACQUIRE) && now_ms() < end) {
		struct ibv_wc wc[4];
		int n = ibv_poll_cq(cq, 4, wc);

		if (n < 0)
			die("ibv_poll_cq");
		for (int i = 0; i < n; i++)
			if (wc[i].status != IBV_WC_SUCCESS) {
				fprintf(stderr, "polled_in_post: completion status %d\n", wc[i].status);
				exit(2);
			}
		__atomic_add_fetch(&got, n, __ATOMIC_RELEASE);
	}
	return NULL;
}

int main(void)
{
	struct rig r;
	struct ibv_qp *a, *b;
	pthread_t th;
	long end;

	setenv("QPDRAIN_FAKE_POST_WAITS_POLL", "1", 1);
	cq = rig_open_pair(&r, &a, &b);
	if (pthread_create(&th, NULL, poller, NULL))
		die("pthread_create");
	for (int i = 0; i < ROUNDS; i++) {
		post_recv(&r, a, 0);
		post_recv(&r, b, 0);
		post_send(&r, a, 0);
		post_send(&r, b, 0);
	}
	for (end = now_ms() + 5000; __atomic_load_n(&got, __ATOMIC_ACQUIRE) < 4 * ROUNDS && now_ms() < end;)
		usleep(1000);
	__atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
	pthread_join(th, NULL);
	need(got, 4 * ROUNDS, "completions");
	if (ibv_destroy_qp(a) || ibv_destroy_qp(b) || ibv_destroy_cq(cq))
		die("destroy");
	rig_close(&r);
	return 0;
}

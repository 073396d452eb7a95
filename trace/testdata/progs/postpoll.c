/* postpoll [N]: the overhead benchmark: N round trips of one receive posted,
 * one send posted and both completions busy-polled, on two loopback RC QPs;
 * prints the time per round trip, and the thread's CPU time per round trip
 * (which a loaded host's other work moves far less). Drained and torn down
 * cleanly. */
#include "common.h"

int main(int argc, char **argv)
{
	struct rig r;
	struct ibv_qp *a, *b;
	int n = argc > 1 ? atoi(argv[1]) : 5000;
	struct timespec t0, t1, c0, c1;

	struct ibv_cq *cq = rig_open_pair(&r, &a, &b);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
	for (int i = 0; i < n; i++) {
		struct ibv_wc wc[2];
		int got = 0;
		long spins = 0, end = now_ms() + 2000;

		post_recv(&r, b, 2 * i);
		post_send(&r, a, 2 * i + 1);
		while (got < 2) {
			int k = ibv_poll_cq(cq, 2 - got, wc);

			if (k < 0)
				die("ibv_poll_cq");
			got += k;
			if (!k && ++spins % 4096 == 0 && now_ms() > end) {
				fprintf(stderr, "postpoll: round trip %d: no completion within 2 s\n", i);
				return 2;
			}
		}
	}
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double us = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / n;
	double cpu = ((c1.tv_sec - c0.tv_sec) * 1e9 + (c1.tv_nsec - c0.tv_nsec)) / 1e3 / n;
	to_error(a);
	to_error(b);
	if (ibv_destroy_qp(a) || ibv_destroy_qp(b) || ibv_destroy_cq(cq))
		die("destroy");
	rig_close(&r);
	printf("postpoll: %d round trips, %.2f us each, %.3f us of CPU each\n", n, us, cpu);
	return 0;
}

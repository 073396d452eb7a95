// cpoll measures ibv_poll_cq on an empty CQ in C, the baseline for the Go
// benchmark BenchmarkPollEmptyCQ in internal/testing/devtest: the same loop, batch 1
// and batch 16, without cgo. It prints go test -bench style lines.
//
// Build: gcc -O2 -o cpoll cpoll.c -libverbs
// Run:   ./cpoll rxe0 [iterations]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
	const char *name = argc > 1 ? argv[1] : "rxe0";
	long iters = argc > 2 ? atol(argv[2]) : 2000000;
	static const int batches[] = { 1, 16 };
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	struct ibv_wc wc[16];
	struct ibv_cq *cq;
	int n, i, b;

	list = ibv_get_device_list(&n);
	if (!list) {
		perror("ibv_get_device_list");
		return 1;
	}
	for (i = 0; i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!ctx) {
		fprintf(stderr, "cpoll: cannot open %s\n", name);
		return 1;
	}
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	if (!cq) {
		perror("ibv_create_cq");
		return 1;
	}
	for (b = 0; b < 2; b++) {
		long polled = 0, k;
		double start;

		for (k = 0; k < iters / 10; k++) // warm up
			polled += ibv_poll_cq(cq, batches[b], wc);
		start = now_ns();
		for (k = 0; k < iters; k++)
			polled += ibv_poll_cq(cq, batches[b], wc);
		printf("BenchmarkCPollEmptyCQ/batch=%d\t%ld\t%.1f ns/op\n", batches[b], iters,
		       (now_ns() - start) / iters);
		if (polled != 0) {
			fprintf(stderr, "cpoll: the CQ was not empty\n");
			return 1;
		}
	}
	ibv_destroy_cq(cq);
	ibv_close_device(ctx);
	return 0;
}

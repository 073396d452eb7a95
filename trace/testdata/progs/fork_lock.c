/* fork_lock [N]: one thread opens and closes the device in a loop (the
 * shim takes its table's lock at each) while the other forks N times;
 * each child destroys a CQ, which takes that lock too, and exits. A child
 * that inherited the lock held would never exit: each gets 1 s, then is
 * killed, and the program exits 1 (0 when none hung). For the fake
 * provider (a child's destroy on a real one destroys the parent's CQ, and
 * the fake's contexts take no malloc lock, which fork waits for). */
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#include "common.h"

static struct rig r;
static int stop;

static void *churn(void *arg)
{
	struct ibv_device *dev = arg;

	while (!__atomic_load_n(&stop, __ATOMIC_ACQUIRE)) {
		struct ibv_context *ctx = ibv_open_device(dev);

		if (!ctx || ibv_close_device(ctx))
			die("ibv_open_device, ibv_close_device");
	}
	return NULL;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 200, hung = 0;
	pthread_t th;

	struct ibv_device **list = ibv_get_device_list(NULL);

	rig_open(&r);
	if (!list || !list[0] || pthread_create(&th, NULL, churn, list[0]))
		die("pthread_create");
	for (int i = 0; i < n; i++) {
		struct ibv_cq *cq = cq_new(&r, 4);
		pid_t pid = fork();
		int st;
		long end;

		if (pid < 0)
			die("fork");
		if (pid == 0)
			_exit(ibv_destroy_cq(cq) ? 3 : 0);
		for (end = now_ms() + 1000; waitpid(pid, &st, WNOHANG) == 0;) {
			if (now_ms() > end) {
				kill(pid, SIGKILL);
				waitpid(pid, &st, 0);
				hung++;
				break;
			}
			usleep(1000);
		}
		if (ibv_destroy_cq(cq))
			die("ibv_destroy_cq");
		if (hung) {
			n = i + 1;
			break;
		}
	}
	__atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
	pthread_join(th, NULL);
	ibv_free_device_list(list);
	rig_close(&r);
	printf("fork_lock: %d forks, %d child(ren) hung\n", n, hung);
	return hung != 0;
}

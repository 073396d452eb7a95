/* fork_destroy: the child of a fork destroys a QP holding 4 receives (the
 * uverbs file is shared: the parent's QP is gone), then the parent exits
 * with a second QP, 3 receives outstanding, its CQ and PD live (the kernel
 * destroys them at exit). Expected: destroyed-with-outstanding twice, one
 * in each pid. */
#include <sys/wait.h>
#include "common.h"

int main(void)
{
	struct rig r;
	struct ibv_qp *a, *b;
	int st;

	rig_open_pair(&r, &a, &b);
	for (int i = 1; i <= 4; i++)
		post_recv(&r, a, i);
	for (int i = 1; i <= 3; i++)
		post_recv(&r, b, 10 + i);
	fflush(stdout);
	pid_t child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		if (ibv_destroy_qp(a))
			die("ibv_destroy_qp in the child");
		exit(0);
	}
	if (waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st))
		die("the child");
	return 0;
}

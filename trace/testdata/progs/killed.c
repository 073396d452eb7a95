/* killed: a daemon's habits: 2 receives posted, every descriptor it did not
 * open itself closed (closefrom), 3 more receives posted, then SIGKILL.
 * Run by TestHostKilled (not a planted program: it does not exit 0).
 * Expected: its records up to the kill, and destroyed-with-outstanding for
 * the 5 receives of a QP the kernel destroys at the kill. */
#include <signal.h>
#include "common.h"

int main(void)
{
	struct rig r;
	struct ibv_qp *a, *b;

	rig_open_pair(&r, &a, &b);
	post_recv(&r, b, 1);
	post_recv(&r, b, 2);
	for (int fd = 3; fd < 4096; fd++)
		close(fd);
	for (int i = 3; i <= 5; i++)
		post_recv(&r, b, i);
	raise(SIGKILL);
	return 0;
}

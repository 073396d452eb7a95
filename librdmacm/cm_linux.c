//go:build linux && cgo

// dlvsym is a GNU extension.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <arpa/inet.h>
#include "cm_linux.h"

static struct qpd_cm_fn fn;
static char load_err[512];

// qpd_cm_load opens lib and resolves every entry point into a table that
// replaces fn only when all of them were found. On failure *what names
// the library or the missing symbol and *why is the dynamic loader's
// message.
int qpd_cm_load(const char *lib, const char **what, const char **why)
{
	struct qpd_cm_fn t;
	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);

	*what = lib;
	*why = load_err;
	if (!h) {
		snprintf(load_err, sizeof(load_err), "%s", dlerror());
		return -1;
	}
	// Never closed: librdmacm keeps device contexts for the process.
#define QPD_CM_RESOLVE(sym, ver)                                                   \
	t.p_##sym = (__typeof__(sym) *)dlvsym(h, #sym, ver);                       \
	if (!t.p_##sym) {                                                          \
		const char *e = dlerror();                                         \
		snprintf(load_err, sizeof(load_err), "%s", e ? e : "not found");   \
		*what = #sym "@" ver;                                              \
		return -1;                                                         \
	}
	QPD_CM_SYMS(QPD_CM_RESOLVE)
	fn = t;
	return 0;
}

// qpd_create_channel creates an event channel whose fd does not block, so
// that rdma_get_cm_event returns EAGAIN instead of waiting: Go polls the
// fd with a bound.
struct rdma_event_channel *qpd_create_channel(void)
{
	struct rdma_event_channel *ch = fn.p_rdma_create_event_channel();
	int flags;

	if (!ch)
		return NULL;
	flags = fcntl(ch->fd, F_GETFL);
	if (flags < 0 || fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
		int e = errno;
		fn.p_rdma_destroy_event_channel(ch);
		errno = e;
		return NULL;
	}
	return ch;
}

void qpd_rdma_destroy_event_channel(struct rdma_event_channel *ch) { fn.p_rdma_destroy_event_channel(ch); }
int qpd_channel_fd(struct rdma_event_channel *ch) { return ch->fd; }

int qpd_rdma_create_id(struct rdma_event_channel *ch, struct rdma_cm_id **id, int ps)
{
	return fn.p_rdma_create_id(ch, id, NULL, (enum rdma_port_space)ps);
}

int qpd_rdma_destroy_id(struct rdma_cm_id *id) { return fn.p_rdma_destroy_id(id); }

int qpd_rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr_storage *src, struct sockaddr_storage *dst, int timeout_ms)
{
	return fn.p_rdma_resolve_addr(id, (struct sockaddr *)src, (struct sockaddr *)dst, timeout_ms);
}

int qpd_rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms) { return fn.p_rdma_resolve_route(id, timeout_ms); }
int qpd_rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr_storage *a) { return fn.p_rdma_bind_addr(id, (struct sockaddr *)a); }
int qpd_rdma_listen(struct rdma_cm_id *id, int backlog) { return fn.p_rdma_listen(id, backlog); }
int qpd_rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *p) { return fn.p_rdma_accept(id, p); }
int qpd_rdma_reject(struct rdma_cm_id *id, const void *data, uint8_t len) { return fn.p_rdma_reject(id, data, len); }
// qpd_rdma_connect is rdma_connect with the thread's signals blocked. On
// iWARP the kernel's driver may connect its TCP socket inside the call
// (siw_connect, drivers/infiniband/sw/siw/siw_cm.c): a signal then ends
// the wait with -ERESTARTSYS, the driver closes the socket it has just
// connected, and the call is made again. The peer sees a connection
// opened and closed at once, which a siw listener does not survive
// (docs/PROVIDERS.md). Go sends its threads signals of its own (SIGURG, to
// preempt), so a Go program meets this often; a blocked signal waits for
// the call's end, and the process's other threads take the rest. A fault
// in the call still raises its signal: those stay unblocked.
int qpd_rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *p)
{
	static const int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS};
	sigset_t all, old;
	int rc, err;

	sigfillset(&all);
	for (size_t i = 0; i < sizeof(faults) / sizeof(faults[0]); i++)
		sigdelset(&all, faults[i]);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	rc = fn.p_rdma_connect(id, p);
	err = errno;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	errno = err;
	return rc;
}
int qpd_rdma_disconnect(struct rdma_cm_id *id) { return fn.p_rdma_disconnect(id); }

struct ibv_qp *qpd_rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	if (fn.p_rdma_create_qp(id, pd, attr))
		return NULL;
	return id->qp;
}

void qpd_rdma_destroy_qp(struct rdma_cm_id *id) { fn.p_rdma_destroy_qp(id); }
int qpd_rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *ch) { return fn.p_rdma_migrate_id(id, ch); }

// qpd_get_cm_event reads the channel's next event, copies it into out and
// acknowledges it. It returns 0, or the errno (EAGAIN: no event).
int qpd_get_cm_event(struct rdma_event_channel *ch, struct qpd_cm_event *out)
{
	struct rdma_cm_event *e;

	if (fn.p_rdma_get_cm_event(ch, &e))
		return errno ? errno : EIO;
	out->type = e->event;
	out->status = e->status;
	out->id = e->id;
	out->private_data_len = 0;
	if (e->param.conn.private_data && e->param.conn.private_data_len) {
		out->private_data_len = e->param.conn.private_data_len;
		memcpy(out->private_data, e->param.conn.private_data, out->private_data_len);
	}
	fn.p_rdma_ack_cm_event(e);
	return 0;
}

// qpd_sockaddr writes an IPv4 (family AF_INET, addr 4 bytes) or IPv6
// address and a port into ss.
void qpd_sockaddr(struct sockaddr_storage *ss, int family, const uint8_t *addr, uint16_t port)
{
	memset(ss, 0, sizeof(*ss));
	if (family == AF_INET) {
		struct sockaddr_in *in = (struct sockaddr_in *)ss;
		in->sin_family = AF_INET;
		in->sin_port = htons(port);
		memcpy(&in->sin_addr, addr, 4);
	} else {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons(port);
		memcpy(&in6->sin6_addr, addr, 16);
	}
}

// qpd_id_addr copies the ID's source (peer 0) or destination address into
// addr (16 bytes) and its port, and returns its family (0: none).
int qpd_id_addr(struct rdma_cm_id *id, int peer, uint8_t *addr, uint16_t *port)
{
	struct sockaddr *sa = peer ? &id->route.addr.dst_addr : &id->route.addr.src_addr;

	if (sa->sa_family == AF_INET) {
		struct sockaddr_in *in = (struct sockaddr_in *)sa;
		memcpy(addr, &in->sin_addr, 4);
		*port = ntohs(in->sin_port);
	} else if (sa->sa_family == AF_INET6) {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)sa;
		memcpy(addr, &in6->sin6_addr, 16);
		*port = ntohs(in6->sin6_port);
	}
	return sa->sa_family;
}

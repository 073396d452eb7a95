//go:build linux && cgo

// libibverbs, opened at run time. The binary links only libc (and libdl),
// so it starts on a machine without rdma-core; qpd_load opens
// libibverbs.so.1 and resolves every entry point the binding calls, and the
// qpd_ibv_* functions below (and the helpers in verbs_linux.c) call through
// the table it fills. The fast paths
// (ibv_post_send, ibv_post_recv, ibv_post_srq_recv, ibv_poll_cq,
// ibv_req_notify_cq) are static inline in <infiniband/verbs.h> and call the
// provider through the context's ops: they need no symbol and no table.
// dlvsym is a GNU extension.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include "verbs_linux.h"

struct qpd_fn qpd_fn;

static char load_err[512];

// qpd_load opens lib and resolves every entry point into a table that
// replaces qpd_fn only when all of them were found, so a failed load leaves
// a loaded library usable. On failure *what names the library or the
// missing symbol and *why is the dynamic loader's message.
int qpd_load(const char *lib, const char **what, const char **why)
{
	struct qpd_fn t;
	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);

	*what = lib;
	*why = load_err;
	if (!h) {
		snprintf(load_err, sizeof(load_err), "%s", dlerror());
		return -1;
	}
	// The handle is never closed: providers and their objects live as
	// long as the process (and dlopen of a loaded library only counts).
#define QPD_RESOLVE(sym, ver)                                                      \
	t.p_##sym = (__typeof__(sym) *)dlvsym(h, #sym, ver);                       \
	if (!t.p_##sym) {                                                          \
		const char *e = dlerror();                                         \
		snprintf(load_err, sizeof(load_err), "%s", e ? e : "not found");   \
		*what = #sym "@" ver;                                              \
		return -1;                                                         \
	}
	QPD_SYMS(QPD_RESOLVE)
	qpd_fn = t;
	return 0;
}

struct ibv_device **qpd_ibv_get_device_list(int *n) { return qpd_fn.p_ibv_get_device_list(n); }
void qpd_ibv_free_device_list(struct ibv_device **l) { qpd_fn.p_ibv_free_device_list(l); }
const char *qpd_ibv_get_device_name(struct ibv_device *d) { return qpd_fn.p_ibv_get_device_name(d); }
struct ibv_context *qpd_ibv_open_device(struct ibv_device *d) { return qpd_fn.p_ibv_open_device(d); }
int qpd_ibv_close_device(struct ibv_context *c) { return qpd_fn.p_ibv_close_device(c); }
int qpd_ibv_query_device(struct ibv_context *c, struct ibv_device_attr *a) { return qpd_fn.p_ibv_query_device(c, a); }

int qpd_ibv_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid)
{
	return qpd_fn.p_ibv_query_gid(c, port, index, gid);
}

struct ibv_pd *qpd_ibv_alloc_pd(struct ibv_context *c) { return qpd_fn.p_ibv_alloc_pd(c); }
int qpd_ibv_dealloc_pd(struct ibv_pd *pd) { return qpd_fn.p_ibv_dealloc_pd(pd); }

int qpd_ibv_dereg_mr(struct ibv_mr *mr) { return qpd_fn.p_ibv_dereg_mr(mr); }
struct ibv_comp_channel *qpd_ibv_create_comp_channel(struct ibv_context *c) { return qpd_fn.p_ibv_create_comp_channel(c); }
int qpd_ibv_destroy_comp_channel(struct ibv_comp_channel *ch) { return qpd_fn.p_ibv_destroy_comp_channel(ch); }

int qpd_ibv_destroy_cq(struct ibv_cq *cq) { return qpd_fn.p_ibv_destroy_cq(cq); }

int qpd_ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask) { return qpd_fn.p_ibv_modify_qp(qp, a, mask); }

int qpd_ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, struct ibv_qp_init_attr *init)
{
	return qpd_fn.p_ibv_query_qp(qp, a, mask, init);
}

int qpd_ibv_destroy_qp(struct ibv_qp *qp) { return qpd_fn.p_ibv_destroy_qp(qp); }

int qpd_ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *a) { return qpd_fn.p_ibv_query_srq(srq, a); }
int qpd_ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *a, int mask) { return qpd_fn.p_ibv_modify_srq(srq, a, mask); }
int qpd_ibv_destroy_srq(struct ibv_srq *srq) { return qpd_fn.p_ibv_destroy_srq(srq); }


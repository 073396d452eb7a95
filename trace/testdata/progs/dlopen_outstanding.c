/* dlopen_outstanding: outstanding.c with libibverbs opened by dlopen() and
 * every verb taken from its handle with dlvsym (ibv_destroy_qp with dlsym),
 * as NCCL, Python's ctypes and qpdrain's own libibverbs package do; not
 * linked with libibverbs. Expected: destroyed-with-outstanding (4 on the
 * receive queue of the second QP). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#undef ibv_reg_mr
#define VERBS(X)                                                                                               \
	X(ibv_get_device_list) X(ibv_free_device_list) X(ibv_get_device_name) X(ibv_open_device)              \
	X(ibv_close_device) X(ibv_query_gid) X(ibv_alloc_pd) X(ibv_dealloc_pd) X(ibv_reg_mr) X(ibv_dereg_mr) \
	X(ibv_create_cq) X(ibv_destroy_cq) X(ibv_create_qp) X(ibv_modify_qp) X(ibv_destroy_qp)
#define DECL(f) static __typeof__(f) *p_##f;
VERBS(DECL)

__attribute__((constructor)) static void load(void)
{
	void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);

	if (!h) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		exit(2);
	}
#define LOAD(f)                                                                     \
	p_##f = strcmp(#f, "ibv_destroy_qp") ? dlvsym(h, #f, "IBVERBS_1.1") : dlsym(h, #f); \
	if (!p_##f) {                                                               \
		fprintf(stderr, "%s: %s\n", #f, dlerror());                         \
		exit(2);                                                            \
	}
	VERBS(LOAD)
}

#define ibv_get_device_list p_ibv_get_device_list
#define ibv_free_device_list p_ibv_free_device_list
#define ibv_get_device_name p_ibv_get_device_name
#define ibv_open_device p_ibv_open_device
#define ibv_close_device p_ibv_close_device
#define ibv_query_gid p_ibv_query_gid
#define ibv_alloc_pd p_ibv_alloc_pd
#define ibv_dealloc_pd p_ibv_dealloc_pd
#define ibv_reg_mr p_ibv_reg_mr
#define ibv_dereg_mr p_ibv_dereg_mr
#define ibv_create_cq p_ibv_create_cq
#define ibv_destroy_cq p_ibv_destroy_cq
#define ibv_create_qp p_ibv_create_qp
#define ibv_modify_qp p_ibv_modify_qp
#define ibv_destroy_qp p_ibv_destroy_qp
#include "common.h"

int main(void)
{
	struct rig r;
	struct ibv_qp *a, *b;

	struct ibv_cq *cq = rig_open_pair(&r, &a, &b);
	for (int i = 1; i <= 4; i++)
		post_recv(&r, b, i);
	to_error(a);
	to_error(b);
	if (ibv_destroy_qp(b) || ibv_destroy_qp(a) || ibv_destroy_cq(cq))
		die("destroy");
	rig_close(&r);
	return 0;
}

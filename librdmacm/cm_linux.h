//go:build linux && cgo

// librdmacm, opened at run time as libibverbs is (package libibverbs): the
// binary links only libc, qpd_cm_load opens librdmacm.so.1 and resolves
// the entry points below, and the qpd_rdma_* wrappers call through the
// table it fills.
#ifndef QPDRAIN_CM_LINUX_H
#define QPDRAIN_CM_LINUX_H

#include <stdint.h>
#include <rdma/rdma_cma.h>

// QPD_CM_SYMS lists each entry point with the symbol version a program
// linked against librdmacm.so.1 binds to (objdump -T librdmacm.so.1).
#define QPD_CM_SYMS(X)                                  \
	X(rdma_create_event_channel, "RDMACM_1.0")      \
	X(rdma_destroy_event_channel, "RDMACM_1.0")     \
	X(rdma_create_id, "RDMACM_1.0")                 \
	X(rdma_destroy_id, "RDMACM_1.0")                \
	X(rdma_resolve_addr, "RDMACM_1.0")              \
	X(rdma_resolve_route, "RDMACM_1.0")             \
	X(rdma_bind_addr, "RDMACM_1.0")                 \
	X(rdma_listen, "RDMACM_1.0")                    \
	X(rdma_get_cm_event, "RDMACM_1.0")              \
	X(rdma_ack_cm_event, "RDMACM_1.0")              \
	X(rdma_accept, "RDMACM_1.0")                    \
	X(rdma_reject, "RDMACM_1.0")                    \
	X(rdma_connect, "RDMACM_1.0")                   \
	X(rdma_disconnect, "RDMACM_1.0")                \
	X(rdma_create_qp, "RDMACM_1.0")                 \
	X(rdma_destroy_qp, "RDMACM_1.0")                \
	X(rdma_migrate_id, "RDMACM_1.0")

#define QPD_CM_SLOT(sym, ver) __typeof__(sym) *p_##sym;
struct qpd_cm_fn {
	QPD_CM_SYMS(QPD_CM_SLOT)
};

int qpd_cm_load(const char *lib, const char **what, const char **why);

// qpd_cm_event is a copied CM event.
struct qpd_cm_event {
	uint32_t type;
	int32_t status;
	struct rdma_cm_id *id;
	uint8_t private_data_len;
	uint8_t private_data[256];
};

struct rdma_event_channel *qpd_create_channel(void);
void qpd_rdma_destroy_event_channel(struct rdma_event_channel *ch);
int qpd_channel_fd(struct rdma_event_channel *ch);
int qpd_rdma_create_id(struct rdma_event_channel *ch, struct rdma_cm_id **id, int ps);
int qpd_rdma_destroy_id(struct rdma_cm_id *id);
int qpd_rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr_storage *src, struct sockaddr_storage *dst, int timeout_ms);
int qpd_rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms);
int qpd_rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr_storage *addr);
int qpd_rdma_listen(struct rdma_cm_id *id, int backlog);
int qpd_rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *p);
int qpd_rdma_reject(struct rdma_cm_id *id, const void *data, uint8_t len);
int qpd_rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *p);
int qpd_rdma_disconnect(struct rdma_cm_id *id);
struct ibv_qp *qpd_rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
void qpd_rdma_destroy_qp(struct rdma_cm_id *id);
int qpd_rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *ch);
int qpd_get_cm_event(struct rdma_event_channel *ch, struct qpd_cm_event *out);
void qpd_sockaddr(struct sockaddr_storage *ss, int family, const uint8_t *addr, uint16_t port);
int qpd_id_addr(struct rdma_cm_id *id, int peer, uint8_t *addr, uint16_t *port);

#endif

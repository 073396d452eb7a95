//go:build linux && cgo

// Package cverbs is the C side of package ibv's tests, which cannot use cgo
// themselves: libibverbs's enum constants, to prove that every ibv enum has
// libibverbs's value, and a fake provider's CQ and QP, to measure the
// binding's own cost of a poll and a post without a device. Only tests import it.
package cverbs

/*
#include <time.h>
#include <infiniband/verbs.h>

// An empty CQ and a QP of a fake provider: ibv_poll_cq and ibv_post_send
// call context->ops, which here return at once (nothing polled, every WR
// accepted), so a loop over them measures the caller's own cost.
static int fake_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) { return 0; }
static long fake_sent;
static int fake_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	for (; wr; wr = wr->next)
		fake_sent++;
	return 0;
}
static long fake_sent_count(void) { return fake_sent; }
static int fake_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) { return 0; }
static struct ibv_context fake_ctx = { .ops = {
	.poll_cq = fake_poll_cq,
	.post_send = fake_post_send,
	.post_recv = fake_post_recv,
} };
static struct ibv_cq fake_cq = { .context = &fake_ctx };
static struct ibv_qp fake_qp = { .context = &fake_ctx };

static struct ibv_cq *fake_cq_ptr(void) { return &fake_cq; }
static struct ibv_qp *fake_qp_ptr(void) { return &fake_qp; }

// c_poll_loop polls the fake CQ iters times in C and returns ns per poll.
static double c_poll_loop(long iters, int batch)
{
	struct ibv_wc wc[16];
	struct timespec a, b;
	long i, got = 0;

	clock_gettime(CLOCK_MONOTONIC, &a);
	for (i = 0; i < iters; i++)
		got += ibv_poll_cq(&fake_cq, batch, wc);
	clock_gettime(CLOCK_MONOTONIC, &b);
	return got ? -1 : ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / iters;
}
*/
import "C"

import "unsafe"

// FakeCQ is a struct ibv_cq of a fake provider that is always empty.
func FakeCQ() unsafe.Pointer { return unsafe.Pointer(C.fake_cq_ptr()) }

// FakeQP is a struct ibv_qp of a fake provider that accepts every send and
// receive WR and does nothing with it.
func FakeQP() unsafe.Pointer { return unsafe.Pointer(C.fake_qp_ptr()) }

// FakeSent is the number of send WRs FakeQP has been given so far.
func FakeSent() int { return int(C.fake_sent_count()) }

// CPollLoop polls FakeCQ iters times with batch (at most 16) in one C loop
// and returns the nanoseconds per poll.
func CPollLoop(iters int, batch int) float64 {
	return float64(C.c_poll_loop(C.long(iters), C.int(batch)))
}

// Constants maps each libibverbs enum constant name to its value.
var Constants = map[string]int64{
	"IBV_QPS_RESET":                 int64(C.IBV_QPS_RESET),
	"IBV_QPS_INIT":                  int64(C.IBV_QPS_INIT),
	"IBV_QPS_RTR":                   int64(C.IBV_QPS_RTR),
	"IBV_QPS_RTS":                   int64(C.IBV_QPS_RTS),
	"IBV_QPS_SQD":                   int64(C.IBV_QPS_SQD),
	"IBV_QPS_SQE":                   int64(C.IBV_QPS_SQE),
	"IBV_QPS_ERR":                   int64(C.IBV_QPS_ERR),
	"IBV_QPS_UNKNOWN":               int64(C.IBV_QPS_UNKNOWN),
	"IBV_QPT_RC":                    int64(C.IBV_QPT_RC),
	"IBV_QPT_UC":                    int64(C.IBV_QPT_UC),
	"IBV_QPT_UD":                    int64(C.IBV_QPT_UD),
	"IBV_QPT_RAW_PACKET":            int64(C.IBV_QPT_RAW_PACKET),
	"IBV_QPT_XRC_SEND":              int64(C.IBV_QPT_XRC_SEND),
	"IBV_QPT_XRC_RECV":              int64(C.IBV_QPT_XRC_RECV),
	"IBV_QPT_DRIVER":                int64(C.IBV_QPT_DRIVER),
	"IBV_WC_SUCCESS":                int64(C.IBV_WC_SUCCESS),
	"IBV_WC_LOC_LEN_ERR":            int64(C.IBV_WC_LOC_LEN_ERR),
	"IBV_WC_LOC_QP_OP_ERR":          int64(C.IBV_WC_LOC_QP_OP_ERR),
	"IBV_WC_LOC_EEC_OP_ERR":         int64(C.IBV_WC_LOC_EEC_OP_ERR),
	"IBV_WC_LOC_PROT_ERR":           int64(C.IBV_WC_LOC_PROT_ERR),
	"IBV_WC_WR_FLUSH_ERR":           int64(C.IBV_WC_WR_FLUSH_ERR),
	"IBV_WC_MW_BIND_ERR":            int64(C.IBV_WC_MW_BIND_ERR),
	"IBV_WC_BAD_RESP_ERR":           int64(C.IBV_WC_BAD_RESP_ERR),
	"IBV_WC_LOC_ACCESS_ERR":         int64(C.IBV_WC_LOC_ACCESS_ERR),
	"IBV_WC_REM_INV_REQ_ERR":        int64(C.IBV_WC_REM_INV_REQ_ERR),
	"IBV_WC_REM_ACCESS_ERR":         int64(C.IBV_WC_REM_ACCESS_ERR),
	"IBV_WC_REM_OP_ERR":             int64(C.IBV_WC_REM_OP_ERR),
	"IBV_WC_RETRY_EXC_ERR":          int64(C.IBV_WC_RETRY_EXC_ERR),
	"IBV_WC_RNR_RETRY_EXC_ERR":      int64(C.IBV_WC_RNR_RETRY_EXC_ERR),
	"IBV_WC_LOC_RDD_VIOL_ERR":       int64(C.IBV_WC_LOC_RDD_VIOL_ERR),
	"IBV_WC_REM_INV_RD_REQ_ERR":     int64(C.IBV_WC_REM_INV_RD_REQ_ERR),
	"IBV_WC_REM_ABORT_ERR":          int64(C.IBV_WC_REM_ABORT_ERR),
	"IBV_WC_INV_EECN_ERR":           int64(C.IBV_WC_INV_EECN_ERR),
	"IBV_WC_INV_EEC_STATE_ERR":      int64(C.IBV_WC_INV_EEC_STATE_ERR),
	"IBV_WC_FATAL_ERR":              int64(C.IBV_WC_FATAL_ERR),
	"IBV_WC_RESP_TIMEOUT_ERR":       int64(C.IBV_WC_RESP_TIMEOUT_ERR),
	"IBV_WC_GENERAL_ERR":            int64(C.IBV_WC_GENERAL_ERR),
	"IBV_WC_TM_ERR":                 int64(C.IBV_WC_TM_ERR),
	"IBV_WC_TM_RNDV_INCOMPLETE":     int64(C.IBV_WC_TM_RNDV_INCOMPLETE),
	"IBV_WC_SEND":                   int64(C.IBV_WC_SEND),
	"IBV_WC_RDMA_WRITE":             int64(C.IBV_WC_RDMA_WRITE),
	"IBV_WC_RDMA_READ":              int64(C.IBV_WC_RDMA_READ),
	"IBV_WC_COMP_SWAP":              int64(C.IBV_WC_COMP_SWAP),
	"IBV_WC_FETCH_ADD":              int64(C.IBV_WC_FETCH_ADD),
	"IBV_WC_BIND_MW":                int64(C.IBV_WC_BIND_MW),
	"IBV_WC_LOCAL_INV":              int64(C.IBV_WC_LOCAL_INV),
	"IBV_WC_TSO":                    int64(C.IBV_WC_TSO),
	"IBV_WC_RECV":                   int64(C.IBV_WC_RECV),
	"IBV_WC_RECV_RDMA_WITH_IMM":     int64(C.IBV_WC_RECV_RDMA_WITH_IMM),
	"IBV_WC_GRH":                    int64(C.IBV_WC_GRH),
	"IBV_WC_WITH_IMM":               int64(C.IBV_WC_WITH_IMM),
	"IBV_WC_IP_CSUM_OK":             int64(C.IBV_WC_IP_CSUM_OK),
	"IBV_WC_WITH_INV":               int64(C.IBV_WC_WITH_INV),
	"IBV_WR_RDMA_WRITE":             int64(C.IBV_WR_RDMA_WRITE),
	"IBV_WR_RDMA_WRITE_WITH_IMM":    int64(C.IBV_WR_RDMA_WRITE_WITH_IMM),
	"IBV_WR_SEND":                   int64(C.IBV_WR_SEND),
	"IBV_WR_SEND_WITH_IMM":          int64(C.IBV_WR_SEND_WITH_IMM),
	"IBV_WR_RDMA_READ":              int64(C.IBV_WR_RDMA_READ),
	"IBV_WR_ATOMIC_CMP_AND_SWP":     int64(C.IBV_WR_ATOMIC_CMP_AND_SWP),
	"IBV_WR_ATOMIC_FETCH_AND_ADD":   int64(C.IBV_WR_ATOMIC_FETCH_AND_ADD),
	"IBV_WR_LOCAL_INV":              int64(C.IBV_WR_LOCAL_INV),
	"IBV_WR_BIND_MW":                int64(C.IBV_WR_BIND_MW),
	"IBV_WR_SEND_WITH_INV":          int64(C.IBV_WR_SEND_WITH_INV),
	"IBV_WR_TSO":                    int64(C.IBV_WR_TSO),
	"IBV_SEND_FENCE":                int64(C.IBV_SEND_FENCE),
	"IBV_SEND_SIGNALED":             int64(C.IBV_SEND_SIGNALED),
	"IBV_SEND_SOLICITED":            int64(C.IBV_SEND_SOLICITED),
	"IBV_SEND_INLINE":               int64(C.IBV_SEND_INLINE),
	"IBV_SEND_IP_CSUM":              int64(C.IBV_SEND_IP_CSUM),
	"IBV_ACCESS_LOCAL_WRITE":        int64(C.IBV_ACCESS_LOCAL_WRITE),
	"IBV_ACCESS_REMOTE_WRITE":       int64(C.IBV_ACCESS_REMOTE_WRITE),
	"IBV_ACCESS_REMOTE_READ":        int64(C.IBV_ACCESS_REMOTE_READ),
	"IBV_ACCESS_REMOTE_ATOMIC":      int64(C.IBV_ACCESS_REMOTE_ATOMIC),
	"IBV_ACCESS_MW_BIND":            int64(C.IBV_ACCESS_MW_BIND),
	"IBV_ACCESS_ZERO_BASED":         int64(C.IBV_ACCESS_ZERO_BASED),
	"IBV_ACCESS_ON_DEMAND":          int64(C.IBV_ACCESS_ON_DEMAND),
	"IBV_ACCESS_HUGETLB":            int64(C.IBV_ACCESS_HUGETLB),
	"IBV_EVENT_CQ_ERR":              int64(C.IBV_EVENT_CQ_ERR),
	"IBV_EVENT_QP_FATAL":            int64(C.IBV_EVENT_QP_FATAL),
	"IBV_EVENT_QP_REQ_ERR":          int64(C.IBV_EVENT_QP_REQ_ERR),
	"IBV_EVENT_QP_ACCESS_ERR":       int64(C.IBV_EVENT_QP_ACCESS_ERR),
	"IBV_EVENT_COMM_EST":            int64(C.IBV_EVENT_COMM_EST),
	"IBV_EVENT_SQ_DRAINED":          int64(C.IBV_EVENT_SQ_DRAINED),
	"IBV_EVENT_PATH_MIG":            int64(C.IBV_EVENT_PATH_MIG),
	"IBV_EVENT_PATH_MIG_ERR":        int64(C.IBV_EVENT_PATH_MIG_ERR),
	"IBV_EVENT_DEVICE_FATAL":        int64(C.IBV_EVENT_DEVICE_FATAL),
	"IBV_EVENT_PORT_ACTIVE":         int64(C.IBV_EVENT_PORT_ACTIVE),
	"IBV_EVENT_PORT_ERR":            int64(C.IBV_EVENT_PORT_ERR),
	"IBV_EVENT_LID_CHANGE":          int64(C.IBV_EVENT_LID_CHANGE),
	"IBV_EVENT_PKEY_CHANGE":         int64(C.IBV_EVENT_PKEY_CHANGE),
	"IBV_EVENT_SM_CHANGE":           int64(C.IBV_EVENT_SM_CHANGE),
	"IBV_EVENT_SRQ_ERR":             int64(C.IBV_EVENT_SRQ_ERR),
	"IBV_EVENT_SRQ_LIMIT_REACHED":   int64(C.IBV_EVENT_SRQ_LIMIT_REACHED),
	"IBV_EVENT_QP_LAST_WQE_REACHED": int64(C.IBV_EVENT_QP_LAST_WQE_REACHED),
	"IBV_EVENT_CLIENT_REREGISTER":   int64(C.IBV_EVENT_CLIENT_REREGISTER),
	"IBV_EVENT_GID_CHANGE":          int64(C.IBV_EVENT_GID_CHANGE),
	"IBV_EVENT_WQ_FATAL":            int64(C.IBV_EVENT_WQ_FATAL),
	"IBV_QP_STATE":                  int64(C.IBV_QP_STATE),
	"IBV_QP_CUR_STATE":              int64(C.IBV_QP_CUR_STATE),
	"IBV_QP_EN_SQD_ASYNC_NOTIFY":    int64(C.IBV_QP_EN_SQD_ASYNC_NOTIFY),
	"IBV_QP_ACCESS_FLAGS":           int64(C.IBV_QP_ACCESS_FLAGS),
	"IBV_QP_PKEY_INDEX":             int64(C.IBV_QP_PKEY_INDEX),
	"IBV_QP_PORT":                   int64(C.IBV_QP_PORT),
	"IBV_QP_QKEY":                   int64(C.IBV_QP_QKEY),
	"IBV_QP_AV":                     int64(C.IBV_QP_AV),
	"IBV_QP_PATH_MTU":               int64(C.IBV_QP_PATH_MTU),
	"IBV_QP_TIMEOUT":                int64(C.IBV_QP_TIMEOUT),
	"IBV_QP_RETRY_CNT":              int64(C.IBV_QP_RETRY_CNT),
	"IBV_QP_RNR_RETRY":              int64(C.IBV_QP_RNR_RETRY),
	"IBV_QP_RQ_PSN":                 int64(C.IBV_QP_RQ_PSN),
	"IBV_QP_MAX_QP_RD_ATOMIC":       int64(C.IBV_QP_MAX_QP_RD_ATOMIC),
	"IBV_QP_ALT_PATH":               int64(C.IBV_QP_ALT_PATH),
	"IBV_QP_MIN_RNR_TIMER":          int64(C.IBV_QP_MIN_RNR_TIMER),
	"IBV_QP_SQ_PSN":                 int64(C.IBV_QP_SQ_PSN),
	"IBV_QP_MAX_DEST_RD_ATOMIC":     int64(C.IBV_QP_MAX_DEST_RD_ATOMIC),
	"IBV_QP_PATH_MIG_STATE":         int64(C.IBV_QP_PATH_MIG_STATE),
	"IBV_QP_CAP":                    int64(C.IBV_QP_CAP),
	"IBV_QP_DEST_QPN":               int64(C.IBV_QP_DEST_QPN),
	"IBV_SRQ_MAX_WR":                int64(C.IBV_SRQ_MAX_WR),
	"IBV_SRQ_LIMIT":                 int64(C.IBV_SRQ_LIMIT),
	"IBV_MTU_256":                   int64(C.IBV_MTU_256),
	"IBV_MTU_512":                   int64(C.IBV_MTU_512),
	"IBV_MTU_1024":                  int64(C.IBV_MTU_1024),
	"IBV_MTU_2048":                  int64(C.IBV_MTU_2048),
	"IBV_MTU_4096":                  int64(C.IBV_MTU_4096),
	"IBV_PORT_NOP":                  int64(C.IBV_PORT_NOP),
	"IBV_PORT_DOWN":                 int64(C.IBV_PORT_DOWN),
	"IBV_PORT_INIT":                 int64(C.IBV_PORT_INIT),
	"IBV_PORT_ARMED":                int64(C.IBV_PORT_ARMED),
	"IBV_PORT_ACTIVE":               int64(C.IBV_PORT_ACTIVE),
	"IBV_PORT_ACTIVE_DEFER":         int64(C.IBV_PORT_ACTIVE_DEFER),
	"IBV_LINK_LAYER_UNSPECIFIED":    int64(C.IBV_LINK_LAYER_UNSPECIFIED),
	"IBV_LINK_LAYER_INFINIBAND":     int64(C.IBV_LINK_LAYER_INFINIBAND),
	"IBV_LINK_LAYER_ETHERNET":       int64(C.IBV_LINK_LAYER_ETHERNET),
	"IBV_NODE_UNKNOWN":              int64(C.IBV_NODE_UNKNOWN),
	"IBV_NODE_CA":                   int64(C.IBV_NODE_CA),
	"IBV_NODE_SWITCH":               int64(C.IBV_NODE_SWITCH),
	"IBV_NODE_ROUTER":               int64(C.IBV_NODE_ROUTER),
	"IBV_NODE_RNIC":                 int64(C.IBV_NODE_RNIC),
	"IBV_NODE_USNIC":                int64(C.IBV_NODE_USNIC),
	"IBV_NODE_USNIC_UDP":            int64(C.IBV_NODE_USNIC_UDP),
	"IBV_NODE_UNSPECIFIED":          int64(C.IBV_NODE_UNSPECIFIED),
	"IBV_TRANSPORT_UNKNOWN":         int64(C.IBV_TRANSPORT_UNKNOWN),
	"IBV_TRANSPORT_IB":              int64(C.IBV_TRANSPORT_IB),
	"IBV_TRANSPORT_IWARP":           int64(C.IBV_TRANSPORT_IWARP),
	"IBV_TRANSPORT_USNIC":           int64(C.IBV_TRANSPORT_USNIC),
	"IBV_TRANSPORT_USNIC_UDP":       int64(C.IBV_TRANSPORT_USNIC_UDP),
	"IBV_TRANSPORT_UNSPECIFIED":     int64(C.IBV_TRANSPORT_UNSPECIFIED),
	"IBV_GID_TYPE_IB":               int64(C.IBV_GID_TYPE_IB),
	"IBV_GID_TYPE_ROCE_V1":          int64(C.IBV_GID_TYPE_ROCE_V1),
	"IBV_GID_TYPE_ROCE_V2":          int64(C.IBV_GID_TYPE_ROCE_V2),
	"IBV_ATOMIC_NONE":               int64(C.IBV_ATOMIC_NONE),
	"IBV_ATOMIC_HCA":                int64(C.IBV_ATOMIC_HCA),
	"IBV_ATOMIC_GLOB":               int64(C.IBV_ATOMIC_GLOB),
}

//go:build linux && cgo

package ibv

import (
	_ "embed"
	"go/ast"
	"go/parser"
	"go/token"
	"testing"

	"github.com/qpdrain/qpdrain/internal/testing/cverbs"
)

// enumsSource is enums.go, embedded so the test needs no source tree (it
// also runs as a test binary inside the rxe VM).
//
//go:embed enums.go
var enumsSource string

// libibverbsNames pairs every exported enum constant of this package with
// its libibverbs name and value.
var libibverbsNames = map[string]struct {
	c     string
	value int64
}{
	"QPSReset":               {"IBV_QPS_RESET", int64(QPSReset)},
	"QPSInit":                {"IBV_QPS_INIT", int64(QPSInit)},
	"QPSRTR":                 {"IBV_QPS_RTR", int64(QPSRTR)},
	"QPSRTS":                 {"IBV_QPS_RTS", int64(QPSRTS)},
	"QPSSQD":                 {"IBV_QPS_SQD", int64(QPSSQD)},
	"QPSSQE":                 {"IBV_QPS_SQE", int64(QPSSQE)},
	"QPSErr":                 {"IBV_QPS_ERR", int64(QPSErr)},
	"QPSUnknown":             {"IBV_QPS_UNKNOWN", int64(QPSUnknown)},
	"QPTRC":                  {"IBV_QPT_RC", int64(QPTRC)},
	"QPTUC":                  {"IBV_QPT_UC", int64(QPTUC)},
	"QPTUD":                  {"IBV_QPT_UD", int64(QPTUD)},
	"QPTRawPacket":           {"IBV_QPT_RAW_PACKET", int64(QPTRawPacket)},
	"QPTXRCSend":             {"IBV_QPT_XRC_SEND", int64(QPTXRCSend)},
	"QPTXRCRecv":             {"IBV_QPT_XRC_RECV", int64(QPTXRCRecv)},
	"QPTDriver":              {"IBV_QPT_DRIVER", int64(QPTDriver)},
	"WCSuccess":              {"IBV_WC_SUCCESS", int64(WCSuccess)},
	"WCLocLenErr":            {"IBV_WC_LOC_LEN_ERR", int64(WCLocLenErr)},
	"WCLocQPOpErr":           {"IBV_WC_LOC_QP_OP_ERR", int64(WCLocQPOpErr)},
	"WCLocEECOpErr":          {"IBV_WC_LOC_EEC_OP_ERR", int64(WCLocEECOpErr)},
	"WCLocProtErr":           {"IBV_WC_LOC_PROT_ERR", int64(WCLocProtErr)},
	"WCWRFlushErr":           {"IBV_WC_WR_FLUSH_ERR", int64(WCWRFlushErr)},
	"WCMWBindErr":            {"IBV_WC_MW_BIND_ERR", int64(WCMWBindErr)},
	"WCBadRespErr":           {"IBV_WC_BAD_RESP_ERR", int64(WCBadRespErr)},
	"WCLocAccessErr":         {"IBV_WC_LOC_ACCESS_ERR", int64(WCLocAccessErr)},
	"WCRemInvReqErr":         {"IBV_WC_REM_INV_REQ_ERR", int64(WCRemInvReqErr)},
	"WCRemAccessErr":         {"IBV_WC_REM_ACCESS_ERR", int64(WCRemAccessErr)},
	"WCRemOpErr":             {"IBV_WC_REM_OP_ERR", int64(WCRemOpErr)},
	"WCRetryExcErr":          {"IBV_WC_RETRY_EXC_ERR", int64(WCRetryExcErr)},
	"WCRNRRetryExcErr":       {"IBV_WC_RNR_RETRY_EXC_ERR", int64(WCRNRRetryExcErr)},
	"WCLocRDDViolErr":        {"IBV_WC_LOC_RDD_VIOL_ERR", int64(WCLocRDDViolErr)},
	"WCRemInvRdReqErr":       {"IBV_WC_REM_INV_RD_REQ_ERR", int64(WCRemInvRdReqErr)},
	"WCRemAbortErr":          {"IBV_WC_REM_ABORT_ERR", int64(WCRemAbortErr)},
	"WCInvEECNErr":           {"IBV_WC_INV_EECN_ERR", int64(WCInvEECNErr)},
	"WCInvEECStateErr":       {"IBV_WC_INV_EEC_STATE_ERR", int64(WCInvEECStateErr)},
	"WCFatalErr":             {"IBV_WC_FATAL_ERR", int64(WCFatalErr)},
	"WCRespTimeoutErr":       {"IBV_WC_RESP_TIMEOUT_ERR", int64(WCRespTimeoutErr)},
	"WCGeneralErr":           {"IBV_WC_GENERAL_ERR", int64(WCGeneralErr)},
	"WCTMErr":                {"IBV_WC_TM_ERR", int64(WCTMErr)},
	"WCTMRndvIncomplete":     {"IBV_WC_TM_RNDV_INCOMPLETE", int64(WCTMRndvIncomplete)},
	"WCSend":                 {"IBV_WC_SEND", int64(WCSend)},
	"WCRDMAWrite":            {"IBV_WC_RDMA_WRITE", int64(WCRDMAWrite)},
	"WCRDMARead":             {"IBV_WC_RDMA_READ", int64(WCRDMARead)},
	"WCCompSwap":             {"IBV_WC_COMP_SWAP", int64(WCCompSwap)},
	"WCFetchAdd":             {"IBV_WC_FETCH_ADD", int64(WCFetchAdd)},
	"WCBindMW":               {"IBV_WC_BIND_MW", int64(WCBindMW)},
	"WCLocalInv":             {"IBV_WC_LOCAL_INV", int64(WCLocalInv)},
	"WCTSO":                  {"IBV_WC_TSO", int64(WCTSO)},
	"WCRecv":                 {"IBV_WC_RECV", int64(WCRecv)},
	"WCRecvRDMAWithImm":      {"IBV_WC_RECV_RDMA_WITH_IMM", int64(WCRecvRDMAWithImm)},
	"WCFlagGRH":              {"IBV_WC_GRH", int64(WCFlagGRH)},
	"WCFlagWithImm":          {"IBV_WC_WITH_IMM", int64(WCFlagWithImm)},
	"WCFlagIPCsumOK":         {"IBV_WC_IP_CSUM_OK", int64(WCFlagIPCsumOK)},
	"WCFlagWithInv":          {"IBV_WC_WITH_INV", int64(WCFlagWithInv)},
	"WRRDMAWrite":            {"IBV_WR_RDMA_WRITE", int64(WRRDMAWrite)},
	"WRRDMAWriteWithImm":     {"IBV_WR_RDMA_WRITE_WITH_IMM", int64(WRRDMAWriteWithImm)},
	"WRSend":                 {"IBV_WR_SEND", int64(WRSend)},
	"WRSendWithImm":          {"IBV_WR_SEND_WITH_IMM", int64(WRSendWithImm)},
	"WRRDMARead":             {"IBV_WR_RDMA_READ", int64(WRRDMARead)},
	"WRAtomicCmpAndSwp":      {"IBV_WR_ATOMIC_CMP_AND_SWP", int64(WRAtomicCmpAndSwp)},
	"WRAtomicFetchAndAdd":    {"IBV_WR_ATOMIC_FETCH_AND_ADD", int64(WRAtomicFetchAndAdd)},
	"WRLocalInv":             {"IBV_WR_LOCAL_INV", int64(WRLocalInv)},
	"WRBindMW":               {"IBV_WR_BIND_MW", int64(WRBindMW)},
	"WRSendWithInv":          {"IBV_WR_SEND_WITH_INV", int64(WRSendWithInv)},
	"WRTSO":                  {"IBV_WR_TSO", int64(WRTSO)},
	"SendFence":              {"IBV_SEND_FENCE", int64(SendFence)},
	"SendSignaled":           {"IBV_SEND_SIGNALED", int64(SendSignaled)},
	"SendSolicited":          {"IBV_SEND_SOLICITED", int64(SendSolicited)},
	"SendInline":             {"IBV_SEND_INLINE", int64(SendInline)},
	"SendIPCsum":             {"IBV_SEND_IP_CSUM", int64(SendIPCsum)},
	"AccessLocalWrite":       {"IBV_ACCESS_LOCAL_WRITE", int64(AccessLocalWrite)},
	"AccessRemoteWrite":      {"IBV_ACCESS_REMOTE_WRITE", int64(AccessRemoteWrite)},
	"AccessRemoteRead":       {"IBV_ACCESS_REMOTE_READ", int64(AccessRemoteRead)},
	"AccessRemoteAtomic":     {"IBV_ACCESS_REMOTE_ATOMIC", int64(AccessRemoteAtomic)},
	"AccessMWBind":           {"IBV_ACCESS_MW_BIND", int64(AccessMWBind)},
	"AccessZeroBased":        {"IBV_ACCESS_ZERO_BASED", int64(AccessZeroBased)},
	"AccessOnDemand":         {"IBV_ACCESS_ON_DEMAND", int64(AccessOnDemand)},
	"AccessHugeTLB":          {"IBV_ACCESS_HUGETLB", int64(AccessHugeTLB)},
	"EventCQErr":             {"IBV_EVENT_CQ_ERR", int64(EventCQErr)},
	"EventQPFatal":           {"IBV_EVENT_QP_FATAL", int64(EventQPFatal)},
	"EventQPReqErr":          {"IBV_EVENT_QP_REQ_ERR", int64(EventQPReqErr)},
	"EventQPAccessErr":       {"IBV_EVENT_QP_ACCESS_ERR", int64(EventQPAccessErr)},
	"EventCommEst":           {"IBV_EVENT_COMM_EST", int64(EventCommEst)},
	"EventSQDrained":         {"IBV_EVENT_SQ_DRAINED", int64(EventSQDrained)},
	"EventPathMig":           {"IBV_EVENT_PATH_MIG", int64(EventPathMig)},
	"EventPathMigErr":        {"IBV_EVENT_PATH_MIG_ERR", int64(EventPathMigErr)},
	"EventDeviceFatal":       {"IBV_EVENT_DEVICE_FATAL", int64(EventDeviceFatal)},
	"EventPortActive":        {"IBV_EVENT_PORT_ACTIVE", int64(EventPortActive)},
	"EventPortErr":           {"IBV_EVENT_PORT_ERR", int64(EventPortErr)},
	"EventLIDChange":         {"IBV_EVENT_LID_CHANGE", int64(EventLIDChange)},
	"EventPKeyChange":        {"IBV_EVENT_PKEY_CHANGE", int64(EventPKeyChange)},
	"EventSMChange":          {"IBV_EVENT_SM_CHANGE", int64(EventSMChange)},
	"EventSRQErr":            {"IBV_EVENT_SRQ_ERR", int64(EventSRQErr)},
	"EventSRQLimitReached":   {"IBV_EVENT_SRQ_LIMIT_REACHED", int64(EventSRQLimitReached)},
	"EventQPLastWQEReached":  {"IBV_EVENT_QP_LAST_WQE_REACHED", int64(EventQPLastWQEReached)},
	"EventClientReregister":  {"IBV_EVENT_CLIENT_REREGISTER", int64(EventClientReregister)},
	"EventGIDChange":         {"IBV_EVENT_GID_CHANGE", int64(EventGIDChange)},
	"EventWQFatal":           {"IBV_EVENT_WQ_FATAL", int64(EventWQFatal)},
	"QPAttrState":            {"IBV_QP_STATE", int64(QPAttrState)},
	"QPAttrCurState":         {"IBV_QP_CUR_STATE", int64(QPAttrCurState)},
	"QPAttrEnSQDAsyncNotify": {"IBV_QP_EN_SQD_ASYNC_NOTIFY", int64(QPAttrEnSQDAsyncNotify)},
	"QPAttrAccessFlags":      {"IBV_QP_ACCESS_FLAGS", int64(QPAttrAccessFlags)},
	"QPAttrPKeyIndex":        {"IBV_QP_PKEY_INDEX", int64(QPAttrPKeyIndex)},
	"QPAttrPort":             {"IBV_QP_PORT", int64(QPAttrPort)},
	"QPAttrQKey":             {"IBV_QP_QKEY", int64(QPAttrQKey)},
	"QPAttrAV":               {"IBV_QP_AV", int64(QPAttrAV)},
	"QPAttrPathMTU":          {"IBV_QP_PATH_MTU", int64(QPAttrPathMTU)},
	"QPAttrTimeout":          {"IBV_QP_TIMEOUT", int64(QPAttrTimeout)},
	"QPAttrRetryCnt":         {"IBV_QP_RETRY_CNT", int64(QPAttrRetryCnt)},
	"QPAttrRNRRetry":         {"IBV_QP_RNR_RETRY", int64(QPAttrRNRRetry)},
	"QPAttrRQPSN":            {"IBV_QP_RQ_PSN", int64(QPAttrRQPSN)},
	"QPAttrMaxQPRdAtomic":    {"IBV_QP_MAX_QP_RD_ATOMIC", int64(QPAttrMaxQPRdAtomic)},
	"QPAttrAltPath":          {"IBV_QP_ALT_PATH", int64(QPAttrAltPath)},
	"QPAttrMinRNRTimer":      {"IBV_QP_MIN_RNR_TIMER", int64(QPAttrMinRNRTimer)},
	"QPAttrSQPSN":            {"IBV_QP_SQ_PSN", int64(QPAttrSQPSN)},
	"QPAttrMaxDestRdAtomic":  {"IBV_QP_MAX_DEST_RD_ATOMIC", int64(QPAttrMaxDestRdAtomic)},
	"QPAttrPathMigState":     {"IBV_QP_PATH_MIG_STATE", int64(QPAttrPathMigState)},
	"QPAttrCap":              {"IBV_QP_CAP", int64(QPAttrCap)},
	"QPAttrDestQPN":          {"IBV_QP_DEST_QPN", int64(QPAttrDestQPN)},
	"SRQAttrMaxWR":           {"IBV_SRQ_MAX_WR", int64(SRQAttrMaxWR)},
	"SRQAttrLimit":           {"IBV_SRQ_LIMIT", int64(SRQAttrLimit)},
	"MTU256":                 {"IBV_MTU_256", int64(MTU256)},
	"MTU512":                 {"IBV_MTU_512", int64(MTU512)},
	"MTU1024":                {"IBV_MTU_1024", int64(MTU1024)},
	"MTU2048":                {"IBV_MTU_2048", int64(MTU2048)},
	"MTU4096":                {"IBV_MTU_4096", int64(MTU4096)},
	"PortNOP":                {"IBV_PORT_NOP", int64(PortNOP)},
	"PortDown":               {"IBV_PORT_DOWN", int64(PortDown)},
	"PortInit":               {"IBV_PORT_INIT", int64(PortInit)},
	"PortArmed":              {"IBV_PORT_ARMED", int64(PortArmed)},
	"PortActive":             {"IBV_PORT_ACTIVE", int64(PortActive)},
	"PortActiveDefer":        {"IBV_PORT_ACTIVE_DEFER", int64(PortActiveDefer)},
	"LinkLayerUnspecified":   {"IBV_LINK_LAYER_UNSPECIFIED", int64(LinkLayerUnspecified)},
	"LinkLayerInfiniBand":    {"IBV_LINK_LAYER_INFINIBAND", int64(LinkLayerInfiniBand)},
	"LinkLayerEthernet":      {"IBV_LINK_LAYER_ETHERNET", int64(LinkLayerEthernet)},
	"NodeUnknown":            {"IBV_NODE_UNKNOWN", int64(NodeUnknown)},
	"NodeCA":                 {"IBV_NODE_CA", int64(NodeCA)},
	"NodeSwitch":             {"IBV_NODE_SWITCH", int64(NodeSwitch)},
	"NodeRouter":             {"IBV_NODE_ROUTER", int64(NodeRouter)},
	"NodeRNIC":               {"IBV_NODE_RNIC", int64(NodeRNIC)},
	"NodeUSNIC":              {"IBV_NODE_USNIC", int64(NodeUSNIC)},
	"NodeUSNICUDP":           {"IBV_NODE_USNIC_UDP", int64(NodeUSNICUDP)},
	"NodeUnspecified":        {"IBV_NODE_UNSPECIFIED", int64(NodeUnspecified)},
	"TransportUnknown":       {"IBV_TRANSPORT_UNKNOWN", int64(TransportUnknown)},
	"TransportIB":            {"IBV_TRANSPORT_IB", int64(TransportIB)},
	"TransportIWARP":         {"IBV_TRANSPORT_IWARP", int64(TransportIWARP)},
	"TransportUSNIC":         {"IBV_TRANSPORT_USNIC", int64(TransportUSNIC)},
	"TransportUSNICUDP":      {"IBV_TRANSPORT_USNIC_UDP", int64(TransportUSNICUDP)},
	"TransportUnspecified":   {"IBV_TRANSPORT_UNSPECIFIED", int64(TransportUnspecified)},
	"GIDTypeIB":              {"IBV_GID_TYPE_IB", int64(GIDTypeIB)},
	"GIDTypeRoCEv1":          {"IBV_GID_TYPE_ROCE_V1", int64(GIDTypeRoCEv1)},
	"GIDTypeRoCEv2":          {"IBV_GID_TYPE_ROCE_V2", int64(GIDTypeRoCEv2)},
	"AtomicNone":             {"IBV_ATOMIC_NONE", int64(AtomicNone)},
	"AtomicHCA":              {"IBV_ATOMIC_HCA", int64(AtomicHCA)},
	"AtomicGlob":             {"IBV_ATOMIC_GLOB", int64(AtomicGlob)},
}

// TestEnumsMatchLibibverbs proves that each enum value crosses the cgo
// boundary unchanged: it equals the constant of the same meaning in
// <infiniband/verbs.h>, and no exported constant of enums.go is left out.
func TestEnumsMatchLibibverbs(t *testing.T) {
	for goName, want := range libibverbsNames {
		got, ok := cverbs.Constants[want.c]
		if !ok {
			t.Errorf("%s: cverbs has no %s", goName, want.c)
			continue
		}
		if got != want.value {
			t.Errorf("%s = %d, libibverbs %s = %d", goName, want.value, want.c, got)
		}
	}
	f, err := parser.ParseFile(token.NewFileSet(), "enums.go", enumsSource, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			for _, name := range spec.(*ast.ValueSpec).Names {
				if _, ok := libibverbsNames[name.Name]; name.IsExported() && !ok {
					t.Errorf("enums.go: %s has no libibverbs counterpart in this test", name.Name)
				}
			}
		}
	}
}

package soft_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/soft"
)

func TestQueries(t *testing.T) {
	fab := soft.NewFabric()
	newEnv(t, soft.Config{Name: "a", Fabric: fab})
	e := newEnv(t, soft.Config{Name: "b", Fabric: fab, Limits: soft.Limits{MaxQP: 7, MaxQPRdAtom: 3}})
	if _, err := soft.Open(soft.Config{Name: "b", Fabric: fab}); !errors.Is(err, ibv.ErrInvalidArgument) {
		t.Errorf("a second device named b on the fabric: %v", err)
	}
	if e.dev.Name() != "b" || e.dev.LID() != 2 || e.pd.Context() != ibv.Context(e.dev) {
		t.Errorf("device %q LID %d", e.dev.Name(), e.dev.LID())
	}
	attr, err := e.dev.QueryDevice()
	if err != nil || attr.MaxQP != 7 || attr.MaxQPRdAtom != 3 || attr.MaxQPWR != 16384 || attr.PhysPortCnt != 1 {
		t.Errorf("QueryDevice = %+v, %v", attr, err)
	}
	port, err := e.dev.QueryPort(1)
	if err != nil || port.State != ibv.PortActive || port.LID != 2 || port.ActiveMTU != ibv.MTU4096 {
		t.Errorf("QueryPort(1) = %+v, %v", port, err)
	}
	if _, err := e.dev.QueryPort(2); !errors.Is(err, ibv.ErrInvalidArgument) {
		t.Errorf("QueryPort(2): %v", err)
	}
	gid, err := e.dev.QueryGID(1, 0)
	if err != nil || gid != e.dev.GID() || gid.String() != "fe80::2" {
		t.Errorf("QueryGID = %s, %v", gid, err)
	}
	table, err := e.dev.QueryGIDTable()
	if err != nil || len(table) != 1 || table[0].GID != gid || table[0].Port != 1 {
		t.Errorf("QueryGIDTable = %+v, %v", table, err)
	}
	cq := e.cq(5)
	q := e.qp(cq, nil)
	if cq.CQE() != 5 || q.Type() != ibv.QPTRC || q.SendCQ() != cq || q.RecvCQ() != cq || q.SRQ() != nil {
		t.Error("QP or CQ accessors disagree with creation")
	}
	_, init, err := q.Query(0)
	if err != nil || init.Cap.MaxSendWR != 64 || init.SendCQ != cq || init.SRQ != nil {
		t.Errorf("Query init attributes = %+v, %v", init, err)
	}
}

func TestPostValidation(t *testing.T) {
	e := newEnv(t, soft.Config{})
	p := newPair(t, e, e)
	for _, tt := range []struct {
		wr   ibv.SendWR
		want error
	}{
		{ibv.SendWR{Opcode: ibv.WRLocalInv}, ibv.ErrNotSupported},
		{ibv.SendWR{Opcode: ibv.WRBindMW}, ibv.ErrNotSupported},
		{ibv.SendWR{Opcode: 42}, ibv.ErrInvalidArgument},
		{ibv.SendWR{Opcode: ibv.WRRDMARead, Flags: ibv.SendInline}, ibv.ErrInvalidArgument},
	} {
		if err := p.a.PostSend([]ibv.SendWR{tt.wr}); !errors.Is(err, tt.want) {
			t.Errorf("posting %s: %v, want %v", tt.wr.Opcode, err, tt.want)
		}
	}
	// An atomic whose local buffer is not one 8-byte SGE fails locally.
	post(t, p.a, ibv.SendWR{ID: 1, Opcode: ibv.WRAtomicFetchAndAdd, SGL: sge(p.ma, 0, 4), RemoteAddr: p.mb.Addr(), RKey: p.mb.RKey()})
	wantWCs(t, p.cqa, ibv.WC{ID: 1, Status: ibv.WCLocLenErr, QPNum: p.a.Num()})
	if _, err := e.pd.RegMR(nil, 0); !errors.Is(err, ibv.ErrInvalidArgument) {
		t.Errorf("registering no memory: %v", err)
	}
	if _, err := e.pd.RegMR(make([]byte, 8), ibv.AccessRemoteWrite); !errors.Is(err, ibv.ErrInvalidArgument) {
		t.Errorf("remote write without local write: %v", err)
	}
}

func TestSRQModify(t *testing.T) {
	e := newEnv(t, soft.Config{Limits: soft.Limits{MaxSRQWR: 8}})
	s := e.srq(4, 0)
	if err := s.PostRecv([]ibv.RecvWR{{ID: 1}, {ID: 2}, {ID: 3}}); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		attr ibv.SRQAttr
		mask ibv.SRQAttrMask
		want error
	}{
		{ibv.SRQAttr{MaxWR: 2}, ibv.SRQAttrMaxWR, ibv.ErrInvalidArgument},    // below the WRs it holds
		{ibv.SRQAttr{MaxWR: 9}, ibv.SRQAttrMaxWR, ibv.ErrInvalidArgument},    // above max_srq_wr, EINVAL as on rxe
		{ibv.SRQAttr{SRQLimit: 5}, ibv.SRQAttrLimit, ibv.ErrInvalidArgument}, // limit above the size
		{ibv.SRQAttr{MaxWR: 8}, ibv.SRQAttrMaxWR, nil},
	} {
		if err := s.Modify(tt.attr, tt.mask); !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
			t.Errorf("Modify(%+v, %d): %v, want %v", tt.attr, tt.mask, err, tt.want)
		}
	}
	if a, _ := s.Query(); a.MaxWR != 8 {
		t.Errorf("MaxWR after resize = %d", a.MaxWR)
	}
	err := s.PostRecv(make([]ibv.RecvWR, 6))
	if err == nil {
		t.Error("posted 9 WRs into an SRQ of 8")
	}
	// 3 held and 5 posted fill it: the sixth WR, index 5, is refused.
	var pe *ibv.PostError
	if !errors.As(err, &pe) || pe.Index != 5 || !errors.Is(err, ibv.ErrQueueFull) {
		t.Errorf("posting 6 WRs into an SRQ of 8 holding 3: %v, want a PostError at index 5 wrapping ErrQueueFull", err)
	}
}

func TestTrace(t *testing.T) {
	var lines []string
	e := newEnv(t, soft.Config{SRQPrefetch: 1, Trace: func(te soft.TraceEntry) { lines = append(lines, te.String()) }})
	cq := e.cq(1)
	srq := e.srq(4, 0)
	if err := srq.PostRecv([]ibv.RecvWR{{ID: 5}}); err != nil {
		t.Fatal(err)
	}
	a, b := e.qp(cq, srq), e.qp(e.cq(4), nil)
	connect(t, a, b, 1)
	post(t, b, ibv.SendWR{ID: 6, Opcode: ibv.WRSend}, ibv.SendWR{ID: 7, Opcode: ibv.WRSend}) // the second waits (RNR)
	if err := srq.PostRecv([]ibv.RecvWR{{ID: 8}}); err != nil {
		t.Fatal(err) // a's CQ of 1 overflows
	}
	want := []string{
		"soft0 qpn 17: RESET -> INIT", "soft0 qpn 17: INIT -> RTR", "soft0 qpn 17: took wr_id=5 from srq 2",
		"soft0 qpn 17: RTR -> RTS",
		"soft0 qpn 18: RESET -> INIT", "soft0 qpn 18: INIT -> RTR", "soft0 qpn 18: RTR -> RTS",
		"soft0 cq 1: wr_id=5 qpn=17 status=SUCCESS opcode=RECV byte_len=0",
		"soft0 qpn 17: took wr_id=8 from srq 2", // consumed at once by the waiting SEND 7 ...
		"soft0 event CQ_ERR cq 1",               // ... whose completion overflows the CQ
		"soft0 qpn 17: RTS -> ERR", "soft0 event QP_FATAL qpn=17",
		"soft0 event QP_LAST_WQE_REACHED qpn=17",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("trace:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	events(t, e.dev)
}

package soft_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/soft"
)

// TestRejectsNilObjects: a nil CQ, SRQ, channel or QP, typed or not, is
// refused with ErrInvalidArgument naming it, never a panic.
func TestRejectsNilObjects(t *testing.T) {
	e := newEnv(t, soft.Config{})
	cq := e.cq(16)
	cap1 := ibv.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}
	for _, tc := range []struct {
		name string
		attr ibv.QPInitAttr
		want string
	}{
		{"nil send CQ", ibv.QPInitAttr{RecvCQ: cq, Cap: cap1, Type: ibv.QPTRC}, "send CQ"},
		{"typed nil send CQ", ibv.QPInitAttr{SendCQ: (*soft.CQ)(nil), RecvCQ: cq, Cap: cap1, Type: ibv.QPTRC}, "send CQ"},
		{"nil receive CQ", ibv.QPInitAttr{SendCQ: cq, Cap: cap1, Type: ibv.QPTRC}, "receive CQ"},
		{"typed nil receive CQ", ibv.QPInitAttr{SendCQ: cq, RecvCQ: (*soft.CQ)(nil), Cap: cap1, Type: ibv.QPTRC}, "receive CQ"},
		{"typed nil SRQ", ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, SRQ: (*soft.SRQ)(nil), Cap: cap1, Type: ibv.QPTRC}, "SRQ"},
	} {
		qp, err := e.pd.CreateQP(tc.attr)
		if err == nil {
			e.closeLater(qp)
		}
		if !errors.Is(err, ibv.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CreateQP with %s = %v, want ErrInvalidArgument naming the %s", tc.name, err, tc.want)
		}
	}
	if c, err := e.dev.CreateCQ(16, (*soft.CompChannel)(nil)); !errors.Is(err, ibv.ErrInvalidArgument) {
		if err == nil {
			e.closeLater(c)
		}
		t.Errorf("CreateCQ with a typed nil channel = %v, want ErrInvalidArgument", err)
	}
	if err := e.dev.InjectSRQError((*soft.SRQ)(nil)); !errors.Is(err, ibv.ErrInvalidArgument) {
		t.Errorf("InjectSRQError(typed nil) = %v, want ErrInvalidArgument", err)
	}
	qp, err := e.pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: cap1, Type: ibv.QPTRC})
	if err != nil {
		t.Fatal(err)
	}
	e.closeLater(qp)
	for _, peer := range []ibv.QP{nil, (*soft.QP)(nil)} {
		if err := soft.Connect(qp, peer, 1); !errors.Is(err, ibv.ErrInvalidArgument) {
			t.Errorf("Connect(qp, %#v) = %v, want ErrInvalidArgument", peer, err)
		}
	}
	// A trace entry whose event names a CQ or SRQ of no soft device still
	// formats.
	_ = soft.TraceEntry{Kind: soft.TraceEvent, Event: ibv.AsyncEvent{Type: ibv.EventCQErr, CQ: (*soft.CQ)(nil)}}.String()
}

// TestOpenRejectsNegativeLimits: a negative limit or prefetch is an error
// naming the field; zero still takes the default.
func TestOpenRejectsNegativeLimits(t *testing.T) {
	for _, tc := range []struct {
		cfg  soft.Config
		want string
	}{
		{soft.Config{Limits: soft.Limits{MaxCQE: -1}}, "limit MaxCQE is -1"},
		{soft.Config{Limits: soft.Limits{MaxQP: 4, MaxQPRdAtom: -8}}, "limit MaxQPRdAtom is -8"},
		{soft.Config{SRQPrefetch: -2}, "SRQPrefetch -2"},
	} {
		d, err := soft.Open(tc.cfg)
		if err == nil {
			d.Close()
		}
		if !errors.Is(err, ibv.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%+v) = %v, want ErrInvalidArgument naming %q", tc.cfg, err, tc.want)
		}
	}
	e := newEnv(t, soft.Config{Limits: soft.Limits{MaxQP: 4}})
	attr, err := e.dev.QueryDevice()
	if err != nil || attr.MaxQP != 4 || attr.MaxCQE != 32767 {
		t.Errorf("QueryDevice = %+v, %v; want MaxQP 4 and the default MaxCQE 32767", attr, err)
	}
}

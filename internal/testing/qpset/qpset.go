// Package qpset creates QPs in a spread of types and states on a device,
// for the tests that compare what RDMA netlink reports (package rdmanl,
// qpdrain qps) with what was created: RC QPs in RESET, INIT, RTS (a
// connected pair) and ERR, and a UD QP in INIT. It speaks only the ibv API.
package qpset

import (
	"fmt"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/rcsetup"
	"github.com/qpdrain/qpdrain/teardown"
)

// Port is the port the QPs use.
const Port = 1

// QKey is the UD QP's Q_Key.
const QKey = 0x11111111

// Want is what a created QP should look like.
type Want struct {
	Type  ibv.QPType
	State ibv.QPState
}

// Set is the QPs created, by number, with the PD and CQ they use.
type Set struct {
	PD   ibv.PD
	CQ   ibv.CQ
	QPs  []ibv.QP
	Want map[uint32]Want
	objs teardown.List
}

// Close destroys the QPs, the CQ and the PD.
func (s *Set) Close() error { return s.objs.Close() }

// NewPD allocates the PD (and CQ) of a set; Spread or Many then fill it,
// possibly from another thread.
func NewPD(ctx ibv.Context) (*Set, error) {
	s := &Set{Want: map[uint32]Want{}}
	pd, err := ctx.AllocPD()
	if err != nil {
		return nil, fmt.Errorf("allocating a PD: %w", err)
	}
	s.objs.Add(pd)
	s.PD = pd
	cq, err := ctx.CreateCQ(256, nil)
	if err != nil {
		return nil, fmt.Errorf("creating a CQ: %w", s.fail(err))
	}
	s.objs.Add(cq)
	s.CQ = cq
	return s, nil
}

func (s *Set) fail(err error) error {
	if cerr := s.objs.Close(); cerr != nil {
		return fmt.Errorf("%w (and cleaning up: %v)", err, cerr)
	}
	return err
}

func (s *Set) create(t ibv.QPType) (ibv.QP, error) {
	qp, err := s.PD.CreateQP(ibv.QPInitAttr{
		SendCQ: s.CQ, RecvCQ: s.CQ, Type: t,
		Cap: ibv.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1},
	})
	if err != nil {
		return nil, fmt.Errorf("creating a %s QP: %w", t, err)
	}
	s.objs.Add(qp)
	s.QPs = append(s.QPs, qp)
	return qp, nil
}

// Spread creates the spread of types and states the package describes.
func (s *Set) Spread() error {
	route, err := rcsetup.Loopback(s.PD.Context(), Port)
	if err != nil {
		return err
	}
	var rc [5]ibv.QP
	for i := range rc {
		if rc[i], err = s.create(ibv.QPTRC); err != nil {
			return err
		}
	}
	// rc[0] stays in RESET; rc[1] goes to INIT; rc[2] and rc[3] connect to
	// each other; rc[4] goes INIT -> ERR (RESET -> ERR is refused).
	if err := route.Bring(rc[1], rc[0].Num(), ibv.QPSInit); err != nil {
		return err
	}
	if err := route.Connect(rc[2], rc[3]); err != nil {
		return err
	}
	if err := route.Bring(rc[4], rc[0].Num(), ibv.QPSInit); err != nil {
		return err
	}
	if err := rc[4].Modify(ibv.QPAttr{State: ibv.QPSErr}, ibv.QPAttrState); err != nil {
		return fmt.Errorf("moving QP %d to ERR: %w", rc[4].Num(), err)
	}
	for i, st := range []ibv.QPState{ibv.QPSReset, ibv.QPSInit, ibv.QPSRTS, ibv.QPSRTS, ibv.QPSErr} {
		s.Want[rc[i].Num()] = Want{Type: ibv.QPTRC, State: st}
	}
	ud, err := s.create(ibv.QPTUD)
	if err != nil {
		return err
	}
	if err := ud.Modify(ibv.QPAttr{State: ibv.QPSInit, PKeyIndex: 0, PortNum: Port, QKey: QKey},
		ibv.QPAttrState|ibv.QPAttrPKeyIndex|ibv.QPAttrPort|ibv.QPAttrQKey); err != nil {
		return fmt.Errorf("moving UD QP %d to INIT: %w", ud.Num(), err)
	}
	s.Want[ud.Num()] = Want{Type: ibv.QPTUD, State: ibv.QPSInit}
	return nil
}

// Many creates n RC QPs in RESET.
func (s *Set) Many(n int) error {
	for range n {
		qp, err := s.create(ibv.QPTRC)
		if err != nil {
			return err
		}
		s.Want[qp.Num()] = Want{Type: ibv.QPTRC, State: ibv.QPSReset}
	}
	return nil
}

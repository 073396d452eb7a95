package churn

import (
	"context"
	"errors"
	"fmt"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/ipoibcm"
	"github.com/qpdrain/qpdrain/rcsetup"
)

// port is the port both sides use.
const port = 1

// open creates the Manager and the peers' PD, CQ and send buffer.
func (s *sim) open() error {
	var err error
	if s.toPeer, err = route(s.cfg.Device, s.cfg.PeerDevice); err != nil {
		return err
	}
	if s.toRX, err = route(s.cfg.PeerDevice, s.cfg.Device); err != nil {
		return err
	}
	pd, err := s.cfg.Device.AllocPD()
	if err != nil {
		return fmt.Errorf("allocating the manager's PD: %w", err)
	}
	s.objs.Add(pd)
	mc := s.cfg.Manager
	user := mc.Trace
	mc.Context, mc.PD, mc.Clock = s.cfg.Device, pd, s.clock
	mc.Trace = func(e ipoibcm.Event) {
		s.trace(e)
		if user != nil {
			user(e)
		}
	}
	if s.m, err = ipoibcm.New(mc); err != nil {
		return err
	}
	s.res.setManager(s.m.Config())
	if s.peerPD, err = s.cfg.PeerDevice.AllocPD(); err != nil {
		return fmt.Errorf("allocating the peers' PD: %w", err)
	}
	s.objs.Add(s.peerPD)
	// Room for every live peer's sends; a full CQ would be a CQ error.
	if s.peerCQ, err = s.cfg.PeerDevice.CreateCQ(4096, nil); err != nil {
		return fmt.Errorf("creating the peers' CQ: %w", err)
	}
	s.objs.Add(s.peerCQ)
	if s.peerBuf, err = ibv.AllocBuffer(4096); err != nil {
		return fmt.Errorf("allocating the peers' buffer: %w", err)
	}
	if s.peerMR, err = s.peerPD.RegMR(s.peerBuf, ibv.AccessLocalWrite); err != nil {
		return fmt.Errorf("registering the peers' buffer: %w", err)
	}
	s.objs.Add(s.peerMR)
	return nil
}

// close closes every peer still connected, stops the Manager (as device
// stop) and releases the rest, recording what the stop did.
func (s *sim) close(ctx context.Context) error {
	var errs []error
	for len(s.live) > 0 {
		if err := s.closePeer(s.live[0]); err != nil {
			errs = append(errs, err)
			break
		}
	}
	if s.m != nil {
		rep, err := s.m.Stop(ctx)
		errs = append(errs, err)
		s.res.stopped(rep, s.m.Stats())
	}
	errs = append(errs, s.objs.Close())
	if s.peerBuf != nil {
		errs = append(errs, ibv.FreeBuffer(s.peerBuf))
	}
	return errors.Join(errs...)
}

// route is how QPs on from reach QPs on to: loopback on one device, else
// by to's LID (two soft devices on one fabric, or InfiniBand ports).
func route(from, to ibv.Context) (rcsetup.Route, error) {
	r, err := rcsetup.Loopback(from, port)
	if err != nil || from == to {
		return r, err
	}
	pa, err := to.QueryPort(port)
	if err != nil {
		return r, fmt.Errorf("querying port %s/%d: %w", to.Name(), port, err)
	}
	if pa.LinkLayer == ibv.LinkLayerEthernet || r.AH.IsGlobal {
		return r, fmt.Errorf("reaching %s from %s: RoCE ports need one device in loopback: %w", to.Name(), from.Name(), ibv.ErrNotSupported)
	}
	r.AH.DLID = pa.LID
	return r, nil
}

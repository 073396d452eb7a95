// Package rcsetup connects RC queue pairs of any ibv device: by hand, the
// way rc_pingpong does, so callers need not write RESET -> INIT -> RTR ->
// RTS themselves, or through the RDMA CM (CM), the way applications do and
// the only way an iWARP device connects (NeedsCM). A Connector (a Route,
// or a CM from ListenCM) creates connected pairs. Loopback finds the route from a port to itself (the port's
// LID, or a GRH with a RoCE v2 GID from the GID table when the link layer
// is Ethernet) and Route.Connect joins two QPs over it. For a peer on
// another port or host, fill a Route with the address vector that reaches
// it (its LID, or its GID in a GRH) and Bring each side's QP towards the
// other's QP number. The device tests (internal/testing/devtest) and the
// provider flush check (flushcheck) use it.
package rcsetup

import (
	"fmt"

	"github.com/qpdrain/qpdrain/ibv"
)

// AllAccess is the QP access Connect grants: local write and remote
// write, read and atomic.
const AllAccess = ibv.AccessLocalWrite | ibv.AccessRemoteWrite | ibv.AccessRemoteRead | ibv.AccessRemoteAtomic

// Route is what two RC QPs on one port of a device need to reach each
// other: the port, the address vector that reaches the port from itself,
// and the path MTU.
type Route struct {
	Port uint8
	AH   ibv.AHAttr
	MTU  ibv.MTU
	// Retry, when not nil, replaces Bring's retry attributes.
	Retry *Retry
}

// Retry are the RC retry attributes of ibv_modify_qp(3): the requester's
// local ACK timeout (4.096 µs × 2^Timeout), retry count and RNR retry
// count (7: infinite), and the responder's RNR NAK timer code.
type Retry struct {
	Timeout, RetryCnt, RNRRetry, MinRNRTimer uint8
}

// DefaultRetry is what Bring uses without Route.Retry: timeout 14 (67 ms),
// 7 retries, infinite RNR retries, RNR NAK timer 12 (0.64 ms).
var DefaultRetry = Retry{Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12}

// Loopback returns the route from port to itself. The port must be ACTIVE.
// RoCE ports need a GRH with a GID from the GID table; RoCE v2 is preferred,
// as rc_pingpong's users pick it. InfiniBand ports use the LID. The MTU is
// the port's active MTU, at most 1024.
func Loopback(ctx ibv.Context, port uint8) (Route, error) {
	pa, err := ctx.QueryPort(port)
	if err != nil {
		return Route{}, fmt.Errorf("querying port %d: %w", port, err)
	}
	if pa.State != ibv.PortActive {
		return Route{}, fmt.Errorf("port %s/%d is %s, want ACTIVE", ctx.Name(), port, pa.State)
	}
	r := Route{Port: port, AH: ibv.AHAttr{PortNum: port, DLID: pa.LID}, MTU: min(pa.ActiveMTU, ibv.MTU1024)}
	if pa.LinkLayer != ibv.LinkLayerEthernet {
		return r, nil
	}
	table, err := ctx.QueryGIDTable()
	if err != nil {
		return Route{}, fmt.Errorf("querying GID table: %w", err)
	}
	var pick *ibv.GIDEntry
	for i := range table {
		e := &table[i]
		if e.Port != port || e.GID.IsZero() {
			continue
		}
		if pick == nil || (e.Type == ibv.GIDTypeRoCEv2 && pick.Type != ibv.GIDTypeRoCEv2) {
			pick = e
		}
	}
	if pick == nil {
		return Route{}, fmt.Errorf("RoCE port %s/%d has no GID: %v", ctx.Name(), port, table)
	}
	r.AH.DLID = 0
	r.AH.IsGlobal = true
	r.AH.GRH = ibv.GlobalRoute{DGID: pick.GID, SGIDIndex: uint8(pick.Index), HopLimit: 1}
	return r, nil
}

// Connect moves a and b, two RC QPs in RESET on the route's device, to RTS
// connected to each other.
func (r Route) Connect(a, b ibv.QP) error {
	if err := r.Bring(a, b.Num(), ibv.QPSRTS); err != nil {
		return err
	}
	return r.Bring(b, a.Num(), ibv.QPSRTS)
}

// Bring moves qp, an RC QP in RESET, through INIT and RTR towards the QP
// numbered peer, stopping at state to (INIT, RTR or RTS). Connections use
// the route's Retry (DefaultRetry without one), one outstanding RDMA READ
// or atomic each way, and AllAccess.
func (r Route) Bring(qp ibv.QP, peer uint32, to ibv.QPState) error {
	if to != ibv.QPSInit && to != ibv.QPSRTR && to != ibv.QPSRTS {
		return fmt.Errorf("bringing QP %d to %s: want INIT, RTR or RTS: %w", qp.Num(), to, ibv.ErrInvalidArgument)
	}
	const rdAtom = 1
	rt := DefaultRetry
	if r.Retry != nil {
		rt = *r.Retry
	}
	steps := []struct {
		attr ibv.QPAttr
		mask ibv.QPAttrMask
	}{
		{ibv.QPAttr{State: ibv.QPSInit, PKeyIndex: 0, PortNum: r.Port, AccessFlags: AllAccess},
			ibv.QPAttrState | ibv.QPAttrPKeyIndex | ibv.QPAttrPort | ibv.QPAttrAccessFlags},
		{ibv.QPAttr{State: ibv.QPSRTR, PathMTU: r.MTU, DestQPNum: peer, RQPSN: 0, MaxDestRdAtomic: rdAtom, MinRNRTimer: rt.MinRNRTimer, AH: r.AH},
			ibv.QPAttrState | ibv.QPAttrAV | ibv.QPAttrPathMTU | ibv.QPAttrDestQPN | ibv.QPAttrRQPSN | ibv.QPAttrMaxDestRdAtomic | ibv.QPAttrMinRNRTimer},
		{ibv.QPAttr{State: ibv.QPSRTS, Timeout: rt.Timeout, RetryCnt: rt.RetryCnt, RNRRetry: rt.RNRRetry, SQPSN: 0, MaxRdAtomic: rdAtom},
			ibv.QPAttrState | ibv.QPAttrTimeout | ibv.QPAttrRetryCnt | ibv.QPAttrRNRRetry | ibv.QPAttrSQPSN | ibv.QPAttrMaxQPRdAtomic},
	}
	for _, s := range steps {
		if err := qp.Modify(s.attr, s.mask); err != nil {
			return fmt.Errorf("connecting QP %d to %d: moving to %s: %w", qp.Num(), peer, s.attr.State, err)
		}
		if s.attr.State == to {
			return nil
		}
	}
	return nil
}

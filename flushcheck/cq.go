package flushcheck

import (
	"fmt"
	"strings"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/rcsetup"
)

// cqOverrun: a QP posts two signaled RDMA WRITEs more than its CQ holds
// and nobody polls.
func cqOverrun(e *env) (verdict, error) {
	pd, err := e.pd()
	if err != nil {
		return verdict{}, err
	}
	cq, err := e.cq(4)
	if err != nil {
		return verdict{}, err
	}
	size := cq.CQE()
	n := size + 2
	a, _, err := e.connectPair(pd, rcAttr(cq, nil, n), rcsetup.DefaultRetry)
	if err != nil {
		return verdict{}, err
	}
	local, err := e.buffer(pd, 64, ibv.AccessLocalWrite)
	if err != nil {
		return verdict{}, err
	}
	remote, err := e.buffer(pd, 64, ibv.AccessLocalWrite|ibv.AccessRemoteWrite)
	if err != nil {
		return verdict{}, err
	}
	wrs := make([]ibv.SendWR, n)
	for i := range wrs {
		wrs[i] = ibv.SendWR{ID: sendBase + uint64(i), Opcode: ibv.WRRDMAWrite, Flags: ibv.SendSignaled,
			SGL:        []ibv.SGE{{Addr: local.Addr(), Length: 8, LKey: local.LKey()}},
			RemoteAddr: remote.Addr(), RKey: remote.RKey()}
	}
	unread, err := e.stateUnread(a)
	if err != nil {
		return verdict{}, err
	}
	e.mark()
	if err := e.postSend(a, wrs); err != nil {
		return verdict{}, fmt.Errorf("posting %d RDMA WRITEs: %w", n, err)
	}
	isCQErr := func(ev ibv.AsyncEvent) bool { return ev.Type == ibv.EventCQErr && ev.CQ == cq }
	evs, err := e.eventsThrough(isCQErr)
	if err != nil {
		return verdict{}, err
	}
	_, st, err := e.stateOrUnread(a, unread)
	if err != nil {
		return verdict{}, err
	}
	wcs, err := e.poll(cq, n, e.o.Quiet)
	if err != nil {
		return verdict{}, err
	}
	obs := fmt.Sprintf("%d signaled RDMA WRITEs on a CQ of %d entries: events %s; QP %s; %d completions polled (%d SUCCESS), %d lost",
		n, size, eventList(evs), st, len(wcs), withStatus(wcs, ibv.WCSuccess), n-len(wcs))
	if unread != "" {
		obs += " (" + unread + ")"
	}
	if !hasEvent(evs, isCQErr) {
		return deviation("%s: no CQ_ERR within %v, so a drain on this CQ cannot tell that its barrier completion may be lost", obs, e.o.Timeout), nil
	}
	return pass("%s: a drain learns of the loss from CQ_ERR and must not call a QP on this CQ safe", obs), nil
}

// flushOrder: QPs A and B complete on one CQ. A enters ERROR with four
// receives outstanding, then B with four, then a send is posted on B in
// ERROR: the barrier a batched drain would put on B. Three rounds.
func flushOrder(e *env) (verdict, error) {
	pd, err := e.pd()
	if err != nil {
		return verdict{}, err
	}
	const rounds, n = 3, 4
	var late []string
	for round := range rounds {
		cq, err := e.cq(64)
		if err != nil {
			return verdict{}, err
		}
		qa, _, err := e.connectPair(pd, rcAttr(cq, nil, 16), rcsetup.DefaultRetry)
		if err != nil {
			return verdict{}, err
		}
		qb, _, err := e.connectPair(pd, rcAttr(cq, nil, 16), rcsetup.DefaultRetry)
		if err != nil {
			return verdict{}, err
		}
		for _, q := range []ibv.QP{qa, qb} {
			if err := e.postRecv(q, e.recvs(recvBase, n)); err != nil {
				return verdict{}, fmt.Errorf("posting receives: %w", err)
			}
		}
		if err := e.toError(qa); err != nil {
			return verdict{}, err
		}
		if err := e.modify(qb, ibv.QPAttr{State: ibv.QPSErr}, ibv.QPAttrState); err != nil {
			return verdict{}, fmt.Errorf("moving QP %d to ERR: %w", qb.Num(), err)
		}
		if err := e.postSend(qb, sends(sendBase, 1)); err != nil {
			return verdict{}, fmt.Errorf("posting the barrier send on QP %d: %w", qb.Num(), err)
		}
		wcs, err := e.poll(cq, 2*n+1, e.o.Timeout)
		if err != nil {
			return verdict{}, err
		}
		barrier, aAfter := -1, 0
		for i, wc := range wcs {
			switch {
			case wc.QPNum == qb.Num() && wc.ID == sendBase:
				barrier = i
			case wc.QPNum == qa.Num() && barrier >= 0:
				aAfter++
			}
		}
		switch {
		case len(wcs) < 2*n+1:
			return deviation("round %d: %d of %d completions within %v of ERROR (%s), so the order cannot be judged: the barrier never completed",
				round+1, len(wcs), 2*n+1, e.o.Timeout, wcList(wcs, qa.Num())), nil
		case aAfter > 0:
			late = append(late, fmt.Sprintf("round %d: %d of qpn %d's flushes after qpn %d's barrier (%s)",
				round+1, aAfter, qa.Num(), qb.Num(), wcList(wcs, qa.Num())))
		}
	}
	if len(late) > 0 {
		return deviation("%s: a barrier on one QP does not cover another's flushes here", strings.Join(late, "; ")), nil
	}
	return pass("in %d rounds every flush of the QP that entered ERROR first came before the send posted in ERROR on the other (not a guarantee: the specification orders completions per work queue only)", rounds), nil
}

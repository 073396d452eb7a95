package soft_test

import (
	"testing"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/soft"
)

func TestQuirks(t *testing.T) {
	tests := []struct {
		name   string
		quirks soft.Quirks
		// run acts on a connected pair whose QP a is attached to an SRQ and
		// checks what the quirk changes.
		run func(t *testing.T, e *env, p *pair)
	}{
		{"none", soft.Quirks{}, func(t *testing.T, e *env, p *pair) {
			toState(t, p.a, ibv.QPSErr)
			post(t, p.a, ibv.SendWR{ID: 1})
			wantWCs(t, p.cqa, flushed(1, p.a.Num()))
			wantEvents(t, e.dev, "QP_LAST_WQE_REACHED qpn=17")
		}},
		{"SendInErrorNotFlushed", soft.Quirks{SendInErrorNotFlushed: true}, func(t *testing.T, e *env, p *pair) {
			post(t, p.a, ibv.SendWR{ID: 1, Opcode: ibv.WRSend}) // waits for a receive (RNR) ...
			toState(t, p.a, ibv.QPSErr)
			wantWCs(t, p.cqa, flushed(1, p.a.Num())) // ... and is flushed: only posts in ERROR are lost
			post(t, p.a, ibv.SendWR{ID: 2})
			wantWCs(t, p.cqa)
			toState(t, p.a, ibv.QPSErr)
			wantWCs(t, p.cqa)
		}},
		{"NoLastWQEReached", soft.Quirks{NoLastWQEReached: true}, func(t *testing.T, e *env, p *pair) {
			toState(t, p.a, ibv.QPSErr)
			wantEvents(t, e.dev)
		}},
		{"LastWQEReachedTwice", soft.Quirks{LastWQEReachedTwice: true}, func(t *testing.T, e *env, p *pair) {
			toState(t, p.a, ibv.QPSErr)
			wantEvents(t, e.dev, "QP_LAST_WQE_REACHED qpn=17", "QP_LAST_WQE_REACHED qpn=17")
		}},
		{"RecvInErrorFlushDeferred", soft.Quirks{RecvInErrorFlushDeferred: true}, func(t *testing.T, e *env, p *pair) {
			toState(t, p.b, ibv.QPSErr)
			postRecv(t, p.b, ibv.RecvWR{ID: 1})
			wantWCs(t, p.cqb)
			postRecv(t, p.b, ibv.RecvWR{ID: 2}) // the next post flushes the first
			wantWCs(t, p.cqb, flushed(1, p.b.Num()))
			toState(t, p.b, ibv.QPSErr) // so does a Modify
			wantWCs(t, p.cqb, flushed(2, p.b.Num()))
			post(t, p.b, ibv.SendWR{ID: 3}) // sends are not deferred
			wantWCs(t, p.cqb, flushed(3, p.b.Num()))
		}},
		{"DrainNeedsRTS", soft.Quirks{DrainNeedsRTS: true}, func(t *testing.T, e *env, p *pair) {
			// p.a reached RTS: its drain WR flushes.
			toState(t, p.a, ibv.QPSErr)
			post(t, p.a, ibv.SendWR{ID: 1})
			wantWCs(t, p.cqa, flushed(1, p.a.Num()))
			// A QP that went to ERROR from INIT never flushes posts.
			q := e.qp(e.cq(4), nil)
			reach(t, q, ibv.QPSInit)
			toState(t, q, ibv.QPSErr)
			post(t, q, ibv.SendWR{ID: 2})
			postRecv(t, q, ibv.RecvWR{ID: 3})
			wantWCs(t, q.SendCQ())
		}},
		{"RecvInErrorNotFlushed", soft.Quirks{RecvInErrorNotFlushed: true}, func(t *testing.T, e *env, p *pair) {
			postRecv(t, p.b, ibv.RecvWR{ID: 1})
			toState(t, p.b, ibv.QPSErr)
			wantWCs(t, p.cqb, flushed(1, p.b.Num())) // outstanding ones flush ...
			postRecv(t, p.b, ibv.RecvWR{ID: 2})
			post(t, p.b, ibv.SendWR{ID: 3})
			wantWCs(t, p.cqb, flushed(3, p.b.Num())) // ... a receive posted in ERROR never
		}},
		{"NoResponderErrorEvent", soft.Quirks{NoResponderErrorEvent: true}, func(t *testing.T, e *env, p *pair) {
			post(t, p.a, ibv.SendWR{ID: 2, Opcode: ibv.WRSendWithInv})
			wantWCs(t, p.cqa, ibv.WC{ID: 2, Status: ibv.WCRemInvReqErr, QPNum: p.a.Num()})
			wantEvents(t, e.dev, "QP_LAST_WQE_REACHED qpn=17") // the requester's own; nothing from the responder
			if s := state(t, p.b); s != ibv.QPSErr {
				t.Errorf("responder: %s, want ERR", s)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, soft.Config{Quirks: tt.quirks})
			srq := e.srq(8, 0)
			p := &pair{cqa: e.cq(16), cqb: e.cq(16)}
			p.a, p.b = e.qp(p.cqa, srq), e.qp(p.cqb, nil)
			connect(t, p.a, p.b, 1)
			tt.run(t, e, p)
		})
	}
}

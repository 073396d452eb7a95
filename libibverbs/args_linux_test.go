//go:build linux && cgo

package libibverbs

import (
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/internal/testing/cverbs"
)

// TestCreateRejectsNilObjects: a nil CQ, SRQ or completion channel, typed
// or not, is refused with ErrInvalidArgument naming it, before any call into
// libibverbs; no device is needed to see it.
func TestCreateRejectsNilObjects(t *testing.T) {
	c := &verbsContext{name: "test"}
	p := &verbsPD{ctx: c}
	cq := &verbsCQ{ctx: c}
	for _, tc := range []struct {
		name string
		attr ibv.QPInitAttr
		want string
	}{
		{"nil send CQ", ibv.QPInitAttr{RecvCQ: cq, Type: ibv.QPTRC}, "send CQ"},
		{"typed nil send CQ", ibv.QPInitAttr{SendCQ: (*verbsCQ)(nil), RecvCQ: cq, Type: ibv.QPTRC}, "send CQ"},
		{"nil receive CQ", ibv.QPInitAttr{SendCQ: cq, Type: ibv.QPTRC}, "receive CQ"},
		{"typed nil receive CQ", ibv.QPInitAttr{SendCQ: cq, RecvCQ: (*verbsCQ)(nil), Type: ibv.QPTRC}, "receive CQ"},
		{"typed nil SRQ", ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, SRQ: (*verbsSRQ)(nil), Type: ibv.QPTRC}, "SRQ"},
	} {
		_, err := p.CreateQP(tc.attr)
		if !errors.Is(err, ibv.ErrInvalidArgument) || !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CreateQP with %s = %v, want ErrInvalidArgument naming the %s", tc.name, err, tc.want)
		}
	}
	if _, err := c.CreateCQ(16, (*verbsCompChannel)(nil)); !errors.Is(err, ibv.ErrInvalidArgument) || !strings.Contains(err.Error(), "completion channel") {
		t.Errorf("CreateCQ with a typed nil channel = %v, want ErrInvalidArgument naming the channel", err)
	}
}

// TestSizesOutOfRange: a size or index that does not fit libibverbs's int
// is refused, not truncated into a different valid one.
func TestSizesOutOfRange(t *testing.T) {
	c := &verbsContext{name: "test"}
	for _, cqe := range []int{0, -1, 1<<32 + 16} {
		if _, err := c.CreateCQ(cqe, nil); !errors.Is(err, ibv.ErrInvalidArgument) {
			t.Errorf("CreateCQ(%d) = %v, want ErrInvalidArgument", cqe, err)
		}
	}
	for _, index := range []int{-1, 1 << 32} {
		if _, err := c.QueryGID(1, index); !errors.Is(err, ibv.ErrInvalidArgument) || !strings.Contains(err.Error(), "index") {
			t.Errorf("QueryGID(1, %d) = %v, want ErrInvalidArgument naming the index", index, err)
		}
	}
}

// TestPostStopsAtUnsupportedOpcode: a WR the binding cannot express (BIND_MW,
// TSO) ends the batch as a provider's bad_wr does: the WRs before it reach
// the provider, and the *PostError names it with ErrNotSupported.
func TestPostStopsAtUnsupportedOpcode(t *testing.T) {
	q := fakeQP(t)
	for _, op := range []ibv.WROpcode{ibv.WRBindMW, ibv.WRTSO} {
		for _, prefix := range []int{0, 2} {
			wrs := make([]ibv.SendWR, prefix, prefix+2)
			for i := range wrs {
				wrs[i] = ibv.SendWR{ID: uint64(i), Opcode: ibv.WRSend}
			}
			wrs = append(wrs, ibv.SendWR{ID: 9, Opcode: op}, ibv.SendWR{ID: 10, Opcode: ibv.WRSend})
			before := cverbs.FakeSent()
			err := q.PostSend(wrs)
			var pe *ibv.PostError
			if !errors.As(err, &pe) || pe.Index != prefix || !errors.Is(err, ibv.ErrNotSupported) {
				t.Errorf("PostSend of %d SENDs, %s, SEND = %v, want a PostError at %d matching ErrNotSupported", prefix, op, err, prefix)
			}
			if n := cverbs.FakeSent() - before; n != prefix {
				t.Errorf("PostSend of %d SENDs, %s, SEND gave the provider %d WRs, want %d", prefix, op, n, prefix)
			}
		}
	}
}

// fakeQP is a QP of the fake provider (internal/testing/cverbs), which
// accepts every WR at once, with its post buffers, freed when tb ends.
func fakeQP(tb testing.TB) *verbsQP {
	q := &verbsQP{}
	q.setQP(cverbs.FakeQP())
	var err error
	if q.sendPost, err = newPostBuf(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(q.sendPost.free)
	if q.recvPost, err = newPostBuf(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(q.recvPost.free)
	return q
}

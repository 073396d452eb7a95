//go:build linux && cgo

package ibv

import (
	"errors"
	"strings"
	"syscall"
	"testing"
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
		attr QPInitAttr
		want string
	}{
		{"nil send CQ", QPInitAttr{RecvCQ: cq, Type: QPTRC}, "send CQ"},
		{"typed nil send CQ", QPInitAttr{SendCQ: (*verbsCQ)(nil), RecvCQ: cq, Type: QPTRC}, "send CQ"},
		{"nil receive CQ", QPInitAttr{SendCQ: cq, Type: QPTRC}, "receive CQ"},
		{"typed nil receive CQ", QPInitAttr{SendCQ: cq, RecvCQ: (*verbsCQ)(nil), Type: QPTRC}, "receive CQ"},
		{"typed nil SRQ", QPInitAttr{SendCQ: cq, RecvCQ: cq, SRQ: (*verbsSRQ)(nil), Type: QPTRC}, "SRQ"},
	} {
		_, err := p.CreateQP(tc.attr)
		if !errors.Is(err, ErrInvalidArgument) || !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CreateQP with %s = %v, want ErrInvalidArgument naming the %s", tc.name, err, tc.want)
		}
	}
	if _, err := c.CreateCQ(16, (*verbsCompChannel)(nil)); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "completion channel") {
		t.Errorf("CreateCQ with a typed nil channel = %v, want ErrInvalidArgument naming the channel", err)
	}
}

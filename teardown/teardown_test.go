package teardown

import (
	"errors"
	"strings"
	"testing"
)

type obj struct {
	name   string
	err    error
	closed *[]string
}

func (o *obj) Close() error {
	*o.closed = append(*o.closed, o.name)
	return o.err
}

// Objects close last first, every one even after a failure, and each
// failure is reported with the object's type.
func TestClose(t *testing.T) {
	var closed []string
	busy := errors.New("busy")
	var l List
	l.Add(&obj{"device", busy, &closed})
	l.Add(&obj{"pd", nil, &closed})
	l.Add(&obj{"qp", busy, &closed})
	err := l.Close()
	if got := strings.Join(closed, " "); got != "qp pd device" {
		t.Errorf("closed %q, want qp pd device", got)
	}
	if !errors.Is(err, busy) || strings.Count(err.Error(), "closing *teardown.obj: busy") != 2 {
		t.Errorf("Close = %v, want both failures, each naming its type", err)
	}
	closed = nil
	if err := l.Close(); err != nil || len(closed) != 0 {
		t.Errorf("second Close = %v and closed %q, want nil and nothing", err, closed)
	}
	var empty List
	if err := empty.Close(); err != nil {
		t.Errorf("Close of an empty list = %v", err)
	}
}

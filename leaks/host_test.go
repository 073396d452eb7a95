package leaks

import (
	"context"
	"errors"
	"testing"

	"github.com/qpdrain/qpdrain/rdmanl"
)

// A HostSampler without a Conn (what a failed rdmanl.Dial leaves) fails
// with an error that says so, instead of panicking.
func TestHostSamplerWithoutConn(t *testing.T) {
	var conn *rdmanl.Conn // a failed Dial's
	_, err := (&HostSampler{Conn: conn}).Sample(context.Background())
	if !errors.Is(err, ErrNoConn) {
		t.Errorf("Sample without a Conn: %v, want ErrNoConn", err)
	}
}

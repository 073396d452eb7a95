package drain_test

import (
	"strings"
	"testing"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/internal/testing/texttest"
)

// A policy marshals to JSON as its String and its flag reads it back; a
// word it does not know is refused with an error that names it and every
// valid one, so that a CLI flag can pass the error on as it is.
func TestPolicyText(t *testing.T) {
	texttest.MarshalsAsString(t, drain.Quarantine, drain.DestroyWhenEmpty)
	for _, p := range []drain.Policy{drain.Quarantine, drain.DestroyWhenEmpty} {
		b, _ := p.MarshalText()
		if back := drain.Policy(200); back.UnmarshalText(b) != nil || back != p {
			t.Errorf("%v read back as %v", p, back)
		}
	}
	var p drain.Policy
	err := p.UnmarshalText([]byte("fine"))
	if err == nil {
		t.Fatal("UnmarshalText(fine) = nil, want an error")
	}
	for _, want := range []string{"fine", "quarantine", "destroy-when-empty"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

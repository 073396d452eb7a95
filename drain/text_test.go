package drain_test

import (
	"strings"
	"testing"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/internal/testing/texttest"
)

// Each enum the CLI prints marshals to JSON as its String, and the ones its
// flags read come back from their text.
func TestEnumText(t *testing.T) {
	texttest.MarshalsAsString(t,
		drain.Quarantine, drain.DestroyWhenEmpty, drain.QueueSend, drain.QueueRecv, drain.QueueUnknown,
		drain.Safe, drain.DestroyedAfterEmptyCQ, drain.Outcome(200), drain.ProofRecvDrainWR, drain.ProofNone,
		drain.MissingLastWQE, drain.MissingNothing)
	for _, o := range []drain.Outcome{drain.Pending, drain.Safe, drain.DestroyedAfterEmptyCQ, drain.Quarantined, drain.Failed} {
		b, _ := o.MarshalText()
		if back := drain.Outcome(200); back.UnmarshalText(b) != nil || back != o {
			t.Errorf("%v read back as %v", o, back)
		}
	}
	for _, p := range []drain.Policy{drain.Quarantine, drain.DestroyWhenEmpty} {
		b, _ := p.MarshalText()
		if back := drain.Policy(200); back.UnmarshalText(b) != nil || back != p {
			t.Errorf("%v read back as %v", p, back)
		}
	}
	var o drain.Outcome
	var p drain.Policy
	if o.UnmarshalText([]byte("fine")) == nil || p.UnmarshalText([]byte("fine")) == nil {
		t.Error("UnmarshalText(fine) = nil, want an error")
	}
}

// A word UnmarshalText does not know is refused with an error that names it
// and every valid one, so that a CLI flag can pass the error on as it is.
func TestEnumTextUnknown(t *testing.T) {
	var o drain.Outcome
	var p drain.Policy
	for _, tc := range []struct {
		u     interface{ UnmarshalText([]byte) error }
		names []string
	}{
		{&p, []string{"fine", "quarantine", "destroy-when-empty"}},
		{&o, []string{"fine", "pending", "safe", "destroyed after empty CQ", "quarantined", "failed"}},
	} {
		err := tc.u.UnmarshalText([]byte("fine"))
		if err == nil {
			t.Fatalf("%T: UnmarshalText(fine) = nil, want an error", tc.u)
		}
		for _, want := range tc.names {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%T: error %q does not name %q", tc.u, err, want)
			}
		}
	}
}

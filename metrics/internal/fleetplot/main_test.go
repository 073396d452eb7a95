package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const input = `start=1000 reap=5000 exporter_stopped=6000 end=9000
event 3000 RDMAQPsStuckInError pending
event 5500 RDMAQPsStuckInError 
series up{job="qpdrain"} 1000 1
series up{job="qpdrain"} 1250 1
series up{job="qpdrain"} 7000 0
`

// The input parses to seconds, a resolved event has no state, and the
// plot is a PNG.
func TestRun(t *testing.T) {
	rn, err := parse(strings.NewReader(input))
	if err != nil {
		t.Fatal(err)
	}
	if rn.start != 1 || rn.end != 9 || len(rn.events) != 2 || rn.events[1].state != "" || len(rn.series[`up{job="qpdrain"}`]) != 3 {
		t.Errorf("parsed %+v", rn)
	}
	out := filepath.Join(t.TempDir(), "fleet.png")
	if err := run(strings.NewReader(input), out); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil || !strings.HasPrefix(string(b), "\x89PNG") {
		t.Errorf("%s: %d bytes, %v: not a PNG", out, len(b), err)
	}
}

// A line that is not the test's, or no run at all, is an error.
func TestParseRefuses(t *testing.T) {
	for _, in := range []string{"hello\n", "series up 1000 1\n", input + "series up 1000 x\n"} {
		if _, err := parse(strings.NewReader(in)); err == nil {
			t.Errorf("parse(%q): no error", in)
		}
	}
}

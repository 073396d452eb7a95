package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/qpdrain/qpdrain/soft"
)

// A quirk flag takes repeats and comma-separated lists, in order, and
// refuses an unknown name, keeping what it had.
func TestQuirkFlag(t *testing.T) {
	var q softQuirks
	f := pflag.NewFlagSet("test", pflag.ContinueOnError)
	quirkFlag(f, &q, "quirk")
	if err := f.Parse([]string{"--quirk", "no-last-wqe-reached,drain-needs-rts", "--quirk", "flush-deferred"}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"no-last-wqe-reached", "drain-needs-rts", "flush-deferred"}; !slices.Equal(q.names, want) {
		t.Errorf("names %q, want %q", q.names, want)
	}
	if want := (soft.Quirks{NoLastWQEReached: true, DrainNeedsRTS: true, FlushDeferred: true}); q.quirks != want {
		t.Errorf("quirks %+v, want %+v", q.quirks, want)
	}
	if err := f.Set("quirk", "nope"); err == nil || !strings.Contains(err.Error(), `unknown quirk "nope"`) || len(q.names) != 3 {
		t.Errorf("--quirk nope: %v, names %q; want refused, the three kept", err, q.names)
	}
	if got := quirkList(q.names); got != "no-last-wqe-reached, drain-needs-rts, flush-deferred" {
		t.Errorf("quirkList = %q", got)
	}
	if got := quirkList(nil); got != "none" {
		t.Errorf("quirkList(nil) = %q, want none", got)
	}
}

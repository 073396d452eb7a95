package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"maps"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
)

// The libraries' debug lines (here the reaper's, under simulate) show at
// --log-level debug in the CLI's own format, text or JSON, with the QP
// number as "lqpn"; at the default level they do not.
func TestLibraryLogFollowsLogFlags(t *testing.T) {
	sim := []string{"simulate", "--qps", "1", "--quirk", "no-last-wqe-reached", "--timeout", "20ms"}
	_, stderr, _ := runRoot(append([]string{"--log-level", "debug"}, sim...)...)
	for _, want := range []string{`level=debug msg="drain stalled"`, "policy=quarantine", `level=debug msg="drain ended"`, "outcome=quarantined", "lqpn="} {
		if !strings.Contains(stderr, want) {
			t.Errorf("--log-level debug: stderr %q, want %q", stderr, want)
		}
	}
	if _, stderr, _ := runRoot(sim...); stderr != "" {
		t.Errorf("default level: stderr %q, want nothing", stderr)
	}
	_, stderr, _ = runRoot(append([]string{"--log-level", "debug", "--log-format", "json"}, sim...)...)
	var rec map[string]any
	if err := json.Unmarshal([]byte(strings.SplitN(stderr, "\n", 2)[0]), &rec); err != nil ||
		rec["level"] != "debug" || rec["msg"] != "drain stalled" || rec["lqpn"] == nil {
		t.Errorf("--log-format json: stderr %q (%v), want a JSON debug line of the stall with its lqpn", stderr, err)
	}
}

// Attributes bound with With reach every entry as fields, those under a
// group as "group.key"; a record below the CLI's level is not written.
func TestLogrusHandlerFields(t *testing.T) {
	var buf bytes.Buffer
	g := &globalOptions{log: newLogger(&buf, logrus.InfoLevel, "json")}
	l := g.libLog().With("dev", "soft0").WithGroup("cq").With("cqn", 3)
	l.Debug("below the level")
	l.Info("polled", slog.Group("wc", "status", "flush"), "n", 2, slog.Attr{})
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("%q: %v", buf.String(), err)
	}
	delete(got, "time")
	want := map[string]any{"level": "info", "msg": "polled", "dev": "soft0", "cq.cqn": 3.0, "cq.wc.status": "flush", "cq.n": 2.0}
	if !maps.Equal(got, want) {
		t.Errorf("entry %v, want %v", got, want)
	}
}

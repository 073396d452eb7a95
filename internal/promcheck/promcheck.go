// Package promcheck runs Prometheus's own linter, `promtool check metrics`
// (Debian's prometheus package; scripts/deps.sh installs it), on metrics a
// test produced. Without promtool a test skips, saying so, except in CI
// (CI=true), where the check is required and its absence fails the test.
package promcheck

import (
	"bytes"
	"os"
	"os/exec"
	"testing"
)

// Check fails t unless promtool finds the Prometheus text exposition in
// text clean.
func Check(t testing.TB, text []byte) {
	t.Helper()
	tool, err := exec.LookPath("promtool")
	if err != nil {
		switch os.Getenv("CI") {
		case "true", "1", "yes":
			t.Fatalf("promtool is required in CI (CI=%s) but missing: %v (scripts/deps.sh installs package prometheus)", os.Getenv("CI"), err)
		}
		t.Skipf("promtool missing (%v): the metrics were NOT checked; scripts/deps.sh installs package prometheus", err)
	}
	cmd := exec.Command(tool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(text)
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("promtool check metrics: %v\n%s\non:\n%s", err, out, text)
	}
}

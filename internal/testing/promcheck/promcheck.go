// Package promcheck runs Prometheus's own linter, `promtool check metrics`
// (Debian's prometheus package; scripts/deps.sh installs it), on metrics a
// test produced, and promtool's checks and unit tests of alert rules. Without promtool a test skips, saying so, except in CI
// (CI=true), where the check is required and its absence fails the test.
package promcheck

import (
	"bytes"
	"os"
	"os/exec"
	"testing"
)

// promtool finds promtool, failing t in CI and skipping it elsewhere when
// it is missing.
func promtool(t testing.TB) string {
	t.Helper()
	tool, err := exec.LookPath("promtool")
	if err != nil {
		switch os.Getenv("CI") {
		case "true", "1", "yes":
			t.Fatalf("promtool is required in CI (CI=%s) but missing: %v (scripts/deps.sh installs package prometheus)", os.Getenv("CI"), err)
		}
		t.Skipf("promtool missing (%v): NOT checked; scripts/deps.sh installs package prometheus", err)
	}
	return tool
}

// Check fails t unless promtool finds the Prometheus text exposition in
// text clean.
func Check(t testing.TB, text []byte) {
	t.Helper()
	cmd := exec.Command(promtool(t), "check", "metrics")
	cmd.Stdin = bytes.NewReader(text)
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("promtool check metrics: %v\n%s\non:\n%s", err, out, text)
	}
}

// CheckRules fails t unless `promtool check rules` accepts the rule file
// at path.
func CheckRules(t testing.TB, path string) {
	t.Helper()
	out, err := exec.Command(promtool(t), "check", "rules", path).CombinedOutput()
	if err != nil {
		t.Errorf("promtool check rules %s: %v\n%s", path, err, out)
	}
}

// TestRules fails t unless `promtool test rules` passes the rule unit
// tests at path.
func TestRules(t testing.TB, path string) {
	t.Helper()
	out, err := exec.Command(promtool(t), "test", "rules", path).CombinedOutput()
	if err != nil {
		t.Errorf("promtool test rules %s: %v\n%s", path, err, out)
	}
}

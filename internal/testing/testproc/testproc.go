// Package testproc starts the stand-in processes tests point a tool at: a
// real pid, not the test's own, whose life the test owns.
package testproc

import (
	"os/exec"
	"testing"
)

// Idle starts a process that does nothing (sleep(1), bounded at ten
// minutes) and returns its pid; it is killed and reaped when t ends. A
// failure to start it fails t.
func Idle(t testing.TB) int {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting a process: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd.Process.Pid
}

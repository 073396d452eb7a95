//go:build unix

package vm

import (
	"os/exec"
	"syscall"
)

// inProcessGroup runs cmd (the driver and its qemu) in its own process
// group, so that a cancelled context stops all of them.
func inProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
}

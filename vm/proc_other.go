//go:build !unix

package vm

import (
	"context"
	"fmt"
	"io"
	"os/exec"
)

// inProcessGroup: without Unix process groups the context kills the driver only.
func inProcessGroup(*exec.Cmd) {}

// lockCache: qpdrain vm runs bash, qemu and Debian's tools, so it needs a
// Linux host; elsewhere every run stops here.
func lockCache(context.Context, string, io.Writer) (func(), error) {
	return nil, fmt.Errorf("%w: qpdrain vm needs a Linux host", ErrCannotRun)
}

// Command qpdrain tears down RDMA queue pairs correctly and finds the ones that
// were never torn down. Run "qpdrain help" for its subcommands.
//
// Exit codes: 0 clean, 1 findings, 2 error, 3 not supported on this machine.
package main

import (
	"errors"
	"fmt"
	"os"
)

// Exit codes an operator can script against.
const (
	exitClean       = 0
	exitFindings    = 1
	exitError       = 2
	exitUnsupported = 3
)

// exitCodeError carries a specific exit code out of a subcommand.
type exitCodeError struct {
	code int
	err  error
}

func (e *exitCodeError) Error() string { return e.err.Error() }
func (e *exitCodeError) Unwrap() error { return e.err }

// withExitCode attaches an exit code to err.
func withExitCode(code int, err error) error { return &exitCodeError{code: code, err: err} }

func main() {
	cmd := newRootCmd(os.Stdout, os.Stderr)
	err := cmd.Execute()
	if err == nil {
		os.Exit(exitClean)
	}
	code := exitError
	var ec *exitCodeError
	if errors.As(err, &ec) {
		code = ec.code
	}
	if code != exitFindings {
		fmt.Fprintln(os.Stderr, "qpdrain:", err)
	}
	os.Exit(code)
}

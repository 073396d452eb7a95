// Command qpdrain tears down RDMA queue pairs correctly and finds the ones that
// were never torn down. Run "qpdrain help" for its subcommands.
//
// Exit codes, the same for every subcommand (contract.go): 0 clean, 1
// findings, 2 error or bad input, 3 the device (or RDMA) is not here, 4 a
// verbs call hung (check), 130 interrupted.
package main

import (
	"os"
	"os/signal"
	"syscall"

	// The libibverbs binding: ibv.Open and ibv.Devices reach real devices.
	_ "github.com/qpdrain/qpdrain/libibverbs"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	os.Exit(execute(os.Args[1:], os.Stdout, os.Stderr, sig))
}

package flushcheck_test

import (
	"context"
	"fmt"
	"time"

	"github.com/qpdrain/qpdrain/drain"
	"github.com/qpdrain/qpdrain/flushcheck"
	"github.com/qpdrain/qpdrain/soft"
)

// Run the check once at start-up and drain with what it found: here on a
// soft device that, like rxe on Linux 6.1, never flushes a receive posted
// in ERROR, so QPs with their own receive queue are drained by counting
// their receives instead of with a receive drain WR.
func ExampleSettings() {
	dev, err := soft.Open(soft.Config{Quirks: soft.Quirks{RecvInErrorNotFlushed: true}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dev.Close()
	results := flushcheck.Run(context.Background(), dev, flushcheck.Options{Timeout: flushcheck.MinTimeout, Quiet: 20 * time.Millisecond})
	rec := flushcheck.Settings(results)
	fmt.Println("policy:", rec.Options.Policy, "max batch:", rec.Options.MaxBatch, "count receives:", rec.CountRecvs)
	for _, s := range rec.Settings[:1] {
		fmt.Printf("%s = %s\n", s.Name, s.Value)
	}
	// Each QP is then added as:
	_ = drain.AddOptions{CountRecvs: rec.CountRecvs, Recvs: 2}
	// Output:
	// policy: quarantine max batch: 0 count receives: true
	// receive drain WR = no: CountRecvs
}

// Run the whole check on a soft device that never raises Last WQE Reached,
// on the device's own clock: its five-second waits for the Last WQE
// Reached that never comes take no real time.
func ExampleRun() {
	dev, err := soft.Open(soft.Config{Quirks: soft.Quirks{NoLastWQEReached: true}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dev.Close()
	for _, r := range flushcheck.Run(context.Background(), dev, flushcheck.Options{Clock: dev.Fabric()}) {
		if r.Outcome != flushcheck.Pass {
			fmt.Println(r.Name, r.Outcome)
		}
	}
	// Output:
	// last-wqe-reached deviation
	// last-wqe-repeat deviation
}

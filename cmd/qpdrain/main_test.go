package main

import (
	"testing"

	"github.com/qpdrain/qpdrain/internal/testing/testmain"
)

// TestMain fails the run if a test leaks a verbs object or a goroutine. A
// test binary started with QPDRAIN_QPS_HELPER set is a helper process of
// the host-view tests instead (qps_rxe_linux_test.go).
func TestMain(m *testing.M) {
	runHelper()
	testmain.Run(m)
}

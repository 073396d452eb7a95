package report_test

import (
	"testing"
	"unsafe"

	"github.com/qpdrain/qpdrain/drain/report"
)

// Every report a batch's drain returns holds a usual drain's six to eight
// Steps, decoded from the handle's packed log: their bytes are most of
// what a report costs, so a Step stays within one cache line.
func TestStepSize(t *testing.T) {
	if n := unsafe.Sizeof(report.Step{}); n > 64 {
		t.Errorf("a Step takes %d bytes, more than 64", n)
	}
}

package rdmanl

import (
	"testing"

	"github.com/qpdrain/qpdrain/internal/testing/texttest"
)

// The enums the CLI's -j prints marshal as the words rdma prints.
func TestEnumsMarshalAsWords(t *testing.T) {
	texttest.MarshalsAsString(t, QPType(2), QPState(6), PathMigState(0), PortState(4))
}

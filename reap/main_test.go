package reap

import (
	"testing"

	"github.com/qpdrain/qpdrain/internal/testing/testmain"
)

// TestMain fails the run if a test leaks a goroutine.
func TestMain(m *testing.M) { testmain.Run(m) }

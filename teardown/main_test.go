package teardown_test

import (
	"testing"

	"github.com/qpdrain/qpdrain/internal/testing/testmain"
)

// TestMain fails the run if an example or test leaks a verbs object or a
// goroutine.
func TestMain(m *testing.M) { testmain.Run(m) }

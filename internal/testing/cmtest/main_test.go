package cmtest

import (
	"testing"

	"github.com/qpdrain/qpdrain/internal/testing/testmain"
)

func TestMain(m *testing.M) { testmain.Run(m) }

//go:build linux && cgo

package libibverbs

import (
	"testing"

	"github.com/qpdrain/qpdrain/internal/testmain"
)

func TestMain(m *testing.M) { testmain.Run(m) }

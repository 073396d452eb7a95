// Package testmain runs a package's tests with leak checks: the run fails if a
// goroutine outlives the tests or a verbs object was never closed, naming the
// object and where it was created.
package testmain

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/qpdrain/qpdrain/ibv/objtrace"
)

// Run is a TestMain body: func TestMain(m *testing.M) { testmain.Run(m) }.
func Run(m *testing.M) {
	objtrace.Enable()
	code := m.Run()
	if code == 0 {
		if leaked := objtrace.Live(); len(leaked) > 0 {
			fmt.Fprintf(os.Stderr, "testmain: %d verbs objects were never closed:\n", len(leaked))
			for _, l := range leaked {
				fmt.Fprint(os.Stderr, l)
			}
			code = 1
		}
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "testmain: goroutines leaked: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

package cm

import (
	"fmt"
	"strings"

	"github.com/qpdrain/qpdrain/ibv"
)

// LoadError reports that librdmacm could not be loaded at run time: the
// library is missing (Symbol empty), or it lacks an entry point the
// binding calls. It matches ibv.ErrNotSupported: the librdmacm
// implementation is not available here, and the soft one is.
type LoadError struct {
	Library string // "librdmacm.so.1"
	Symbol  string // the missing entry point with its version, "rdma_create_id@RDMACM_1.0"
	Reason  string // the dynamic loader's message (dlerror)
}

// Error says what is missing and which Debian package provides it.
func (e *LoadError) Error() string {
	if e.Symbol != "" {
		return fmt.Sprintf("librdmacm is too old: %s lacks %s (%s); install a newer librdmacm1", e.Library, e.Symbol, e.Reason)
	}
	what := "librdmacm is not installed"
	if !strings.Contains(e.Reason, "No such file or directory") {
		what = "librdmacm cannot be loaded"
	}
	return fmt.Sprintf("%s: %s (install Debian's librdmacm1)", what, e.Reason)
}

// Unwrap returns ibv.ErrNotSupported.
func (e *LoadError) Unwrap() error { return ibv.ErrNotSupported }

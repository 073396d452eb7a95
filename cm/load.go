package cm

import (
	"github.com/qpdrain/qpdrain/ibv"
)

// LoadError reports that librdmacm could not be loaded at run time: the
// library is missing, or it lacks an entry point the binding calls. It is
// ibv's, which matches ibv.ErrNotSupported: the librdmacm implementation is
// not available here, and the soft one is.
type LoadError = ibv.LoadError

//go:build linux && cgo

package libibverbs

/*
#include <stdlib.h>
#include "verbs_linux.h"
*/
import "C"

import (
	"sync"
	"unsafe"

	"github.com/qpdrain/qpdrain/ibv"
)

// libibverbs is the library's soname, as a program linked against it
// records it (DT_NEEDED), so dlopen finds the same file the loader would.
const libibverbs = "libibverbs.so.1"

// load opens libibverbs and resolves every entry point the binding calls,
// once per process; concurrent callers wait for the first and share its
// result. Devices and Open call it; every other object comes from Open, so
// nothing else needs to. The fast paths (post, poll, arm) are libibverbs's
// static inline functions over the provider's ops and never go through it.
var load = sync.OnceValue(func() error { return loadFrom(libibverbs) })

// loadFrom opens lib as libibverbs. Only load calls it outside tests: the
// C side keeps its error text in one static buffer.
func loadFrom(lib string) error {
	clib := C.CString(lib)
	defer C.free(unsafe.Pointer(clib))
	var what, why *C.char
	if C.qpd_load(clib, &what, &why) != 0 {
		e := &ibv.LoadError{Name: "libibverbs", Package: "libibverbs1 and, for device drivers, ibverbs-providers", Library: lib, Reason: C.GoString(why)}
		if w := C.GoString(what); w != lib {
			e.Symbol = w
		}
		return e
	}
	return nil
}

// Load opens libibverbs.so.1 at run time, once, and resolves the entry
// points the binding calls. It returns nil when the libibverbs
// implementation can be used, or a *LoadError matching ErrNotSupported that
// names what is missing and what to install. Devices and Open call it
// themselves; callers use it to say why they fall back to the soft device.
func Load() error { return load() }

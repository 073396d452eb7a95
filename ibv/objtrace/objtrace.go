// Package objtrace records where verbs objects were created so a test run can
// fail with the creation stack of every object never closed. Both device
// implementations call Track on create and Release on close. Until Enable is
// called (internal/testing/testmain does it) tracking costs a call, an atomic load
// and the boxing of Track's arguments, never the formatting: Track formats
// its description only when it records, so callers pass the format and its
// arguments, never a string built first.
package objtrace

import (
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

var (
	enabled atomic.Bool
	mu      sync.Mutex
	live    = map[*Record]struct{}{}
)

// Record is one tracked object.
type Record struct {
	desc  string
	stack []uintptr
}

// Enable turns tracking on for objects created from now on.
func Enable() { enabled.Store(true) }

// Track records an object described by format and args, as fmt.Sprintf
// formats them ("soft QP %d on %s"), and where it was created. While
// tracking is off it formats nothing and returns nil; Release accepts nil.
func Track(format string, args ...any) *Record {
	if !enabled.Load() {
		return nil
	}
	pcs := make([]uintptr, 32)
	n := runtime.Callers(2, pcs)
	r := &Record{desc: fmt.Sprintf(format, args...), stack: pcs[:n]}
	mu.Lock()
	live[r] = struct{}{}
	mu.Unlock()
	return r
}

// Release marks the object closed. Releasing twice or releasing nil is harmless.
func (r *Record) Release() {
	if r == nil {
		return
	}
	mu.Lock()
	delete(live, r)
	mu.Unlock()
}

// Live describes every object not yet released, each with its creation stack.
func Live() []string {
	mu.Lock()
	defer mu.Unlock()
	out := make([]string, 0, len(live))
	for r := range live {
		var b strings.Builder
		fmt.Fprintf(&b, "%s never closed; created at:\n", r.desc)
		frames := runtime.CallersFrames(r.stack)
		for {
			f, more := frames.Next()
			fmt.Fprintf(&b, "\t%s\n\t\t%s:%d\n", f.Function, f.File, f.Line)
			if !more {
				break
			}
		}
		out = append(out, b.String())
	}
	sort.Strings(out)
	return out
}

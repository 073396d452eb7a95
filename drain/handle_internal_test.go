package drain

import (
	"testing"
	"unsafe"
)

// The handle of every QP is read in each pass over a batch (Handle), so
// its size is what a drain costs per QP outside the cache: a field that
// only some drains need belongs in handleExt.
func TestHandleSize(t *testing.T) {
	if n := unsafe.Sizeof(Handle{}); n > 280 {
		t.Errorf("a Handle takes %d bytes, more than 280: move what only some drains need to handleExt", n)
	}
}

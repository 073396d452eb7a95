package objtrace

import (
	"strings"
	"testing"
)

func TestTrackRelease(t *testing.T) {
	if r := Track("before enable"); r != nil {
		t.Fatalf("Track before Enable = %v, want nil", r)
	}
	Enable()
	// Enable is for good in a process; the next run (-count) starts before it again.
	t.Cleanup(func() { enabled.Store(false) })
	a := Track("object a")
	b := Track("object b")
	a.Release()
	a.Release() // double release is harmless
	got := Live()
	if len(got) != 1 || !strings.HasPrefix(got[0], "object b never closed") || !strings.Contains(got[0], "TestTrackRelease") {
		t.Fatalf("Live() = %q, want only object b with its creation stack", got)
	}
	b.Release()
	if got := Live(); len(got) != 0 {
		t.Fatalf("Live() after release = %q, want none", got)
	}
	var nilRecord *Record
	nilRecord.Release()
}

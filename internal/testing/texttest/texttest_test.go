package texttest

import (
	"fmt"
	"testing"
)

type good int

func (g good) String() string               { return fmt.Sprint("good", int(g)) }
func (g good) MarshalText() ([]byte, error) { return []byte(g.String()), nil }

type bad int

func (bad) String() string               { return "bad" }
func (bad) MarshalText() ([]byte, error) { return []byte("other"), nil }

// recorder counts the failures MarshalsAsString reports.
type recorder struct {
	testing.TB
	errors int
}

func (r *recorder) Helper()               {}
func (r *recorder) Errorf(string, ...any) { r.errors++ }

// MarshalsAsString passes enums whose text is their String and reports
// each one whose text is not.
func TestMarshalsAsString(t *testing.T) {
	r := &recorder{TB: t}
	MarshalsAsString(r, good(1), bad(0), good(2), bad(1))
	if r.errors != 2 {
		t.Errorf("%d failures reported, want 2 (the two bad values)", r.errors)
	}
}

// Package texttest checks the text forms of enums, for the packages whose
// enums the CLI's -j prints: each value marshals, in JSON too, as the name
// its String gives.
package texttest

import (
	"encoding"
	"encoding/json"
	"fmt"
	"testing"
)

// Enum is a value with a name and a text form.
type Enum interface {
	fmt.Stringer
	encoding.TextMarshaler
}

// MarshalsAsString fails t for each of values whose JSON encoding is not
// its String as a JSON string, or whose MarshalText fails.
func MarshalsAsString(t testing.TB, values ...Enum) {
	t.Helper()
	for _, v := range values {
		got, err := json.Marshal(v)
		if want, _ := json.Marshal(v.String()); err != nil || string(got) != string(want) {
			t.Errorf("json.Marshal(%T %v) = %s, %v; want %s", v, v, got, err, want)
		}
	}
}

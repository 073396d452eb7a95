package rdmanl

import (
	"encoding"
	"encoding/json"
	"testing"
)

// The enums the CLI's -j prints marshal as the words rdma prints.
func TestEnumsMarshalAsWords(t *testing.T) {
	for _, v := range []interface {
		encoding.TextMarshaler
		String() string
	}{QPType(2), QPState(6), PathMigState(0), PortState(4)} {
		got, err := json.Marshal(v)
		if want, _ := json.Marshal(v.String()); err != nil || string(got) != string(want) {
			t.Errorf("json.Marshal(%T %v) = %s, %v; want %s", v, v, got, err, want)
		}
	}
}

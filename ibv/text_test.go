package ibv

import (
	"encoding"
	"encoding/json"
	"testing"
)

// Every enum the CLI prints marshals to JSON as its String.
func TestEnumsMarshalAsNames(t *testing.T) {
	for _, v := range []interface {
		encoding.TextMarshaler
		String() string
	}{QPSErr, QPTRC, WCWRFlushErr, EventQPLastWQEReached, PortActive, LinkLayerEthernet, NodeCA, TransportIB, GIDTypeRoCEv2} {
		got, err := json.Marshal(v)
		if want, _ := json.Marshal(v.String()); err != nil || string(got) != string(want) {
			t.Errorf("json.Marshal(%T %v) = %s, %v; want %s", v, v, got, err, want)
		}
	}
}

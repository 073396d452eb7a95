package ibv

import (
	"testing"

	"github.com/qpdrain/qpdrain/internal/testing/texttest"
)

// Every enum the CLI prints marshals to JSON as its String.
func TestEnumsMarshalAsNames(t *testing.T) {
	texttest.MarshalsAsString(t, QPSErr, QPTRC, WCWRFlushErr, EventQPLastWQEReached, PortActive, LinkLayerEthernet,
		NodeCA, TransportIB, GIDTypeRoCEv2, QPType(7), NodeUnknown)
}

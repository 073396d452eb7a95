package rdmanl

import (
	"testing"

	"github.com/mdlayher/netlink"
)

// FuzzDecode feeds arbitrary attribute bytes to every decoder: each must
// return values or an error, never panic or loop.
func FuzzDecode(f *testing.F) {
	f.Add(qpMessage(f, 1, "rxe0", qpEntry(func(e *netlink.AttributeEncoder) {
		e.Uint32(attrPortIndex, 1)
		e.Uint32(attrResLQPN, 17)
		e.Uint8(attrResType, 2)
		e.Uint8(attrResState, 3)
		e.Uint32(attrResPID, 99)
	})))
	for _, rec := range loadRecordings(f) {
		for _, m := range rec.msgs {
			f.Add(m.Data)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = appendQPs(nil, b)
		_, _ = appendPDs(nil, b)
		_, _ = appendCtxs(nil, b)
		_, _ = decodeDevice(b)
		_, _ = decodePort(b)
		_, _ = decodeSummary(b)
		_, _ = decodeChardev(b)
	})
}

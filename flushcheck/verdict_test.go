package flushcheck

import (
	"testing"

	"github.com/qpdrain/qpdrain/ibv"
)

// The flush verdict needs each WR back, in order, on its QP, with
// WR_FLUSH_ERR: a WR that completed with another status (SUCCESS, or an
// error of its own) was not flushed.
func TestCheckFlushed(t *testing.T) {
	const qpn = 17
	flushed := func(id uint64) ibv.WC { return ibv.WC{ID: id, Status: ibv.WCWRFlushErr, QPNum: qpn} }
	for _, tc := range []struct {
		name string
		got  []ibv.WC
		ok   bool
	}{
		{"all flushed in order", []ibv.WC{flushed(1), flushed(2)}, true},
		{"one succeeded", []ibv.WC{flushed(1), {ID: 2, Status: ibv.WCSuccess, QPNum: qpn}}, false},
		{"one failed otherwise", []ibv.WC{{ID: 1, Status: ibv.WCRetryExcErr, QPNum: qpn}, flushed(2)}, false},
		{"out of order", []ibv.WC{flushed(2), flushed(1)}, false},
		{"another QP's", []ibv.WC{flushed(1), {ID: 2, Status: ibv.WCWRFlushErr, QPNum: qpn + 1}}, false},
		{"one missing", []ibv.WC{flushed(1)}, false},
	} {
		ok, why := checkFlushed("sends", []uint64{1, 2}, tc.got, qpn)
		if ok != tc.ok || ok != (why == "") {
			t.Errorf("%s: verdict %v (%q), want %v", tc.name, ok, why, tc.ok)
		}
	}
}

package trace

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// encode builds a binary record as shim.c's emit writes it: kind, time
// (TSC when tsc), pid, tid, then the values of keys, one string at most.
func encode(t *testing.T, kind string, time uint64, tsc bool, pid, tid uint32, kv ...any) []byte {
	t.Helper()
	k := slices.Index(recKinds, kind)
	if k < 0 {
		t.Fatalf("no kind %q in shim.c", kind)
	}
	var keys [16]byte
	var vals []uint64
	var str []byte
	for i := 0; i < len(kv); i += 2 {
		key := slices.Index(recKeys, kv[i].(string))
		if key < 0 {
			t.Fatalf("no key %q in shim.c", kv[i])
		}
		keys[len(vals)] = byte(key)
		switch v := kv[i+1].(type) {
		case string:
			str = []byte(v)
			vals = append(vals, uint64(len(v)))
		case int:
			vals = append(vals, uint64(v))
		case uint64:
			vals = append(vals, v)
		}
	}
	words := recHead + len(vals) + (len(str)+7)/8
	w := make([]uint64, words)
	w[0] = recMark | uint64(k)<<8 | uint64(words)<<16 | uint64(len(vals))<<24 | uint64(tid)<<32
	w[1] = time
	w[2] = uint64(pid) | uint64(len(str))<<40
	if tsc {
		w[2] |= recTSC
	}
	w[3], w[4] = binary.NativeEndian.Uint64(keys[:8]), binary.NativeEndian.Uint64(keys[8:])
	copy(w[recHead:], vals)
	x := w[1] ^ w[3] ^ w[4]
	for _, v := range vals {
		x ^= v
	}
	x ^= x >> 32
	x ^= x >> 16
	x ^= x >> 8
	w[2] |= (x & 0xff) << 56
	b := make([]byte, 0, 8*words)
	for _, v := range w[:recHead+len(vals)] {
		b = binary.NativeEndian.AppendUint64(b, v)
	}
	b = append(b, str...)
	return append(b, make([]byte, 8*words-len(b))...)
}

// recordFile writes a record file holding data, lost records counted in
// its header, and opens it for reading.
func recordFile(t *testing.T, data []byte, lost int) *recordReader {
	t.Helper()
	hdr := make([]byte, recData)
	copy(hdr, recMagic)
	binary.NativeEndian.PutUint64(hdr[8:], uint64(recData+len(data)+100))
	binary.NativeEndian.PutUint64(hdr[16:], uint64(len(data)))
	binary.NativeEndian.PutUint64(hdr[24:], uint64(lost))
	path := filepath.Join(t.TempDir(), "records")
	if err := os.WriteFile(path, append(hdr, data...), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	rr, err := openRecords(f)
	if err != nil {
		t.Fatal(err)
	}
	return rr
}

// TestRecordReader: what processes killed mid-copy leave (a reservation
// partly or never written) is skipped and counted, with the records that
// did not fit; the records around it are read, as text Parse reads.
func TestRecordReader(t *testing.T) {
	exit := func(ns uint64) []byte { return encode(t, "exit", ns, false, 1, 1) }
	cut := encode(t, "send", 2, false, 2, 2, "qp", 0x31, "wr", 7, "op", 2, "sig", 1)
	clear(cut[:8]) // the header is stored last: killed before it
	var data []byte
	data = append(data, exit(1)...)
	data = append(data, cut...)
	data = append(data, exit(3)...)
	data = append(data, make([]byte, 24)...) // a reservation never written
	data = append(data, exit(4)...)
	odd := encode(t, "exit", 5, false, 1, 1)
	odd[len(odd)-1] ^= 1 // a header whose check fails: not a record
	data = append(data, odd...)
	data = append(data, encode(t, "open", 6, false, 9, 10, "ctx", 0x10, "dev", "rx e=0\xff", "traced", 1)...)
	data = append(data, encode(t, "exit", 7, false, 3, 3)[8:]...) // the last copy cut short
	rr := recordFile(t, data, 2)                                  // 2 that did not fit
	recs, err := Parse(rr)
	if err != nil {
		t.Fatal(err)
	}
	var ts []int64
	for _, r := range recs {
		ts = append(ts, r.T)
	}
	if !slices.Equal(ts, []int64{1, 3, 4, 6}) || rr.lost != 6 {
		t.Errorf("records at %v, %d lost; want at [1 3 4 6], 6 lost", ts, rr.lost)
	}
	if o := recs[3]; o.Kind != "open" || o.PID != 9 || o.TID != 10 || o.Uint("ctx") != 0x10 || o.Str("ctx") != "0x10" || o.Str("dev") != "rx_e_0_" || o.Uint("traced") != 1 {
		t.Errorf("open record decoded as %+v", o)
	}
	other, err := os.Open(filepath.Join("testdata", "progs", "clean.c"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := openRecords(other); err == nil {
		t.Error("a file without the header was read as records")
	}
}

// TestRecordClock: TSC times become CLOCK_MONOTONIC nanoseconds on the line
// through the first and last pair the cold records carry; the "clock"
// records that only carry a pair, and the ns field, are not passed on.
func TestRecordClock(t *testing.T) {
	// a 3 GHz TSC: tick 3e9 is 5 s of CLOCK_MONOTONIC, tick 6e9 is 6 s
	var data []byte
	data = append(data, encode(t, "start", 3_000_000_000, true, 1, 1, "ns", 5_000_000_000)...)
	data = append(data, encode(t, "send", 3_000_300_000, true, 1, 1, "qp", 0x31, "wr", 1, "op", 0, "sig", 1)...)
	data = append(data, encode(t, "clock", 4_500_000_000, true, 1, 1, "ns", 5_500_000_000)...)
	data = append(data, encode(t, "exit", 6_000_000_000, true, 1, 1, "ns", 6_000_000_000)...)
	rr := recordFile(t, data, 0)
	recs, err := Parse(rr)
	if err != nil {
		t.Fatal(err)
	}
	var ts []int64
	for _, r := range recs {
		ts = append(ts, r.T)
		if r.Has("ns") {
			t.Errorf("%s record passed on with ns", r.Kind)
		}
	}
	if !slices.Equal(ts, []int64{5_000_000_000, 5_000_100_000, 6_000_000_000}) || rr.lost != 0 {
		t.Errorf("times %v (%d lost), want [5e9 5.0001e9 6e9]", ts, rr.lost)
	}
	// without the TSC, a post's coarse tick older than the record before
	// it is placed at that record's time
	data = append(encode(t, "mod", 10_000, false, 1, 1, "qp", 0x31, "state", 6, "ret", 0),
		encode(t, "recv", 7_000, false, 1, 1, "qp", 0x31, "wr", 1)...)
	data = append(data, encode(t, "exit", 12_000, false, 1, 1)...)
	if recs, err = Parse(recordFile(t, data, 0)); err != nil {
		t.Fatal(err)
	}
	ts = ts[:0]
	for _, r := range recs {
		ts = append(ts, r.T)
	}
	if !slices.Equal(ts, []int64{10_000, 10_000, 12_000}) {
		t.Errorf("times %v, want [10000 10000 12000]", ts)
	}
}

// TestShimTables: every key the analysis requires is one the shim writes.
func TestShimTables(t *testing.T) {
	if len(recKinds) < 20 || len(recKeys) != len(recKeyFmt) {
		t.Fatalf("kinds %v, keys %v, formats %v", recKinds, recKeys, recKeyFmt)
	}
	for kind, keys := range required {
		if !slices.Contains(recKinds, kind) {
			t.Errorf("the shim writes no %q record", kind)
		}
		for _, k := range keys {
			if !slices.Contains(recKeys, k) {
				t.Errorf("the shim writes no %q key", k)
			}
		}
	}
}

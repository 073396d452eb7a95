package trace

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// TestRecordReader: what processes killed mid-copy leave (a reservation
// partly or never written) is skipped and counted, with the records that
// did not fit; the records around it are read.
func TestRecordReader(t *testing.T) {
	data := "exit t=0x1 pid=1 tid=1\n" +
		"send t=0x2 pid=2 ti\x00\x00\x00\x00" + "exit t=0x3 pid=1 tid=1\n" + // a copy cut short
		"\x00\x00\x00\x00\x00\x00\x00\x00" + "exit t=0x4 pid=1 tid=1\n" + // a reservation never written
		"exit t=0x5 pid=3" // the last copy cut short
	size := int64(recData + len(data) + 100)
	hdr := make([]byte, recData)
	copy(hdr, recMagic)
	binary.NativeEndian.PutUint64(hdr[8:], uint64(size))
	binary.NativeEndian.PutUint64(hdr[16:], uint64(len(data)))
	binary.NativeEndian.PutUint64(hdr[24:], 2) // 2 that did not fit
	path := filepath.Join(t.TempDir(), "records")
	if err := os.WriteFile(path, append(hdr, data...), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rr, err := openRecords(f)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := Parse(rr)
	if err != nil {
		t.Fatal(err)
	}
	var ts []int64
	for _, r := range recs {
		ts = append(ts, r.T)
	}
	if len(ts) != 3 || ts[0] != 1 || ts[1] != 3 || ts[2] != 4 || rr.lost != 5 {
		t.Errorf("records at %v, %d lost; want at [1 3 4], 5 lost", ts, rr.lost)
	}
	if _, err := openRecords(f); err != nil {
		t.Errorf("reopened: %v", err)
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

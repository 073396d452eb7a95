package trace

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// The record file the shim maps shared (shim.c's struct rec_header): a
// header page, then the records, whose bytes each process reserves with an
// atomic add on the header's next.
const (
	recMagic = "QPDTRC01"
	recData  = 4096
)

// recSizes are the sizes tried for the record file, largest first: its
// blocks are allocated before the program starts, since a store to a
// shared mapping of a file the file system cannot extend kills the program
// (SIGBUS). Records that do not fit are counted as lost.
var recSizes = []int64{128 << 20, 32 << 20, 8 << 20}

// newRecordFile creates the record file: its header, its blocks allocated.
func newRecordFile() (*os.File, error) {
	// tmpfs when there is one: a page of a disk file system costs more to
	// fault in
	dir := ""
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		dir = "/dev/shm"
	}
	f, err := os.CreateTemp(dir, "qpdrain-trace-*.records")
	if err != nil && dir != "" {
		f, err = os.CreateTemp("", "qpdrain-trace-*.records")
	}
	if err != nil {
		return nil, err
	}
	for _, size := range recSizes {
		if err = allocate(f, size); err != nil {
			continue
		}
		hdr := make([]byte, 32)
		copy(hdr, recMagic)
		binary.NativeEndian.PutUint64(hdr[8:], uint64(size))
		if _, err = f.WriteAt(hdr, 0); err == nil {
			return f, nil
		}
	}
	f.Close()
	os.Remove(f.Name())
	return nil, fmt.Errorf("allocating %s: %w", f.Name(), err)
}

// errNotRecordFile: the file has no header the shim wrote.
var errNotRecordFile = errors.New("not a trace record file")

// recordReader gives the text records of a record file: the bytes the
// processes reserved, without what a process killed while it copied a
// record left (a reservation partly or never written, zeros after it),
// counted in lost with the records that did not fit.
type recordReader struct {
	br      *bufio.Reader
	pending []byte
	lost    int
}

func openRecords(f *os.File) (*recordReader, error) {
	hdr := make([]byte, 32)
	if _, err := f.ReadAt(hdr, 0); err != nil || string(hdr[:8]) != recMagic {
		return nil, fmt.Errorf("%s: %w", f.Name(), errNotRecordFile)
	}
	size := int64(binary.NativeEndian.Uint64(hdr[8:]))
	next := int64(binary.NativeEndian.Uint64(hdr[16:]))
	lost := int(binary.NativeEndian.Uint64(hdr[24:]))
	next = min(next, size-recData)
	return &recordReader{br: bufio.NewReaderSize(io.NewSectionReader(f, recData, next), 1<<16), lost: lost}, nil
}

func (r *recordReader) Read(p []byte) (int, error) {
	for len(r.pending) == 0 {
		line, err := r.br.ReadBytes('\n')
		if err == io.EOF {
			if len(bytes.Trim(line, "\x00")) > 0 {
				r.lost++ // a record cut short at the end
			}
			return 0, io.EOF
		}
		if err != nil {
			return 0, err
		}
		if i := bytes.LastIndexByte(line, 0); i >= 0 {
			r.lost++ // at least one reservation not (wholly) written
			line = line[i+1:]
		}
		if len(line) > 1 {
			r.pending = line
		}
	}
	n := copy(p, r.pending)
	r.pending = r.pending[n:]
	return n, nil
}

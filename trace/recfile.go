package trace

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
)

// The record file the shim maps shared (shim.c's struct rec_header): a
// header page, then the binary records, whose bytes each process reserves
// with an atomic add on the header's next.
const (
	recMagic = "QPDTRC02"
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

// The binary record's layout (shim.c's struct rec).
const (
	recMark    = 0xb5
	recHead    = 5  // words before the values
	recMaxVals = 16 // values a record holds at most
	recTSC     = 1 << 32
)

// recKinds and recKeys are the shim's tables of record kinds and keys,
// read from its source (REC_KINDS and REC_KEYS), so they are written once;
// recKeyFmt is each key's format (HEX, DEC, INT, STR).
var recKinds, recKeys, recKeyFmt = shimTables(shimSource)

func shimTables(src []byte) (kinds, keys, fmts []string) {
	macro := func(name string) string {
		i := bytes.Index(src, []byte("#define "+name+"(X)"))
		if i < 0 {
			panic("trace: shim.c has no " + name) // the embedded source is the package's own
		}
		var b strings.Builder
		for _, l := range strings.SplitAfter(string(src[i:]), "\n") {
			b.WriteString(l)
			if !strings.HasSuffix(strings.TrimRight(l, "\n"), "\\") {
				break
			}
		}
		return b.String()
	}
	for _, m := range regexp.MustCompile(`X\((\w+)\)`).FindAllStringSubmatch(macro("REC_KINDS"), -1) {
		kinds = append(kinds, m[1])
	}
	for _, m := range regexp.MustCompile(`X\((\w+), (\w+)\)`).FindAllStringSubmatch(macro("REC_KEYS"), -1) {
		keys, fmts = append(keys, m[1]), append(fmts, m[2])
	}
	return kinds, keys, fmts
}

// recordReader gives the records of a record file as text, one a line (as
// Parse reads them and --records keeps them): the binary records the
// processes wrote, their TSC times converted to CLOCK_MONOTONIC nanoseconds
// (and held from going back in the records' order);
// what a process killed while it copied a record left (a reservation partly
// or never written) is skipped and counted in lost, with the records that
// did not fit.
type recordReader struct {
	it      *recIter
	clock   tscClock
	pending []byte
	lost    int
	last    uint64 // the latest time given
}

func openRecords(f *os.File) (*recordReader, error) {
	hdr := make([]byte, 32)
	if _, err := f.ReadAt(hdr, 0); err != nil || string(hdr[:8]) != recMagic {
		return nil, fmt.Errorf("%s: %w", f.Name(), errNotRecordFile)
	}
	size := int64(binary.NativeEndian.Uint64(hdr[8:]))
	next := int64(binary.NativeEndian.Uint64(hdr[16:]))
	lost := int(binary.NativeEndian.Uint64(hdr[24:]))
	sec := func() *recIter {
		return &recIter{br: bufio.NewReaderSize(io.NewSectionReader(f, recData, min(next, size-recData)), 1<<16)}
	}
	// a first pass for the clock: the TSC/CLOCK_MONOTONIC pairs that span
	// the whole trace
	var clock tscClock
	first := sec()
	for {
		w, err := first.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		clock.add(w)
	}
	return &recordReader{it: sec(), clock: clock, lost: lost}, nil
}

// tscClock converts the shim's TSC times to CLOCK_MONOTONIC: a line
// through the first and the last pair the records carry (the shim reads the
// TSC only where the kernel's clocksource is the TSC, so CLOCK_MONOTONIC
// runs from it, slewed by NTP's few parts per million at most).
type tscClock struct {
	n         int
	tsc0, ns0 uint64
	tsc1, ns1 uint64
}

func (c *tscClock) add(w []uint64) {
	ns, ok := value(w, "ns")
	if !ok || w[2]&recTSC == 0 {
		return
	}
	tsc := w[1]
	switch {
	case c.n == 0:
		c.tsc0, c.ns0, c.tsc1, c.ns1 = tsc, ns, tsc, ns
	case tsc < c.tsc0:
		c.tsc0, c.ns0 = tsc, ns
	case tsc > c.tsc1:
		c.tsc1, c.ns1 = tsc, ns
	}
	c.n++
}

func (c *tscClock) ns(tsc uint64) uint64 {
	rate := 1.0 // one pair: no rate to be had; the shim writes two as it maps the file
	if c.tsc1 > c.tsc0 {
		rate = float64(int64(c.ns1-c.ns0)) / float64(c.tsc1-c.tsc0)
	}
	return uint64(int64(c.ns0) + int64(float64(int64(tsc-c.tsc0))*rate))
}

// value finds key's value in record w.
func value(w []uint64, key string) (uint64, bool) {
	nv := int(w[0] >> 24 & 0xff)
	for i := 0; i < nv; i++ {
		if k := int(w[3+i/8] >> (8 * (i % 8)) & 0xff); recKeys[k] == key {
			return w[recHead+i], true
		}
	}
	return 0, false
}

// recIter walks the binary records of a record file's data.
type recIter struct {
	br  *bufio.Reader
	w   []uint64
	gap int // bytes skipped since the last record; nonzero: some not zero
	odd bool
	// lost counts the gaps a record follows, or with bytes written: a
	// process killed mid-copy, or before it copied what it reserved
	lost int
}

// next returns the next whole record's words (valid until the next call),
// or io.EOF.
func (it *recIter) next() ([]uint64, error) {
	for {
		head, err := it.br.Peek(8)
		if len(head) < 8 {
			if it.odd || len(bytes.Trim(head, "\x00")) > 0 {
				it.lost++
			}
			if err == nil || err == io.EOF {
				return nil, io.EOF
			}
			return nil, err
		}
		if w := it.whole(); w != nil {
			if it.gap > 0 {
				it.lost++
			}
			it.gap, it.odd = 0, false
			return w, nil
		}
		if binary.NativeEndian.Uint64(head) != 0 {
			it.odd = true
		}
		it.gap += 8
		if _, err := it.br.Discard(8); err != nil {
			return nil, err
		}
	}
}

// whole checks the record at the reader: its header, its size and its
// check; it consumes and returns it, or returns nil.
func (it *recIter) whole() []uint64 {
	head, _ := it.br.Peek(8)
	h := binary.NativeEndian.Uint64(head)
	words, nv := int(h>>16&0xff), int(h>>24&0xff)
	if h&0xff != recMark || int(h>>8&0xff) >= len(recKinds) || nv > recMaxVals || words < recHead+nv {
		return nil
	}
	b, err := it.br.Peek(words * 8)
	if err != nil {
		return nil
	}
	it.w = it.w[:0]
	for i := 0; i < words; i++ {
		it.w = append(it.w, binary.NativeEndian.Uint64(b[8*i:]))
	}
	w := it.w
	slen := int(w[2] >> 40 & 0xffff)
	x := w[1] ^ w[3] ^ w[4]
	for _, v := range w[recHead : recHead+nv] {
		x ^= v
	}
	x ^= x >> 32
	x ^= x >> 16
	x ^= x >> 8
	if words != recHead+nv+(slen+7)/8 || x&0xff != w[2]>>56 {
		return nil
	}
	for i := 0; i < nv; i++ {
		if int(w[3+i/8]>>(8*(i%8))&0xff) >= len(recKeys) {
			return nil
		}
	}
	_, _ = it.br.Discard(words * 8)
	return w
}

func (r *recordReader) Read(p []byte) (int, error) {
	for len(r.pending) == 0 {
		w, err := r.it.next()
		if err != nil {
			r.lost += r.it.lost
			r.it.lost = 0
			return 0, err
		}
		r.pending = r.text(w)
	}
	n := copy(p, r.pending)
	r.pending = r.pending[n:]
	return n, nil
}

// text prints record w as Parse reads it: "KIND t=0xNS pid= tid= KEY=VALUE...".
func (r *recordReader) text(w []uint64) []byte {
	kind := recKinds[w[0]>>8&0xff]
	if kind == "clock" {
		return nil // a pair for the conversion only
	}
	t := w[1]
	if w[2]&recTSC != 0 {
		t = r.clock.ns(t)
	}
	// never back in the records' order: where clock_gettime is a system
	// call the post and poll records carry the coarse clock's last tick
	// (shim.c's rec_time), which may precede the record before them
	t = max(t, r.last)
	r.last = t
	b := fmt.Appendf(nil, "%s t=0x%x pid=%d tid=%d", kind, t, uint32(w[2]), uint32(w[0]>>32))
	nv := int(w[0] >> 24 & 0xff)
	str := make([]byte, 0, 8*(len(w)-recHead-nv))
	for _, v := range w[recHead+nv:] {
		str = binary.NativeEndian.AppendUint64(str, v)
	}
	for i := 0; i < nv; i++ {
		k := int(w[3+i/8] >> (8 * (i % 8)) & 0xff)
		v := w[recHead+i]
		key := recKeys[k]
		switch recKeyFmt[k] {
		case "HEX":
			b = fmt.Appendf(b, " %s=0x%x", key, v)
		case "INT":
			b = fmt.Appendf(b, " %s=%d", key, int64(v))
		case "STR":
			// printable, no blank or '=', so that the line parses
			s := bytes.Map(func(c rune) rune {
				if c > ' ' && c < 127 && c != '=' {
					return c
				}
				return '_'
			}, str[:min(int(v), len(str))])
			b = fmt.Appendf(b, " %s=%s", key, s)
		case "DEC":
			if key != "ns" { // the conversion's, not the analysis's
				b = fmt.Appendf(b, " %s=%d", key, v)
			}
		}
	}
	return append(b, '\n')
}

package main

import (
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// A path that is not a regular file (/dev/null, a FIFO) is written in
// place, never replaced by a regular file (qpdrain trace --report /dev/null
// run as root used to leave /dev/null a regular file).
func TestWriteFileAtomicSpecial(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skip(err)
	}
	got := make(chan []byte, 1)
	go func() {
		b, _ := os.ReadFile(fifo) // opens the read side: the write side's open returns
		got <- b
	}()
	if err := writeFileAtomic(fifo, func(w io.Writer) error { _, err := w.Write([]byte("report")); return err }); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Lstat(fifo); err != nil || st.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("the FIFO became %v (%v)", st.Mode(), err)
	}
	select {
	case b := <-got:
		if string(b) != "report" {
			t.Errorf("read %q through the FIFO, want the report", b)
		}
	case <-time.After(10 * time.Second):
		t.Error("nothing came through the FIFO")
	}
}

package inventory

import (
	"errors"
	"os"
	"os/exec"
	"reflect"
	"testing"

	"golang.org/x/sys/unix"
)

// TestGroupFilesKcmp groups real fds of an ordinary file with kcmp(2):
// two opens are two files, a dup and a child's inherited fd share one.
func TestGroupFilesKcmp(t *testing.T) {
	path := t.TempDir() + "/f"
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	dup, err := dupFile(a)
	if err != nil {
		t.Fatal(err)
	}
	defer dup.Close()
	child := exec.Command("sleep", "60")
	child.ExtraFiles = []*os.File{b, a} // fds 3 and 4 of the child
	if err := child.Start(); err != nil {
		t.Skipf("no sleep to hold the fds: %v", err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	self, kid := uint32(os.Getpid()), uint32(child.Process.Pid)
	holders := []Holder{
		{PID: self, FDs: []int{int(a.Fd()), int(b.Fd()), int(dup.Fd())}},
		{PID: kid, FDs: []int{3, 4}},
	}
	if _, err := kcmpSameFile(self, int(a.Fd()), kid, 3); errors.Is(err, ErrNoKcmp) {
		t.Skipf("kcmp: %v", err)
	}
	files, ok := groupFiles(holders, kcmpSameFile)
	if !ok {
		t.Fatal("kcmp could not group the fds")
	}
	want := []File{
		{Holders: []Holder{{PID: self, FDs: []int{int(a.Fd()), int(dup.Fd())}}, {PID: kid, FDs: []int{4}}}},
		{Holders: []Holder{{PID: self, FDs: []int{int(b.Fd())}}, {PID: kid, FDs: []int{3}}}},
	}
	if !reflect.DeepEqual(files, want) {
		t.Errorf("files %+v, want %+v", files, want)
	}
	// An fd closed since the scan is left out, not an error.
	files, ok = groupFiles([]Holder{{PID: self, FDs: []int{int(a.Fd())}}, {PID: kid, FDs: []int{99}}}, kcmpSameFile)
	if !ok || len(files) != 1 || len(files[0].Holders) != 1 {
		t.Errorf("with a closed fd: %+v %v, want the one file of this process", files, ok)
	}
}

func dupFile(f *os.File) (*os.File, error) {
	fd, err := unix.Dup(int(f.Fd()))
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

package inventory

import (
	"errors"
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// TestTaskOnThisProcess maps one of this process's threads to the process
// on the real /proc.
func TestTaskOnThisProcess(t *testing.T) {
	tids := make(chan int)
	release := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tids <- unix.Gettid()
		<-release
	}()
	tid := <-tids
	defer close(release)
	task, err := Proc{}.Task(uint32(tid))
	if err != nil {
		t.Fatal(err)
	}
	if task.TGID != uint32(os.Getpid()) || task.Comm == "" || task.Zombie {
		t.Errorf("task %d: %+v, want process %d", tid, task, os.Getpid())
	}
	if _, err := (Proc{}).Task(1 << 30); !errors.Is(err, ErrNoTask) {
		t.Errorf("a task that does not exist: %v, want ErrNoTask", err)
	}
}

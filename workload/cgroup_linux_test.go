package workload

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"

	"github.com/qpdrain/qpdrain/internal/testing/cgrouptest"
	"github.com/qpdrain/qpdrain/internal/testing/testproc"
)

func randomHex(t *testing.T, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// TestReadRealCgroup creates cgroups shaped as the kubelet and containerd
// name them, under both cgroup drivers, moves a real process into each and
// reads its workload back from /proc.
func TestReadRealCgroup(t *testing.T) {
	root := cgrouptest.Root(t)
	h := randomHex(t, 16)
	uid := fmt.Sprintf("%s-%s-%s-%s-%s", h[:8], h[8:12], h[12:16], h[16:20], h[20:])
	cid := randomHex(t, 32)
	esc := strings.ReplaceAll(uid, "-", "_")
	for _, c := range []struct {
		driver string
		// shared are the levels other pods share; pod the pod's own.
		shared, pod []string
		want        Workload
	}{
		{"systemd", []string{"kubepods.slice", "kubepods-besteffort.slice"},
			[]string{"kubepods-besteffort-pod" + esc + ".slice", "cri-containerd-" + cid + ".scope"},
			Workload{Slice: "kubepods-besteffort-pod" + esc + ".slice", Unit: "cri-containerd-" + cid + ".scope",
				ContainerID: cid, Runtime: Containerd, PodUID: uid, QoS: BestEffort}},
		{"cgroupfs", []string{"kubepods", "burstable"}, []string{"pod" + uid, cid},
			Workload{ContainerID: cid, PodUID: uid, QoS: Burstable}},
	} {
		t.Run(c.driver, func(t *testing.T) {
			pid := testproc.Idle(t)
			c.want.Path = cgrouptest.Place(t, root, c.shared, c.pod, pid)
			got, err := Read("", uint32(pid))
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("Read(%d)\n got %+v\nwant %+v", pid, got, c.want)
			}
		})
	}
	if _, err := Read("", 0); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Read of pid 0: %v, want fs.ErrNotExist", err)
	}
}

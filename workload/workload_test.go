package workload

import (
	"errors"
	"testing"

	"github.com/qpdrain/qpdrain/internal/testing/testmain"
)

func TestMain(m *testing.M) { testmain.Run(m) }

const (
	id  = "4c8b2d1f0e9a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c"
	uid = "8f3a2c1d-5e6b-4a7c-9d0e-1f2a3b4c5d6e"
	// uidEsc is uid as the systemd driver writes it.
	uidEsc = "8f3a2c1d_5e6b_4a7c_9d0e_1f2a3b4c5d6e"
	// static is a static pod's UID: the hash of its manifest.
	static = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		name string
		path string
		want Workload
	}{
		{"systemd containerd burstable", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidEsc + ".slice/cri-containerd-" + id + ".scope",
			Workload{Slice: "kubepods-burstable-pod" + uidEsc + ".slice", Unit: "cri-containerd-" + id + ".scope", ContainerID: id, Runtime: Containerd, PodUID: uid, QoS: Burstable}},
		{"systemd CRI-O besteffort", "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidEsc + ".slice/crio-" + id + ".scope",
			Workload{Slice: "kubepods-besteffort-pod" + uidEsc + ".slice", Unit: "crio-" + id + ".scope", ContainerID: id, Runtime: CRIO, PodUID: uid, QoS: BestEffort}},
		{"systemd CRI-O conmon is no container", "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidEsc + ".slice/crio-conmon-" + id + ".scope",
			Workload{Slice: "kubepods-besteffort-pod" + uidEsc + ".slice", Unit: "crio-conmon-" + id + ".scope", PodUID: uid, QoS: BestEffort}},
		{"systemd docker guaranteed", "/kubepods.slice/kubepods-pod" + uidEsc + ".slice/docker-" + id + ".scope",
			Workload{Slice: "kubepods-pod" + uidEsc + ".slice", Unit: "docker-" + id + ".scope", ContainerID: id, Runtime: Docker, PodUID: uid, QoS: Guaranteed}},
		{"systemd static pod", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + static + ".slice/cri-containerd-" + id + ".scope",
			Workload{Slice: "kubepods-burstable-pod" + static + ".slice", Unit: "cri-containerd-" + id + ".scope", ContainerID: id, Runtime: Containerd, PodUID: static, QoS: Burstable}},
		{"systemd under --cgroup-root", "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod" + uidEsc + ".slice/cri-containerd-" + id + ".scope",
			Workload{Slice: "kubelet-kubepods-besteffort-pod" + uidEsc + ".slice", Unit: "cri-containerd-" + id + ".scope", ContainerID: id, Runtime: Containerd, PodUID: uid, QoS: BestEffort}},
		{"systemd process in a container's sub-cgroup", "/kubepods.slice/kubepods-pod" + uidEsc + ".slice/cri-containerd-" + id + ".scope/init.scope",
			Workload{Slice: "kubepods-pod" + uidEsc + ".slice", Unit: "cri-containerd-" + id + ".scope", ContainerID: id, Runtime: Containerd, PodUID: uid, QoS: Guaranteed}},
		{"cgroupfs containerd besteffort", "/kubepods/besteffort/pod" + uid + "/" + id,
			Workload{ContainerID: id, PodUID: uid, QoS: BestEffort}},
		{"cgroupfs burstable", "/kubepods/burstable/pod" + uid + "/" + id,
			Workload{ContainerID: id, PodUID: uid, QoS: Burstable}},
		{"cgroupfs guaranteed", "/kubepods/pod" + uid + "/" + id,
			Workload{ContainerID: id, PodUID: uid, QoS: Guaranteed}},
		{"cgroupfs CRI-O", "/kubepods/burstable/pod" + uid + "/crio-" + id,
			Workload{ContainerID: id, Runtime: CRIO, PodUID: uid, QoS: Burstable}},
		{"cgroupfs pod without a container", "/kubepods/besteffort/pod" + uid,
			Workload{PodUID: uid, QoS: BestEffort}},
		{"QoS level, no pod", "/kubepods.slice/kubepods-burstable.slice",
			Workload{Slice: "kubepods-burstable.slice"}},
		{"reader in its own cgroup namespace", "/../../kubepods-besteffort-pod" + uidEsc + ".slice/cri-containerd-" + id + ".scope",
			Workload{Slice: "kubepods-besteffort-pod" + uidEsc + ".slice", Unit: "cri-containerd-" + id + ".scope", ContainerID: id, Runtime: Containerd, PodUID: uid, QoS: BestEffort}},
		{"reader in its own cgroup namespace, cgroupfs", "/../../../burstable/pod" + uid + "/" + id,
			Workload{ContainerID: id, PodUID: uid, QoS: Burstable}},
		{"docker systemd", "/system.slice/docker-" + id + ".scope",
			Workload{Slice: "system.slice", Unit: "docker-" + id + ".scope", ContainerID: id, Runtime: Docker}},
		{"docker cgroupfs", "/docker/" + id, Workload{ContainerID: id, Runtime: Docker}},
		{"containerd namespace cgroupfs", "/k8s.io/" + id, Workload{ContainerID: id}},
		{"service", "/system.slice/sshd.service", Workload{Slice: "system.slice", Unit: "sshd.service"}},
		{"user service", "/user.slice/user-1000.slice/user@1000.service/app.slice/app-foo.scope",
			Workload{Slice: "user-1000.slice", Unit: "user@1000.service"}},
		{"root", "/", Workload{}},
		{"not a pod: short uid", "/kubepods/besteffort/pod1234", Workload{}},
		{"not a container: short id", "/system.slice/docker-abc.scope", Workload{Slice: "system.slice", Unit: "docker-abc.scope"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.want.Path = c.path
			if got := Parse(c.path); got != c.want {
				t.Errorf("Parse(%q)\n got %+v\nwant %+v", c.path, got, c.want)
			}
		})
	}
}

func TestTopAndContainer(t *testing.T) {
	for _, c := range []struct{ path, top, container string }{
		{"/system.slice/docker-" + id + ".scope", "/system.slice", "docker://" + id},
		{"/kubepods/besteffort/pod" + uid + "/" + id, "/kubepods", id},
		{"/../../kubepods-pod" + uidEsc + ".slice/crio-" + id + ".scope", "/kubepods-pod" + uidEsc + ".slice", "cri-o://" + id},
		{"/", "/", ""},
	} {
		w := Parse(c.path)
		if w.Top() != c.top || w.Container() != c.container {
			t.Errorf("%s: Top %q Container %q, want %q %q", c.path, w.Top(), w.Container(), c.top, c.container)
		}
	}
}

func TestParseProcCgroup(t *testing.T) {
	k8s := "/kubepods/besteffort/pod" + uid + "/" + id
	for _, c := range []struct {
		name, text, path string
		err              error
	}{
		{"v2", "0::" + k8s + "\n", k8s, nil},
		{"v2 removed cgroup", "0::" + k8s + " (deleted)\n", k8s, nil},
		{"hybrid: the unified line wins", "12:pids:/kubepods/besteffort/pod" + uid + "/" + id + "\n1:name=systemd:/other\n0::/unified.slice\n", "/unified.slice", nil},
		{"v1 only: name=systemd", "12:pids:/x\n1:name=systemd:" + k8s + "\n", k8s, nil},
		{"v1 without name=systemd", "12:pids:/x\n4:memory:/y\n", "", ErrNoCgroup},
		{"empty", "", "", ErrNoCgroup},
		{"path with a colon", "0::/a:b.scope\n", "/a:b.scope", nil},
	} {
		w, err := ParseProcCgroup([]byte(c.text))
		if !errors.Is(err, c.err) || w.Path != c.path {
			t.Errorf("%s: path %q err %v, want %q %v", c.name, w.Path, err, c.path, c.err)
		}
	}
	for _, bad := range []string{"garbage\n", "0:/no-third-field\n", "0::relative\n"} {
		if _, err := ParseProcCgroup([]byte(bad)); err == nil || errors.Is(err, ErrNoCgroup) {
			t.Errorf("ParseProcCgroup(%q): %v, want a malformed-line error", bad, err)
		}
	}
}

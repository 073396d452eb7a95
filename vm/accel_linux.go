package vm

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// KVM's ioctls (include/uapi/linux/kvm.h): _IO(KVMIO, 0x00) and _IO(KVMIO, 0x01).
const (
	kvmGetAPIVersion = 0xae00
	kvmCreateVM      = 0xae01
	kvmAPIVersion    = 12
)

// probeKVM reports why dev cannot run a VM, or nil when it can: it opens the
// device, checks the API version and creates (and closes) a VM, as qemu's
// first steps do, so a device node without working virtualization (nested
// guests, a missing kvm_intel) falls back to TCG instead of failing the run.
func probeKVM(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fd := int(f.Fd())
	v, err := unix.IoctlRetInt(fd, kvmGetAPIVersion)
	if err != nil {
		return fmt.Errorf("%s: KVM_GET_API_VERSION: %w", dev, err)
	}
	if v != kvmAPIVersion {
		return fmt.Errorf("%s: KVM API version %d, want %d", dev, v, kvmAPIVersion)
	}
	vm, err := unix.IoctlRetInt(fd, kvmCreateVM)
	if err != nil {
		return fmt.Errorf("%s: KVM_CREATE_VM: %w", dev, err)
	}
	return unix.Close(vm)
}

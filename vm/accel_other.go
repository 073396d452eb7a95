//go:build !linux

package vm

import "fmt"

// probeKVM: KVM exists only on Linux.
func probeKVM(dev string) error { return fmt.Errorf("%s: KVM needs Linux", dev) }

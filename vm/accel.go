package vm

import (
	"errors"
	"fmt"
	"strings"
)

// Accel is how qemu runs the guest.
type Accel string

// The accelerators.
const (
	// AccelAuto picks AccelKVM when /dev/kvm is usable, AccelTCG otherwise.
	AccelAuto Accel = "auto"
	// AccelKVM runs the guest on the host's CPU (qemu -accel kvm -cpu host).
	AccelKVM Accel = "kvm"
	// AccelTCG emulates the CPU (qemu -accel tcg -cpu max): slow, works anywhere.
	AccelTCG Accel = "tcg"
)

// ErrKVMUnusable is returned when KVM is asked for and /dev/kvm cannot run a VM.
var ErrKVMUnusable = errors.New("kvm is not usable")

// ParseAccel reads an --accel value: auto, kvm or tcg.
func ParseAccel(s string) (Accel, error) {
	switch a := Accel(strings.ToLower(s)); a {
	case AccelAuto, AccelKVM, AccelTCG:
		return a, nil
	}
	return "", fmt.Errorf("accelerator %q: want auto, kvm or tcg", s)
}

// Resolve turns AccelAuto into AccelKVM or AccelTCG by probing kvmDev, and
// says why in a phrase for the run's first line. Asking for AccelKVM where
// KVM is unusable is an error wrapping ErrKVMUnusable.
func (a Accel) Resolve(kvmDev string) (Accel, string, error) {
	probe := probeKVM(kvmDev)
	switch {
	case a == AccelTCG:
		return AccelTCG, "as asked", nil
	case probe == nil:
		return AccelKVM, kvmDev + " is usable", nil
	case a == AccelKVM:
		return "", "", fmt.Errorf("%w: %v", ErrKVMUnusable, probe)
	default:
		return AccelTCG, "no KVM: " + probe.Error(), nil
	}
}

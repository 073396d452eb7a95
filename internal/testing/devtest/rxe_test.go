package devtest

import "testing"

// TestRXEChanges: every behaviour has its kernel boundary and a reason,
// and neither side of a boundary is claimed for a device other than rxe.
func TestRXEChanges(t *testing.T) {
	for c := RXELastWQEReached; c <= RXEResponderAccessEvent; c++ {
		since, why := RXESince(c)
		if since.Major == 0 || why == "" {
			t.Errorf("RXEChange %d: since %v, why %q: want a kernel and a reason", c, since, why)
		}
		if CurrentProvider() != ProviderRXE && (RXEHas(c) || RXELacks(c)) {
			t.Errorf("RXEChange %d: RXEHas %v, RXELacks %v on %s, want both false", c, RXEHas(c), RXELacks(c), DeviceName())
		}
	}
	for _, tc := range []struct {
		k, o KernelRelease
		want bool
	}{
		{KernelRelease{6, 1}, KernelRelease{6, 12}, true},
		{KernelRelease{6, 12}, KernelRelease{6, 12}, false},
		{KernelRelease{6, 13}, KernelRelease{7, 3}, true},
		{KernelRelease{7, 3}, KernelRelease{6, 12}, false},
		{KernelRelease{5, 19}, KernelRelease{6, 1}, true},
	} {
		if got := tc.k.Before(tc.o); got != tc.want {
			t.Errorf("%v.Before(%v) = %v, want %v", tc.k, tc.o, got, tc.want)
		}
	}
}

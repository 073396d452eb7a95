//go:build linux && cgo

package libibverbs

import (
	"errors"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/qpdrain/qpdrain/ibv"
)

// TestLoadMissing: a library that is not there, or one without libibverbs's
// entry points, is a *LoadError matching ErrNotSupported that names what is
// missing and what to install, and it leaves the real load untouched.
func TestLoadMissing(t *testing.T) {
	for _, tc := range []struct {
		lib, symbol string
		want        []string
	}{
		{"libqpdrain-no-such-library.so.1", "", []string{"libibverbs is not installed", "libqpdrain-no-such-library.so.1", "libibverbs1", "ibverbs-providers"}},
		{"libc.so.6", "ibv_get_device_list@IBVERBS_1.1", []string{"libibverbs is too old", "libc.so.6 lacks ibv_get_device_list@IBVERBS_1.1", "libibverbs1"}},
	} {
		err := loadFrom(tc.lib)
		var le *ibv.LoadError
		if !errors.As(err, &le) || !errors.Is(err, ibv.ErrNotSupported) || !errors.Is(err, syscall.EOPNOTSUPP) {
			t.Fatalf("loading %s = %v, want a *LoadError matching ErrNotSupported", tc.lib, err)
		}
		if le.Library != tc.lib || le.Symbol != tc.symbol || le.Reason == "" {
			t.Errorf("loading %s = %+v, want library %s, symbol %q and the loader's reason", tc.lib, le, tc.lib, tc.symbol)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("loading %s: %q does not say %q", tc.lib, err, w)
			}
		}
	}
	if err := Load(); err != nil {
		var le *ibv.LoadError
		if !errors.As(err, &le) || le.Symbol != "" {
			t.Errorf("Load() = %v, want nil or the library itself missing", err)
		}
	}
}

// TestLoadOnce: concurrent first callers share one load and one result.
func TestLoadOnce(t *testing.T) {
	const n = 8
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { errs[i] = Load() })
	}
	wg.Wait()
	for i, err := range errs {
		if err != errs[0] {
			t.Errorf("Load() in goroutine %d = %v, in goroutine 0 %v", i, err, errs[0])
		}
	}
	if _, err := Devices(); errs[0] != nil && !errors.Is(err, errs[0]) {
		t.Errorf("Devices() = %v, want Load's %v", err, errs[0])
	}
}

// TestLoadBroken: a file that is there but is no loadable library is named
// as such, not as a missing one.
func TestLoadBroken(t *testing.T) {
	bad := t.TempDir() + "/libibverbs.so.1"
	if err := os.WriteFile(bad, []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := loadFrom(bad)
	if !errors.Is(err, ibv.ErrNotSupported) || !strings.Contains(err.Error(), "libibverbs cannot be loaded: "+bad) {
		t.Errorf("loading %s = %v, want ErrNotSupported saying it cannot be loaded", bad, err)
	}
}

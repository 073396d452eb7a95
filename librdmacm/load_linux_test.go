//go:build linux && cgo

package librdmacm

import (
	"debug/elf"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/qpdrain/qpdrain/cm"
	"github.com/qpdrain/qpdrain/ibv"
)

// TestLoadMissing: a library that is not there, or one without
// librdmacm's entry points, is a *cm.LoadError matching ErrNotSupported
// that names what is missing and what to install.
func TestLoadMissing(t *testing.T) {
	for _, tc := range []struct {
		lib, symbol string
		want        []string
	}{
		{"libqpdrain-no-such-library.so.1", "", []string{"librdmacm is not installed", "libqpdrain-no-such-library.so.1", "librdmacm1"}},
		{"libc.so.6", "rdma_create_event_channel@RDMACM_1.0", []string{"librdmacm is too old", "libc.so.6 lacks rdma_create_event_channel@RDMACM_1.0"}},
	} {
		err := loadFrom(tc.lib)
		var le *cm.LoadError
		if !errors.As(err, &le) || !errors.Is(err, ibv.ErrNotSupported) {
			t.Fatalf("loading %s = %v, want a *cm.LoadError matching ErrNotSupported", tc.lib, err)
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
}

// TestNotLinked: a program that imports the binding does not link
// librdmacm (or libibverbs): it opens them at run time, so it starts
// where they are missing.
func TestNotLinked(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range libs {
		if strings.HasPrefix(l, "librdmacm") || strings.HasPrefix(l, "libibverbs") {
			t.Errorf("the test binary links %s (DT_NEEDED %v); librdmacm must be opened at run time", l, libs)
		}
	}
}

// TestOpen: Open succeeds where librdmacm loads, and otherwise says why.
func TestOpen(t *testing.T) {
	m, err := Open()
	if err != nil {
		if !errors.Is(err, ibv.ErrNotSupported) {
			t.Fatalf("Open() = %v, want nil or ErrNotSupported", err)
		}
		t.Skipf("no librdmacm here: %v", err)
	}
	if _, err := m.CreateID(cm.PSUDP); !errors.Is(err, ibv.ErrNotSupported) {
		t.Errorf("CreateID(PSUDP) = %v, want ErrNotSupported", err)
	}
}

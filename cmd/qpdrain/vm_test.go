package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// runVMCmd runs "qpdrain vm SUB --cache CACHE ARGS..." and returns its output.
func runVMCmd(cache string, global []string, sub string, args ...string) (string, error) {
	out, _, err := runRoot(append(append(global, "vm", sub, "--cache", cache), args...)...)
	return out, err
}

func TestVMKernels(t *testing.T) {
	cache := t.TempDir()
	kd := filepath.Join(cache, "kernels", "6.1.0-57-amd64")
	if err := os.MkdirAll(kd, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(kd, ".complete"), "")
	writeFile(t, filepath.Join(kd, "package"), "linux-image-6.1.0-57-amd64 6.1.192-3\n")
	writeFile(t, filepath.Join(cache, "kernels", "bookworm.ref"), "6.1.0-57-amd64\n")

	out, err := runVMCmd(cache, nil, "kernels")
	if err != nil {
		t.Fatal(err)
	}
	wantAll(t, "vm kernels", out, "6.1     bookworm", "6.1.0-57-amd64", "linux-image-6.1.0-57-amd64 6.1.192-3",
		"6.12    bookworm-backports", "(not resolved yet)", "newest  trixie-backports", "5.10    bullseye            no ")
	out, err = runVMCmd(cache, []string{"-j"}, "kernels")
	if err != nil {
		t.Fatal(err)
	}
	var ks []map[string]any
	if err := json.Unmarshal([]byte(out), &ks); err != nil || len(ks) != 4 || ks[0]["version"] != "6.1.0-57-amd64" || ks[0]["dir"] != kd {
		t.Fatalf("vm kernels -j = %+v, %v:\n%s", ks, err, out)
	}
	// A name not resolved yet has the same keys, empty.
	for _, k := range ks[1:] {
		if len(k) != len(ks[0]) {
			t.Errorf("vm kernels -j: %v has other keys than %v", k, ks[0])
		}
	}
}

// TestVMGoTestOutsideModule: go-test outside any Go module exits 2 before
// anything is downloaded or built (the cache stays empty).
func TestVMGoTestOutsideModule(t *testing.T) {
	t.Chdir(t.TempDir())
	wantRefused(t, []string{"vm", "--cache", "DIR"}, []badInput{{[]string{"go-test", "./..."}, exitError, "not inside a Go module"}})
}

// TestVMBadArgs: wrong requests exit 2 with a message naming what was wrong,
// before anything boots or the cache is written.
func TestVMBadArgs(t *testing.T) {
	wantRefused(t, []string{"vm", "--cache", "DIR"}, []badInput{
		{[]string{"run", "--kernels", "5.4", "--", "true"}, exitError, `"5.4" for "--kernels" flag: kernel "5.4"`},
		{[]string{"run", "--accel", "hvf", "--", "true"}, exitError, `accelerator "hvf"`},
		{[]string{"run", "--", "qpdrain-no-such-command"}, exitError, "missing binary"},
		{[]string{"run", "--files", "/nonexistent", "--", "true"}, exitError, "/nonexistent"},
		{[]string{"go-test", "--", "-test.v"}, exitError, "no packages"},
		{[]string{"run", "--timeout", "0", "--", "true"}, exitError, `"0" for "--timeout" flag: want at least 1s`},
		{[]string{"run", "--timeout", "-5s", "--", "true"}, exitError, `"-5s" for "--timeout" flag`},
		{[]string{"go-test", "--timeout", "500ms", "./..."}, exitError, `"500ms" for "--timeout" flag`},
		{[]string{"bogus"}, exitError, `unknown command "bogus"`},
		{[]string{"run", "--providers", "rxe,ib", "--", "true"}, exitError, `"rxe,ib" for "--providers" flag: provider "ib": unknown provider`},
	})
}

// TestVMProvidersEnv: $RXE_PROVIDERS is --providers' default, refused naming
// the variable when it is no list, unless --providers replaces it.
func TestVMProvidersEnv(t *testing.T) {
	t.Setenv("RXE_PROVIDERS", "rxe,roce")
	wantRefused(t, []string{"vm", "--cache", "DIR"}, []badInput{{[]string{"kernels"}, exitError, `$RXE_PROVIDERS: provider "roce": unknown provider`}})
	if out, err := runVMCmd(t.TempDir(), nil, "kernels", "--providers", "siw"); err != nil {
		t.Errorf("vm kernels --providers siw with RXE_PROVIDERS=rxe,roce: %v\n%s", err, out)
	}
}

// TestVMKernelsEnv: $RXE_KERNELS is --kernels' default, refused naming
// the variable when it is no list, unless --kernels replaces it.
func TestVMKernelsEnv(t *testing.T) {
	t.Setenv("RXE_KERNELS", "5.4")
	wantRefused(t, []string{"vm", "--cache", "DIR"}, []badInput{{[]string{"kernels"}, exitError, `$RXE_KERNELS: kernel "5.4"`}})
	if out, err := runVMCmd(t.TempDir(), nil, "kernels", "--kernels", "6.1"); err != nil {
		t.Errorf("vm kernels --kernels 6.1 with RXE_KERNELS=5.4: %v\n%s", err, out)
	}
}

// TestVMPayloadTooBig: a --files payload the guest's memory cannot hold
// (508 MB in the default 1 GiB) exits 2 before anything starts, one line
// with the sizes; so does an RXE_MEM run-vm.sh would refuse.
func TestVMPayloadTooBig(t *testing.T) {
	t.Setenv("RXE_MEM", "")
	big := filepath.Join(t.TempDir(), "big")
	writeFile(t, big, "")
	if err := os.Truncate(big, 508e6); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, []string{"vm", "--cache", "DIR"}, []badInput{
		{[]string{"run", "--files", big, "--", "true"}, exitError, "vm run: bad vm arguments: the payload is "},
		{[]string{"run", "--files", big, "-j", "--", "true"}, exitError, ") and the guest has 1024 MiB (RXE_MEM): it needs 3 × "},
	})
	t.Setenv("RXE_MEM", "100")
	wantRefused(t, []string{"vm", "--cache", "DIR"}, []badInput{
		{[]string{"run", "--", "true"}, exitError, "RXE_MEM=100: want the guest's memory in MiB, at least 256"},
	})
}

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
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
		"6.12    bookworm-backports", "(not resolved yet)", "newest  trixie-backports")
	out, err = runVMCmd(cache, []string{"-j"}, "kernels")
	if err != nil {
		t.Fatal(err)
	}
	var ks []map[string]any
	if err := json.Unmarshal([]byte(out), &ks); err != nil || len(ks) != 3 || ks[0]["version"] != "6.1.0-57-amd64" || ks[0]["dir"] != kd {
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
	cache := t.TempDir()
	t.Chdir(t.TempDir())
	_, err := runVMCmd(cache, nil, "go-test", "./...")
	if code := exitCode(err); code != exitError || !strings.Contains(err.Error(), "not inside a Go module") {
		t.Errorf("go-test outside a module: exit %d, %v; want 2", code, err)
	}
	if ents, _ := os.ReadDir(cache); len(ents) != 0 {
		t.Errorf("the cache was written: %v", ents)
	}
}

// TestVMBadArgs: wrong requests exit 2 with a message naming what was wrong,
// before anything boots.
func TestVMBadArgs(t *testing.T) {
	cache := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--kernels", "5.10", "--", "true"}, `"5.10" for "--kernels" flag: kernel "5.10"`},
		{[]string{"run", "--accel", "hvf", "--", "true"}, `accelerator "hvf"`},
		{[]string{"run", "--", "qpdrain-no-such-command"}, "missing binary"},
		{[]string{"run", "--files", "/nonexistent", "--", "true"}, "/nonexistent"},
		{[]string{"go-test", "--", "-test.v"}, "no packages"},
		{[]string{"run", "--timeout", "0", "--", "true"}, `"0" for "--timeout" flag: want at least 1s`},
		{[]string{"run", "--timeout", "-5s", "--", "true"}, `"-5s" for "--timeout" flag`},
		{[]string{"go-test", "--timeout", "500ms", "./..."}, `"500ms" for "--timeout" flag`},
		{[]string{"bogus"}, `unknown command "bogus"`},
	} {
		_, err := runVMCmd(cache, nil, tc.args[0], tc.args[1:]...)
		if code := exitCode(err); code != exitError || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: exit %d, %v; want 2 and %q", tc.args, code, err, tc.want)
		}
	}
}

// TestVMKernelsEnv: $RXE_KERNELS is --kernels' default, refused naming
// the variable when it is no list, unless --kernels replaces it.
func TestVMKernelsEnv(t *testing.T) {
	t.Setenv("RXE_KERNELS", "5.10")
	cache := t.TempDir()
	if _, err := runVMCmd(cache, nil, "kernels"); exitCode(err) != exitError || err == nil || !strings.Contains(err.Error(), `$RXE_KERNELS: kernel "5.10"`) {
		t.Errorf("vm kernels with RXE_KERNELS=5.10: exit %d, %v; want 2 naming $RXE_KERNELS", exitCode(err), err)
	}
	if out, err := runVMCmd(cache, nil, "kernels", "--kernels", "6.1"); err != nil {
		t.Errorf("vm kernels --kernels 6.1 with RXE_KERNELS=5.10: %v\n%s", err, out)
	}
}

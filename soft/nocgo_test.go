package soft

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestSoftProgramLinksNoCgo: a program made of soft and drain (and what
// they import) links no cgo package, so it builds and runs where no C
// toolchain or libibverbs is; the libibverbs binding is a package of its own
// that only an import brings in. It asks the go command, so it needs the
// source tree and is skipped where the test binary runs alone (the rxe VM).
func TestSoftProgramLinksNoCgo(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to list the imports: %v", err)
	}
	if _, err := os.Stat("doc.go"); err != nil {
		t.Skipf("not in the source tree: %v", err)
	}
	cmd := exec.Command(gobin, "list", "-deps", "-f", "{{.ImportPath}} {{.CgoFiles}}",
		"github.com/qpdrain/qpdrain/soft", "github.com/qpdrain/qpdrain/drain")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1") // list cgo files as a cgo build would link them
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(pkgs) < 2 {
		t.Fatalf("go list -deps listed %d packages, want soft, drain and their imports:\n%s", len(pkgs), out)
	}
	for _, line := range pkgs {
		path, files, _ := strings.Cut(line, " ")
		if files != "[]" || path == "runtime/cgo" {
			t.Errorf("%s is a cgo package (%s), imported by soft or drain", path, files)
		}
	}
}

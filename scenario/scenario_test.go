package scenario_test

import (
	"bytes"
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/qpdrain/qpdrain/internal/testing/testmain"
	"github.com/qpdrain/qpdrain/scenario"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func TestMain(m *testing.M) { testmain.Run(m) }

// srqFaultTrace runs the SRQ-fault scenario and returns its formatted trace.
func srqFaultTrace(t *testing.T) []byte {
	t.Helper()
	steps, err := scenario.SRQFault()
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := scenario.Format(&b, steps); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestSRQFaultGolden(t *testing.T) {
	const golden = "../testdata/srq-fault.golden"
	got := srqFaultTrace(t)
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./scenario -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("trace differs from %s (go test ./scenario -update rewrites it):\n--- got\n%s--- want\n%s", golden, got, want)
	}
	// Deterministic: a second run gives the same trace.
	if !bytes.Equal(got, srqFaultTrace(t)) {
		t.Error("two runs gave different traces")
	}
}

func TestRunUnknown(t *testing.T) {
	steps, err := scenario.Run("nope")
	if err == nil {
		t.Error("Run accepted an unknown scenario")
	}
	// The error names what was asked for and what is known.
	if err == nil || steps != nil || !strings.Contains(err.Error(), `"nope"`) || !strings.Contains(err.Error(), strings.Join(scenario.Names, ", ")) {
		t.Errorf("Run(%q) = %v, %v; want no steps and an error naming it and the known scenarios", "nope", steps, err)
	}
}

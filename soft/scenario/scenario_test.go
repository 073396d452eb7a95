package scenario_test

import (
	"bytes"
	"flag"
	"os"
	"testing"

	"github.com/qpdrain/qpdrain/internal/testmain"
	"github.com/qpdrain/qpdrain/soft/scenario"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func TestMain(m *testing.M) { testmain.Run(m) }

func TestSRQFaultGolden(t *testing.T) {
	const golden = "../../testdata/srq-fault.golden"
	steps, err := scenario.SRQFault()
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	if err := scenario.Format(&got, steps); err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(golden, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./soft/scenario -update to create it)", err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Errorf("trace differs from %s (go test ./soft/scenario -update rewrites it):\n--- got\n%s--- want\n%s", golden, got.Bytes(), want)
	}
	// Deterministic: a second run gives the same trace.
	again, err := scenario.SRQFault()
	if err != nil {
		t.Fatal(err)
	}
	var second bytes.Buffer
	scenario.Format(&second, again)
	if !bytes.Equal(got.Bytes(), second.Bytes()) {
		t.Error("two runs gave different traces")
	}
}

func TestRunUnknown(t *testing.T) {
	if _, err := scenario.Run("nope"); err == nil {
		t.Error("Run accepted an unknown scenario")
	}
}

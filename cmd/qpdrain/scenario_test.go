package main

import (
	"os"
	"testing"
)

// The CLI prints exactly the golden trace of the scenario's own test.
func TestScenarioCommand(t *testing.T) {
	out, errOut, err := runRoot("scenario", "srq-fault")
	if err != nil {
		t.Fatalf("qpdrain scenario srq-fault: %v (stderr %q)", err, errOut)
	}
	want, err := os.ReadFile("../../testdata/srq-fault.golden")
	if err != nil {
		t.Fatal(err)
	}
	if out != string(want) {
		t.Errorf("output differs from testdata/srq-fault.golden:\n%s", out)
	}
}

// Without a name the scenarios are listed.
func TestScenarioList(t *testing.T) {
	for _, args := range [][]string{{"scenario"}, {"scenario", "-j"}} {
		out, _, err := runRoot(args...)
		if err != nil {
			t.Fatalf("qpdrain %v: %v", args, err)
		}
		if want := map[bool]string{false: "srq-fault\n", true: "[\"srq-fault\"]\n"}[len(args) == 2]; out != want {
			t.Errorf("qpdrain %v printed %q, want %q", args, out, want)
		}
	}
}

package main

import (
	"bytes"
	"os"
	"testing"
)

// The CLI prints exactly the golden trace of the scenario's own test.
func TestScenarioCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	root := newRootCmd(&out, &errOut)
	root.SetArgs([]string{"scenario", "srq-fault"})
	if err := root.Execute(); err != nil {
		t.Fatalf("qpdrain scenario srq-fault: %v (stderr %q)", err, errOut.String())
	}
	want, err := os.ReadFile("../../testdata/srq-fault.golden")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), want) {
		t.Errorf("output differs from testdata/srq-fault.golden:\n%s", out.Bytes())
	}
}

// Without a name the scenarios are listed.
func TestScenarioList(t *testing.T) {
	for _, args := range [][]string{{"scenario"}, {"scenario", "-j"}} {
		var out, errOut bytes.Buffer
		root := newRootCmd(&out, &errOut)
		root.SetArgs(args)
		if err := root.Execute(); err != nil {
			t.Fatalf("qpdrain %v: %v", args, err)
		}
		if want := map[bool]string{false: "srq-fault\n", true: "[\"srq-fault\"]\n"}[len(args) == 2]; out.String() != want {
			t.Errorf("qpdrain %v printed %q, want %q", args, out.String(), want)
		}
	}
}

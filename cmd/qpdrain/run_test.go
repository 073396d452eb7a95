package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// runRoot runs qpdrain's command tree on args and returns what it wrote to
// stdout and stderr and the command's error (exitCode gives its exit
// status); unlike execute it prints no error line and no -j error document.
func runRoot(args ...string) (stdout, stderr string, err error) {
	var out, errOut bytes.Buffer
	root := newRootCmd(&out, &errOut)
	root.SetArgs(args)
	err = root.Execute()
	return out.String(), errOut.String(), err
}

// runSub runs "qpdrain SUB ARGS..." and returns its stdout and error.
func runSub(sub string, args ...string) (string, error) {
	out, _, err := runRoot(append([]string{sub}, args...)...)
	return out, err
}

// writeFile writes content to path, failing t when it cannot, and returns
// path.
func writeFile(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// wantAll fails t for each of wants that out, the command's output (what
// names it in the message), does not contain.
func wantAll(t *testing.T, what, out string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("%s lacks %q:\n%s", what, want, out)
		}
	}
}

// runQpdrain runs the CLI in this process.
func runQpdrain(t *testing.T, args ...string) (string, error) {
	t.Helper()
	stdout, stderr, err := runRoot(args...)
	if err != nil {
		t.Logf("qpdrain %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return stdout, err
}

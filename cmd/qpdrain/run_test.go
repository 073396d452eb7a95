package main

import (
	"bytes"
	"encoding/json"
	"os"
	"slices"
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

// runCLI runs qpdrain as main does, with signals from sig.
func runCLI(sig chan os.Signal, args ...string) (stdout, stderr string, code int) {
	var out, errOut bytes.Buffer
	code = execute(args, &out, &errOut, sig)
	return out.String(), errOut.String(), code
}

// badInput is a command line qpdrain must refuse before any work, the exit
// code it must give and what its error must say. DIR in args is replaced by
// a fresh directory, which must stay empty.
type badInput struct {
	args []string
	code int
	says string
}

// wantRefused runs qpdrain as main does on prefix followed by each case's
// args, and fails t unless it keeps the contract for bad input: exit
// c.code, one line on stderr saying c.says, nothing on stdout (with -j: one
// JSON error document with the error and the code), and nothing left in DIR.
func wantRefused(t *testing.T, prefix []string, cases []badInput) {
	t.Helper()
	for _, c := range cases {
		dir := t.TempDir()
		args := slices.Concat(prefix, c.args)
		for i, a := range args {
			args[i] = strings.ReplaceAll(a, "DIR", dir)
		}
		stdout, stderr, code := runCLI(nil, args...)
		if code != c.code {
			t.Errorf("qpdrain %q: exit %d, want %d (stderr %q)", args, code, c.code, stderr)
		}
		if !strings.HasPrefix(stderr, "qpdrain: ") || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, c.says) {
			t.Errorf("qpdrain %q: stderr %q, want one line saying %q", args, stderr, c.says)
		}
		if wantsJSON(args) {
			var doc errorJSON
			dec := json.NewDecoder(strings.NewReader(stdout))
			if err := dec.Decode(&doc); err != nil || dec.More() || doc.ExitCode != c.code || !strings.Contains(doc.Error, c.says) {
				t.Errorf("qpdrain %q: stdout %q, want one JSON error document (%v)", args, stdout, err)
			}
		} else if stdout != "" {
			t.Errorf("qpdrain %q printed %q", args, stdout)
		}
		if left, _ := os.ReadDir(dir); len(left) != 0 {
			t.Errorf("qpdrain %q left %v in its directory", args, left)
		}
	}
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

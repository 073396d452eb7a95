package main

import "bytes"

// runRoot runs qpdrain's command tree on args and returns what it wrote to
// stdout and stderr and the command's error (exitCodeOf gives its exit
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

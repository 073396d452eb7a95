package main

// The operator contract, the same for every subcommand:
//
//   - every flag and argument is checked when it is read, before any work
//     or side effect (the flag types below), and 0 is either meaningful
//     (and documented) or refused;
//   - exit codes: 0 clean, 1 findings, 2 error or bad input, 3 the device
//     (or RDMA) is not here, 4 a verbs call hung (check), 130 interrupted
//     (SIGINT or SIGTERM); a command whose normal end is a signal (the
//     exporter) exits 0;
//   - an error is one line on stderr, "qpdrain: ..."; with -j, when the
//     command printed nothing, it is also one JSON document on stdout,
//     {"error": ..., "exit_code": ...};
//   - files are written whole or not at all (writeFileAtomic).

import (
	"context"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/leaks"
	"github.com/qpdrain/qpdrain/rdmanl/inventory"
)

// Exit codes an operator can script against.
const (
	exitClean       = 0
	exitFindings    = 1
	exitError       = 2
	exitUnsupported = 3
	// exitHung: a verbs call did not return in time, so the device may be
	// wedged (qpdrain check --call-timeout).
	exitHung = 4
	// exitInterrupted is the shell's 128 + SIGINT.
	exitInterrupted = 130
)

// exitCodeError carries a specific exit code out of a subcommand.
type exitCodeError struct {
	code int
	err  error
}

func (e *exitCodeError) Error() string { return e.err.Error() }
func (e *exitCodeError) Unwrap() error { return e.err }

// withExitCode attaches an exit code to err.
func withExitCode(code int, err error) error { return &exitCodeError{code: code, err: err} }

// errNotHere are the errors that mean the device, or RDMA, is not on this
// machine: exit 3 whichever command meets them.
var errNotHere = []error{ibv.ErrNoDevice, inventory.ErrNoSuchDevice, inventory.ErrNoDevices, leaks.ErrNoRDMA, errNoVerbs}

// errNoVerbs: the device asked for needs libibverbs, which this build or
// machine cannot use.
var errNoVerbs = errors.New("libibverbs cannot be used here")

// exitCode is the exit status of err.
func exitCode(err error) int {
	if err == nil {
		return exitClean
	}
	for _, e := range errNotHere {
		if errors.Is(err, e) {
			return exitUnsupported
		}
	}
	var ec *exitCodeError
	if errors.As(err, &ec) {
		return ec.code
	}
	return exitError
}

// errInterrupted is what a command stopped by a signal ends with.
var errInterrupted = errors.New("interrupted")

// countingWriter tells whether anything was written through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// errorJSON is the -j document of a command that failed before printing one.
type errorJSON struct {
	Error    string `json:"error"`
	ExitCode int    `json:"exit_code"`
}

// printJSON writes v as -j prints a command's document: indented, and with
// <, > and & as they are, since observations and traces say "->".
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// execute runs qpdrain with args and returns its exit status. A value on sig
// (SIGINT, SIGTERM) cancels the command's context: the command stops at its
// next check, and exits 130 with one line, unless it ends cleanly (nil).
func execute(args []string, stdout, stderr io.Writer, sig <-chan os.Signal) int {
	out := &countingWriter{w: stdout}
	root, opts := newRoot(out, stderr)
	root.SetArgs(args)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var interrupted atomic.Bool
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-sig:
			interrupted.Store(true)
			cancel()
		case <-stopped:
		}
	}()
	err := root.ExecuteContext(ctx)
	cancel()
	if err != nil && interrupted.Load() {
		err = withExitCode(exitInterrupted, errInterrupted)
	}
	code := exitCode(err)
	if err == nil {
		return code
	}
	msg := oneLine(err.Error())
	if code != exitFindings {
		fmt.Fprintln(stderr, "qpdrain:", msg)
	}
	if (opts.json || wantsJSON(args)) && out.n == 0 {
		enc := json.NewEncoder(stdout)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(errorJSON{Error: msg, ExitCode: code})
	}
	return code
}

// cmdContext is the command's context, or a background one.
func cmdContext(cmd *cobra.Command) context.Context {
	if ctx := cmd.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}

// wantsJSON reports whether args ask for -j, for an error met before the
// flags are parsed.
func wantsJSON(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if a == "--json" || a == "--json=true" || len(a) > 1 && a[0] == '-' && a[1] != '-' && strings.ContainsRune(a[1:], 'j') && !strings.ContainsAny(a[1:], "=") {
			return true
		}
	}
	return false
}

// oneLine joins a multi-line message (cobra's suggestions) into one line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// requireSubcommand makes a command that only groups subcommands refuse an
// unknown one (exit 2, one line) instead of printing its help and exiting
// 0; without arguments it prints its help.
func requireSubcommand(cmd *cobra.Command) {
	for _, c := range cmd.Commands() {
		requireSubcommand(c)
	}
	if !cmd.HasSubCommands() || cmd.Runnable() {
		return
	}
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if len(args) == 0 {
			return c.Help()
		}
		var names []string
		for _, s := range c.Commands() {
			if s.IsAvailableCommand() {
				names = append(names, s.Name())
			}
		}
		return withExitCode(exitError, fmt.Errorf("unknown command %q for %q: want one of %s", args[0], c.CommandPath(), strings.Join(names, ", ")))
	}
}

// checkedValue is a flag whose value is checked when it is set, so that a
// bad value is refused (exit 2, one line, by cobra's flag error) before
// the command does anything.
type checkedValue[T any] struct {
	p     *T
	typ   string
	parse func(string) (T, error)
	// worded: parse's error is written for the operator (it names the
	// valid words), so it is passed on instead of "not a <typ>".
	worded bool
	check  func(T) error
	format func(T) string
}

func (v *checkedValue[T]) Set(s string) error {
	x, err := v.parse(s)
	if err != nil && v.worded {
		return err
	}
	if err != nil {
		return fmt.Errorf("not a %s", v.typ)
	}
	if err := v.check(x); err != nil {
		return err
	}
	*v.p = x
	return nil
}

func (v *checkedValue[T]) Type() string   { return v.typ }
func (v *checkedValue[T]) String() string { return v.format(*v.p) }

// intFlag defines an int flag whose value must pass check.
func intFlag(f *pflag.FlagSet, p *int, name string, def int, usage string, check func(int) error) {
	*p = def
	f.Var(&checkedValue[int]{p: p, typ: "int", parse: strconv.Atoi, check: check, format: strconv.Itoa}, name, usage)
}

// durationFlag defines a duration flag whose value must pass check.
func durationFlag(f *pflag.FlagSet, p *time.Duration, name string, def time.Duration, usage string, check func(time.Duration) error) {
	*p = def
	f.Var(&checkedValue[time.Duration]{p: p, typ: "duration", parse: time.ParseDuration, check: check,
		format: func(d time.Duration) string {
			if d == 0 {
				return "0" // pflag prints no default for "0": the usage says what 0 is
			}
			return d.String()
		}}, name, usage)
}

// floatFlag defines a float flag whose value must pass check (NaN and the
// infinities never do).
func floatFlag(f *pflag.FlagSet, p *float64, name string, def float64, usage string, check func(float64) error) {
	*p = def
	f.Var(&checkedValue[float64]{p: p, typ: "float",
		parse: func(s string) (float64, error) { return strconv.ParseFloat(s, 64) },
		check: func(x float64) error {
			if math.IsNaN(x) || math.IsInf(x, 0) {
				return errors.New("want a finite number")
			}
			return check(x)
		},
		format: func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }}, name, usage)
}

// atLeast refuses integers below lo.
func atLeast(lo int) func(int) error {
	return func(n int) error {
		if n < lo {
			return fmt.Errorf("want at least %d", lo)
		}
		return nil
	}
}

// between refuses integers outside [lo, hi].
func between(lo, hi int) func(int) error {
	return func(n int) error {
		if n < lo || n > hi {
			return fmt.Errorf("want %d to %d", lo, hi)
		}
		return nil
	}
}

// positive refuses durations of 0 or less.
func positive(d time.Duration) error {
	if d <= 0 {
		return errors.New("want a positive duration")
	}
	return nil
}

// atLeastDuration refuses durations below lo.
func atLeastDuration(lo time.Duration) func(time.Duration) error {
	return func(d time.Duration) error {
		if d < lo {
			return fmt.Errorf("want at least %v", lo)
		}
		return nil
	}
}

// positiveFloat refuses numbers of 0 or less.
func positiveFloat(x float64) error {
	if x <= 0 {
		return errors.New("want a number above 0")
	}
	return nil
}

// fraction refuses numbers outside [0, 1]; open refuses 0 too.
func fraction(open bool) func(float64) error {
	return func(x float64) error {
		if x < 0 || x > 1 || open && x == 0 {
			if open {
				return errors.New("want a fraction in (0, 1]")
			}
			return errors.New("want a fraction from 0 to 1")
		}
		return nil
	}
}

// nonEmpty refuses "".
func nonEmpty(s string) error {
	if s == "" {
		return errors.New("want a value, not an empty string")
	}
	return nil
}

// oneOf refuses a word that is not one of words.
func oneOf(words ...string) func(string) error {
	return func(s string) error {
		for _, w := range words {
			if s == w {
				return nil
			}
		}
		return fmt.Errorf("want one of %s", strings.Join(words, ", "))
	}
}

// wordFlag defines a flag whose value is one of a set of words, read by
// parse (an enum's Parse function, or parseText for an enum with
// UnmarshalText), whose error names the word and the valid ones.
func wordFlag[T any](f *pflag.FlagSet, p *T, name string, def T, usage string, parse func(string) (T, error)) {
	*p = def
	f.Var(&checkedValue[T]{p: p, typ: "string", parse: parse, worded: true, check: func(T) error { return nil },
		format: func(x T) string { return fmt.Sprint(x) }}, name, usage)
}

// parseText reads an enum through its UnmarshalText, for wordFlag.
func parseText[T any, P interface {
	*T
	encoding.TextUnmarshaler
}](s string) (T, error) {
	var x T
	err := P(&x).UnmarshalText([]byte(s))
	return x, err
}

// stringFlag defines a string flag whose value must pass check.
func stringFlag(f *pflag.FlagSet, p *string, name, def, usage string, check func(string) error) {
	*p = def
	f.Var(&checkedValue[string]{p: p, typ: "string", parse: func(s string) (string, error) { return s, nil },
		check: check, format: func(s string) string { return s }}, name, usage)
}

// stringsFlag defines a repeatable string flag, each of whose values must
// pass check; the first value given replaces def.
func stringsFlag(f *pflag.FlagSet, p *[]string, name string, def []string, usage string, check func(string) error) {
	*p = def
	f.Var(&checkedStrings{p: p, check: check}, name, usage)
}

// checkedStrings is the value of a stringsFlag.
type checkedStrings struct {
	p     *[]string
	set   bool
	check func(string) error
}

func (v *checkedStrings) Set(s string) error {
	if err := v.check(s); err != nil {
		return err
	}
	if !v.set {
		*v.p, v.set = nil, true
	}
	*v.p = append(*v.p, s)
	return nil
}

func (v *checkedStrings) Type() string   { return "stringArray" }
func (v *checkedStrings) String() string { return "[" + strings.Join(*v.p, ",") + "]" }

// outputFile returns a check of a file the command will write: its
// extension is one of exts (any case; none when exts is empty), it is not
// a directory (the rename that writes it would fail), and its directory
// exists and takes a new file, so that the command fails before its work,
// not after it.
func outputFile(exts ...string) func(string) error {
	return func(path string) error {
		if path == "" {
			return errors.New("want a file name")
		}
		if st, err := os.Stat(path); err == nil && st.IsDir() {
			return fmt.Errorf("%s is a directory: want a file name", path)
		}
		if len(exts) > 0 && fileKind(path, exts...) == "" {
			return fmt.Errorf("want a file name ending in %s", strings.Join(exts, " or "))
		}
		return writableDir(filepath.Dir(path))
	}
}

// fileKind is the one of exts path ends in, compared without case, or "".
func fileKind(path string, exts ...string) string {
	for _, e := range exts {
		if strings.EqualFold(filepath.Ext(path), e) {
			return e
		}
	}
	return ""
}

// writableDir fails unless dir is a directory a file can be created in: it
// creates and removes an empty temporary file there.
func writableDir(dir string) error {
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("directory %s: %w", dir, errors.Unwrap(err))
	}
	if !st.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	f, err := os.CreateTemp(dir, ".qpdrain-probe-*")
	if err != nil {
		return fmt.Errorf("directory %s takes no new file: %w", dir, errors.Unwrap(err))
	}
	name := f.Name()
	return errors.Join(f.Close(), os.Remove(name))
}

// writeFileAtomic writes path through write: into a temporary file in the
// same directory, synced, then renamed over path, so that path is either
// the old file or the whole new one, never a truncated one (a full disk).
// A path that exists and is not a regular file (/dev/null, a FIFO) is
// written in place: a rename would replace it (as root, /dev/null itself).
func writeFileAtomic(path string, write func(io.Writer) error) (err error) {
	if st, err := os.Stat(path); err == nil && !st.Mode().IsRegular() && !st.IsDir() {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
		if err := write(f); err != nil {
			f.Close()
			return fmt.Errorf("writing %s: %w", path, err)
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
		return nil
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			os.Remove(tmp)
			err = fmt.Errorf("writing %s: %w", path, err)
		}
	}()
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// plural is "1 deviation", "2 deviations".
func plural(n int, word string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}

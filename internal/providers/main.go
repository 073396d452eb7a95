// Command providers keeps docs/PROVIDERS.md's tables of `qpdrain check`
// true to the check's own runs: the JSON of `qpdrain check -j` recorded per
// device (testdata/providers/soft.json, rxe-<kernel>.json) is the source,
// and the tables between the doc's marker comments are rendered from it.
//
//	go run ./internal/providers record -out DIR [-replace] < vm-output
//	go run ./internal/providers render [-records DIR] [-doc FILE] [-check]
//
// record reads the output of `qpdrain vm run` whose guest command wraps
// `qpdrain check --device rxe0 -j` in the markers of scripts/rxe/check-record.sh
// and writes one record per kernel; -replace removes the rxe records of
// kernels the run did not cover. render rewrites the tables; -check only
// compares and fails when they differ. `make providers` and
// `make providers-rxe` run them.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Marker lines: the guest command prints BeginMark, the check's JSON, then
// EndMark followed by " exit=N".
const (
	BeginMark = "@@qpdrain-check-json begin"
	EndMark   = "@@qpdrain-check-json end"
)

// ErrNoRecord is returned when the output holds no complete record.
var ErrNoRecord = errors.New("no qpdrain check record")

// ErrStale is returned by render -check when the doc's tables differ from
// the records.
var ErrStale = errors.New("docs/PROVIDERS.md's tables differ from the records")

// Record is the part of `qpdrain check -j` the tables show.
type Record struct {
	Device string `json:"ifname"`
	Soft   bool   `json:"soft"`
	Probes []struct {
		Name     string `json:"name"`
		Outcome  string `json:"outcome"`
		Observed string `json:"observed"`
	} `json:"probes"`
	Settings []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"settings"`
}

// column is one record with the column header it is shown under.
type column struct {
	header string
	kernel []int // the release's numbers, for the order; nil for soft
	rec    Record
}

func main() {
	if err := run(os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "providers:", err)
		os.Exit(1)
	}
}

func run(args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: providers record|render [flags]")
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	switch args[0] {
	case "record":
		out := fs.String("out", "testdata/providers", "directory of the records")
		replace := fs.Bool("replace", false, "remove the rxe records of kernels this output does not cover")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		recs, err := ParseVMOutput(stdin)
		if err != nil {
			return err
		}
		written, err := WriteRecords(*out, recs, *replace)
		for _, f := range written {
			fmt.Fprintln(stdout, "providers: recorded", f)
		}
		return err
	case "render":
		records := fs.String("records", "testdata/providers", "directory of the records")
		doc := fs.String("doc", "docs/PROVIDERS.md", "the document whose tables are rendered")
		check := fs.Bool("check", false, "only compare: fail when the tables differ from the records")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		old, err := os.ReadFile(*doc)
		if err != nil {
			return err
		}
		updated, err := RenderDoc(old, *records)
		if err != nil {
			return err
		}
		if bytes.Equal(old, updated) {
			return nil
		}
		if *check {
			return fmt.Errorf("%w (%s from %s): run make providers", ErrStale, *doc, *records)
		}
		fmt.Fprintln(stdout, "providers: rendered the tables of", *doc)
		return os.WriteFile(*doc, updated, 0o644)
	}
	return fmt.Errorf("unknown subcommand %q: want record or render", args[0])
}

// tagged is a line of qpdrain vm's output: "[KERNEL] guest line".
var tagged = regexp.MustCompile(`^\[([^\]\s]+)\] (.*)$`)

// ParseVMOutput returns the check's JSON per kernel from qpdrain vm's
// output. A record whose JSON is not a check's, or whose check exited with
// a status other than 0 (every probe passed) or 1 (deviations), is an
// error; so is output with no record at all (ErrNoRecord).
func ParseVMOutput(r io.Reader) (map[string][]byte, error) {
	open := map[string]*bytes.Buffer{}
	recs := map[string][]byte{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		m := tagged.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		kernel, line := m[1], m[2]
		switch buf := open[kernel]; {
		case line == BeginMark:
			open[kernel] = &bytes.Buffer{}
		case buf == nil:
		case strings.HasPrefix(line, EndMark):
			delete(open, kernel)
			status := strings.TrimPrefix(line, EndMark+" exit=")
			if status != "0" && status != "1" {
				return nil, fmt.Errorf("kernel %s: qpdrain check exited with %q, want 0 or 1 (its record is not kept)", kernel, status)
			}
			if _, err := decode(buf.Bytes()); err != nil {
				return nil, fmt.Errorf("kernel %s: %w", kernel, err)
			}
			recs[kernel] = buf.Bytes()
		default:
			buf.WriteString(line + "\n")
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading qpdrain vm's output: %w", err)
	}
	for kernel := range open {
		return nil, fmt.Errorf("kernel %s: the record has no end marker (the guest died in the check?)", kernel)
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("%w in qpdrain vm's output (markers %q, %q)", ErrNoRecord, BeginMark, EndMark)
	}
	return recs, nil
}

func decode(b []byte) (Record, error) {
	var rec Record
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("the record is not qpdrain check's JSON: %w", err)
	}
	if rec.Device == "" || len(rec.Probes) == 0 {
		return rec, errors.New("the record is not qpdrain check's JSON: no ifname or no probes")
	}
	return rec, nil
}

// WriteRecords writes each kernel's record as DIR/rxe-KERNEL.json and
// returns the files written. With replace it also removes DIR/rxe-*.json
// of the kernels recs does not hold.
func WriteRecords(dir string, recs map[string][]byte, replace bool) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var written []string
	keep := map[string]bool{}
	for kernel, b := range recs {
		f := filepath.Join(dir, "rxe-"+kernel+".json")
		if err := os.WriteFile(f, b, 0o644); err != nil {
			return written, err
		}
		keep[f] = true
		written = append(written, f)
	}
	sort.Strings(written)
	if !replace {
		return written, nil
	}
	old, err := filepath.Glob(filepath.Join(dir, "rxe-*.json"))
	if err != nil {
		return written, err
	}
	for _, f := range old {
		if !keep[f] {
			if err := os.Remove(f); err != nil {
				return written, err
			}
		}
	}
	return written, nil
}

// loadColumns reads DIR/soft.json and DIR/rxe-*.json: the soft device
// first, then the kernels in release order.
func loadColumns(dir string) ([]column, error) {
	files, err := filepath.Glob(filepath.Join(dir, "rxe-*.json"))
	if err != nil {
		return nil, err
	}
	files = append([]string{filepath.Join(dir, "soft.json")}, files...)
	var cols []column
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("reading the record: %w", err)
		}
		rec, err := decode(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		c := column{header: "Soft device", rec: rec}
		if kernel, ok := strings.CutPrefix(strings.TrimSuffix(filepath.Base(f), ".json"), "rxe-"); ok {
			c.header, c.kernel = "rxe, `"+kernel+"`", releaseNumbers(kernel)
		}
		cols = append(cols, c)
	}
	slices.SortStableFunc(cols[1:], func(a, b column) int { return slices.Compare(a.kernel, b.kernel) })
	return cols, nil
}

var number = regexp.MustCompile(`\d+`)

// releaseNumbers are the numbers of a kernel release in order:
// 6.12.95+deb12-amd64 gives 6 12 95 12.
func releaseNumbers(kernel string) []int {
	var ns []int
	for _, s := range number.FindAllString(kernel, -1) {
		n, _ := strconv.Atoi(s)
		ns = append(ns, n)
	}
	return ns
}

// cell escapes s for a Markdown table cell.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// union returns the names each record lists, in the order they first
// appear, each once.
func union(cols []column, names func(Record) []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, c := range cols {
		for _, n := range names(c.rec) {
			if !seen[n] {
				seen[n] = true
				out = append(out, n)
			}
		}
	}
	return out
}

// table renders a Markdown table with one row per name any record lists
// (names, in the order they first appear) and one column per record: head
// is the first column's title, row a name's first cell and at its cell in
// one record.
func table(cols []column, head string, names func(Record) []string, row func(string) string, at func(Record, string) string) string {
	var b strings.Builder
	b.WriteString("| " + head + " |")
	for _, c := range cols {
		b.WriteString(" " + c.header + " |")
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(cols)) + "\n")
	for _, name := range union(cols, names) {
		b.WriteString("| " + row(name) + " |")
		for _, c := range cols {
			b.WriteString(" " + at(c.rec, name) + " |")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// probeTable renders one row per probe (in the records' order) and
// one column per record: the outcome, bold when it is not a pass, and what
// the probe observed.
func probeTable(cols []column) string {
	return table(cols, "Probe", func(r Record) (ns []string) {
		for _, p := range r.Probes {
			ns = append(ns, p.Name)
		}
		return ns
	}, func(name string) string { return "`" + name + "`" }, probeCell)
}

func probeCell(rec Record, name string) string {
	for _, p := range rec.Probes {
		if p.Name == name {
			outcome := p.Outcome
			if outcome != "pass" {
				outcome = "**" + outcome + "**"
			}
			return outcome + ": " + cell(p.Observed)
		}
	}
	return "not in this record"
}

// settingsTable renders the drain settings (flushcheck.Settings) each
// record's findings imply, one row per setting any record has ("-" where
// a record has none: flushcheck.Settings names some only when they apply).
func settingsTable(cols []column) string {
	return table(cols, "Setting", func(r Record) (ns []string) {
		for _, s := range r.Settings {
			ns = append(ns, s.Name)
		}
		return ns
	}, cell, settingCell)
}

func settingCell(rec Record, name string) string {
	for _, o := range rec.Settings {
		if o.Name == name {
			return "`" + cell(o.Value) + "`"
		}
	}
	return "-"
}

// The tables RenderDoc fills, each between "<!-- providers:NAME begin -->"
// and "<!-- providers:NAME end -->".
var tables = []struct {
	name   string
	render func([]column) string
}{
	{"probes", probeTable},
	{"settings", settingsTable},
}

// ErrMarkers is returned for a document without a table's marker comments,
// or with them out of order.
var ErrMarkers = errors.New("missing or misplaced marker comments")

// RenderDoc returns doc with every table between its markers rendered from
// the records in dir.
func RenderDoc(doc []byte, dir string) ([]byte, error) {
	cols, err := loadColumns(dir)
	if err != nil {
		return nil, err
	}
	out := doc
	for _, t := range tables {
		begin := []byte("<!-- providers:" + t.name + " begin -->\n")
		end := []byte("<!-- providers:" + t.name + " end -->")
		i, j := bytes.Index(out, begin), bytes.Index(out, end)
		if i < 0 || j < i+len(begin) || bytes.Count(out, begin) != 1 || bytes.Count(out, end) != 1 {
			return nil, fmt.Errorf("table %q: %w (%q ... %q, once each)", t.name, ErrMarkers, bytes.TrimSpace(begin), end)
		}
		out = bytes.Join([][]byte{out[:i+len(begin)], []byte(t.render(cols)), out[j:]}, nil)
	}
	return out, nil
}

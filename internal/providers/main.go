// Command providers keeps docs/PROVIDERS.md's tables of `qpdrain check`
// true to the check's own runs: the JSON of `qpdrain check -j` recorded per
// device (testdata/providers/soft.json, soft-iwarp.json, rxe-<kernel>.json,
// siw-<kernel>.json)
// is the source,
// and the tables between the doc's marker comments are rendered from it.
//
//	go run ./internal/providers record -out DIR [-replace] < vm-output
//	go run ./internal/providers render [-records DIR] [-doc FILE] [-check]
//
// record reads the output of `qpdrain vm run` whose guest command wraps
// `qpdrain check --device rxe0 -j` (or siw0) in the markers of
// scripts/rxe/check-guest.sh and writes one record per provider and kernel;
// -replace removes the records of the run's providers on kernels of the
// default matrix the run did not cover. Runs of one probe
// each (scripts/rxe/check-record.sh with RXE_CHECK_EACH=1, for a kernel whose
// rxe can wedge the guest) merge into one record, a probe whose VM never
// finished it shown as locked. render rewrites the tables; -check only
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
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/qpdrain/qpdrain/vm"
)

// Marker lines: the guest command prints BeginMark (followed by
// " device=NAME", rxe0 when absent, and " probe=NAME" when the run is for
// that probe alone), the check's JSON,
// then EndMark followed by " exit=STATUS": the check's exit status, or
// "stuck" when it wrote its record but its process did not exit.
const (
	BeginMark = "@@qpdrain-check-json begin"
	EndMark   = "@@qpdrain-check-json end"
)

// Locked is the outcome a merged record gives a probe whose VM never
// finished it: the guest wedged (a soft lockup in the provider, say) before
// the check could report even a hung call.
const Locked = "locked"

// complaint matches the kernel's lines that say it is in trouble, as
// vm/scripts/run-vm.sh looks for the first one.
var complaint = regexp.MustCompile(`BUG:|Oops|general protection|Kernel panic|soft lockup|self-detected stall|rcu: INFO|blocked for more than|hung_task`)

// dmesgTime is the timestamp the kernel puts before each line, with what
// came before it on the line (check-guest.sh's "kernel log, first complaint:").
var dmesgTime = regexp.MustCompile(`^.*?\[\s*\d+\.\d+\]\s*`)

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
	header   string
	provider int   // the index in providers, for the order
	kernel   []int // the release's numbers, for the order; nil for soft
	rec      Record
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

// Key names a record: the provider (the device's name without its
// number: rxe, siw) and the kernel the check ran on.
type Key struct{ Provider, Kernel string }

// File is the record's name, PROVIDER-KERNEL.json.
func (k Key) File() string { return k.Provider + "-" + k.Kernel + ".json" }

// providers are the providers whose records are columns, in their order.
var providers = []string{"rxe", "siw"}

// parseBegin parses what follows BeginMark: " device=NAME" and
// " probe=NAME", each optional, in this order. ok is false for a line
// that is not a marker.
func parseBegin(rest string) (device, probe string, ok bool) {
	device = "rxe0" // the markers before siw named no device
	if r, found := strings.CutPrefix(rest, " device="); found {
		device, rest, _ = strings.Cut(r, " ")
		if rest != "" {
			rest = " " + rest
		}
	}
	if rest != "" && !strings.HasPrefix(rest, " probe=") {
		return "", "", false
	}
	return device, strings.TrimPrefix(rest, " probe="), device != ""
}

// checkRun is one check in one guest, from its BeginMark on.
type checkRun struct {
	probe     string       // the probe the run is for alone; "" for the whole check
	json      bytes.Buffer // the check's JSON, complete when status is set
	status    string       // EndMark's exit status; "" while (or when never) seen
	complaint string       // the kernel's first complaint after BeginMark
}

// ParseVMOutput returns the check's JSON per provider and kernel from qpdrain vm's
// output. The check's exit statuses 0 (every probe passed), 1
// (deviations), 4 (a verbs call hung) and "stuck" (its process did not exit
// after its record) keep the record; another status, or JSON that is not a
// check's, is an error; so is output with no record at all (ErrNoRecord).
// A kernel with runs of one probe each gets one record merged from them
// (mergeRuns); otherwise a record without its end marker is an error.
func ParseVMOutput(r io.Reader) (map[Key][]byte, error) {
	runs := map[Key][]*checkRun{}
	current := map[string]Key{} // the run each kernel's lines belong to
	var keys []Key
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		m := tagged.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		kernel, line := m[1], m[2]
		if rest, ok := strings.CutPrefix(line, BeginMark); ok {
			if device, probe, ok := parseBegin(rest); ok {
				k := Key{strings.TrimRight(device, "0123456789"), kernel}
				if runs[k] == nil {
					keys = append(keys, k)
				}
				runs[k] = append(runs[k], &checkRun{probe: probe})
				current[kernel] = k
				continue
			}
		}
		rs := runs[current[kernel]]
		if len(rs) == 0 {
			continue
		}
		cr := rs[len(rs)-1]
		switch {
		case cr.status == "" && strings.HasPrefix(line, EndMark):
			cr.status = strings.TrimPrefix(line, EndMark+" exit=")
			switch cr.status {
			case "0", "1", "4", "stuck":
			default:
				return nil, fmt.Errorf("%s on kernel %s: qpdrain check exited with %q, want 0, 1, 4 or stuck (its record is not kept)", current[kernel].Provider, kernel, cr.status)
			}
			if _, err := decode(cr.json.Bytes()); err != nil {
				return nil, fmt.Errorf("%s on kernel %s: %w", current[kernel].Provider, kernel, err)
			}
		case cr.status == "":
			cr.json.WriteString(line + "\n")
		}
		if cr.complaint == "" && complaint.MatchString(line) {
			cr.complaint = dmesgTime.ReplaceAllString(strings.TrimSpace(line), "")
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading qpdrain vm's output: %w", err)
	}
	recs := map[Key][]byte{}
	for _, k := range keys {
		rs := runs[k]
		if len(rs) == 1 && rs[0].probe == "" {
			if rs[0].status == "" {
				return nil, fmt.Errorf("%s on kernel %s: the record has no end marker (the guest died in the check?)", k.Provider, k.Kernel)
			}
			recs[k] = rs[0].json.Bytes()
			continue
		}
		b, err := mergeRuns(rs)
		if err != nil {
			return nil, fmt.Errorf("%s on kernel %s: %w", k.Provider, k.Kernel, err)
		}
		recs[k] = b
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("%w in qpdrain vm's output (markers %q, %q)", ErrNoRecord, BeginMark, EndMark)
	}
	return recs, nil
}

// counts are the check's JSON keys that count the probes of each outcome.
var counts = map[string]string{"pass": "pass", "deviation": "deviations", "error": "errors", "hung": "hung", "not-run": "not_run", "skipped": "skipped",
	NotApplicable: "not_applicable", Locked: "locked"}

// NotApplicable is the outcome of a probe whose rule the device's
// transport does not have (flushcheck.NotApplicable): shown as such, not
// as a finding.
const NotApplicable = "not-applicable"

// mergeRuns merges runs of one probe each into one record: the first
// complete run's, each probe's entry taken from the run that ran it. A run
// that never ended (the guest wedged, or its VM was killed at its deadline)
// makes its probe Locked; the kernel's first complaint in a run is added to
// its probe's observation, and so is a process that did not exit. The
// counts are recounted; the drain settings are left out, since no run saw
// every probe.
func mergeRuns(rs []*checkRun) ([]byte, error) {
	var rec map[string]any
	for _, cr := range rs {
		if cr.status != "" {
			if err := json.Unmarshal(cr.json.Bytes(), &rec); err != nil {
				return nil, fmt.Errorf("the record is not qpdrain check's JSON: %w", err)
			}
			break
		}
	}
	if rec == nil {
		return nil, errors.New("no run of the check ended: no record to merge into")
	}
	probes, _ := rec["probes"].([]any)
	entry := func(name string) map[string]any {
		for _, p := range probes {
			if e, ok := p.(map[string]any); ok && e["name"] == name {
				return e
			}
		}
		return nil
	}
	for _, cr := range rs {
		if cr.probe == "" {
			return nil, errors.New("a run of the whole check among runs of one probe each")
		}
		e := entry(cr.probe)
		if e == nil {
			return nil, fmt.Errorf("probe %q: not in the check's record", cr.probe)
		}
		note := ""
		if cr.complaint != "" {
			note = "; the kernel: " + cr.complaint
		}
		if cr.status == "" {
			e["outcome"], e["observed"], e["duration_ns"] = Locked, "the guest never finished the probe: no record before the VM's deadline"+note, 0
			continue
		}
		var run struct {
			Probes []map[string]any `json:"probes"`
		}
		if err := json.Unmarshal(cr.json.Bytes(), &run); err != nil {
			return nil, fmt.Errorf("probe %q: the record is not qpdrain check's JSON: %w", cr.probe, err)
		}
		for _, p := range run.Probes {
			if p["name"] == cr.probe {
				if cr.status == "stuck" {
					note = "; the process did not exit after its record" + note
				}
				p["observed"] = fmt.Sprint(p["observed"]) + note
				maps.Copy(e, p)
			}
		}
	}
	for _, key := range counts {
		rec[key] = 0
	}
	for _, p := range probes {
		if e, ok := p.(map[string]any); ok {
			if key, ok := counts[fmt.Sprint(e["outcome"])]; ok {
				rec[key] = rec[key].(int) + 1
			}
		}
	}
	rec["run"], rec["settings"], rec["drain_options"] = "each probe in a VM of its own", []any{}, map[string]any{}
	b, err := json.MarshalIndent(rec, "", "  ")
	return append(b, '\n'), err
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

// WriteRecords writes each record as DIR/PROVIDER-KERNEL.json (Key.File)
// and returns the files written. With replace it also removes the
// DIR/PROVIDER-*.json of recs' providers on the kernels recs does not hold.
func WriteRecords(dir string, recs map[Key][]byte, replace bool) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var written []string
	keep := map[string]bool{}
	ran := map[string]bool{}
	for key, b := range recs {
		if k, ok := offMatrix(key.Kernel); ok {
			key.Kernel = k.Name // one record whatever its ABI number: not refreshed by make providers-rxe
		}
		f := filepath.Join(dir, key.File())
		if err := os.WriteFile(f, b, 0o644); err != nil {
			return written, err
		}
		keep[f], ran[key.Provider] = true, true
		written = append(written, f)
	}
	sort.Strings(written)
	if !replace {
		return written, nil
	}
	for _, p := range slices.Sorted(maps.Keys(ran)) {
		if err := removeOthers(dir, p, keep); err != nil {
			return written, err
		}
	}
	return written, nil
}

// removeOthers removes DIR/PROVIDER-*.json of the default matrix's kernels
// but the files keep holds.
func removeOthers(dir, provider string, keep map[string]bool) error {
	old, err := filepath.Glob(filepath.Join(dir, provider+"-*.json"))
	if err != nil {
		return err
	}
	for _, f := range old {
		_, off := offMatrix(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), provider+"-"), ".json"))
		if !keep[f] && !off {
			if err := os.Remove(f); err != nil {
				return err
			}
		}
	}
	return nil
}

// softIWARP is the record of the soft device with siw's rules
// (`qpdrain check --device soft:iwarp -j`), a column of its own when
// present.
const softIWARP = "soft-iwarp.json"

// loadColumns reads DIR/soft.json, DIR/soft-iwarp.json when present,
// DIR/rxe-*.json and DIR/siw-*.json: the soft device first, then each
// provider's kernels in release order.
func loadColumns(dir string) ([]column, error) {
	var files []string
	for _, p := range providers {
		fs, err := filepath.Glob(filepath.Join(dir, p+"-*.json"))
		if err != nil {
			return nil, err
		}
		files = append(files, fs...)
	}
	first := []string{filepath.Join(dir, "soft.json")}
	if _, err := os.Stat(filepath.Join(dir, softIWARP)); err == nil {
		first = append(first, filepath.Join(dir, softIWARP))
	}
	files = append(first, files...)
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
		if filepath.Base(f) == softIWARP {
			c.header = "Soft device, iWARP (siw's rules, through its RDMA CM)"
		}
		for i, p := range providers {
			if kernel, ok := strings.CutPrefix(strings.TrimSuffix(filepath.Base(f), ".json"), p+"-"); ok {
				c.header, c.provider, c.kernel = p+", `"+kernel+"`", i, releaseNumbers(kernel)
				if k, ok := offMatrix(kernel); ok {
					c.header += " (" + k.Suite + "; not in the default matrix)"
				}
			}
		}
		cols = append(cols, c)
	}
	slices.SortStableFunc(cols[len(first):], func(a, b column) int {
		if a.provider != b.provider {
			return a.provider - b.provider
		}
		return slices.Compare(a.kernel, b.kernel)
	})
	return cols, nil
}

// offMatrix returns the kernel of vm.Kernels outside the default matrix that
// kernel (a name, or a release such as 5.10.0-32-amd64) is.
func offMatrix(kernel string) (vm.Kernel, bool) {
	for _, k := range vm.Kernels {
		if !k.Default && (kernel == k.Name || strings.HasPrefix(kernel, k.Name+".")) {
			return k, true
		}
	}
	return vm.Kernel{}, false
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
// one column per record: the outcome, bold when it is a finding (not a
// pass, nor not-applicable, which is in italics), and what the probe
// observed (for not-applicable, why, with its source).
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
			switch outcome {
			case "pass":
			case NotApplicable:
				outcome = "_" + outcome + "_"
			default:
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
	// A record merged from runs of one probe each has no settings: no column.
	cols = slices.DeleteFunc(slices.Clone(cols), func(c column) bool { return len(c.rec.Settings) == 0 })
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

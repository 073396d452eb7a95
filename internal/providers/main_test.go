package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestDocMatchesRecords: docs/PROVIDERS.md's tables are what the records in
// testdata/providers render to. A record refreshed (make providers,
// make providers-rxe) without rendering, or a table edited by hand, fails.
func TestDocMatchesRecords(t *testing.T) {
	doc, err := os.ReadFile("../../docs/PROVIDERS.md")
	if err != nil {
		t.Fatal(err)
	}
	want, err := RenderDoc(doc, "../../testdata/providers")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(doc, want) {
		t.Errorf("docs/PROVIDERS.md's tables differ from testdata/providers: run make providers\n%s", firstDiff(doc, want))
	}
}

// firstDiff shows the first line where got and want differ.
func firstDiff(got, want []byte) string {
	g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := range min(len(g), len(w)) {
		if g[i] != w[i] {
			return "line " + strconv.Itoa(i+1) + ":\n  doc:      " + g[i] + "\n  rendered: " + w[i]
		}
	}
	return "the documents differ in length"
}

const probeJSON = `{
  "ifname": "rxe0",
  "soft": false,
  "probes": [
    {"name": "recv-in-error", "outcome": "deviation", "observed": "never completed | not even later"},
    {"name": "drain-wr", "outcome": "pass", "observed": "drain WR completed"}
  ],
  "settings": [{"name": "Policy", "value": "quarantine"}]
}`

// rxe is the key of rxe's record on kernel.
func rxe(kernel string) Key { return Key{"rxe", kernel} }

// vmOutput wraps probeJSON as qpdrain vm prints the guest's lines.
func vmOutput(kernel, status string) string { return vmOutputOn(kernel, "", status) }

// vmOutputOn is vmOutput with the begin marker naming device ("": none).
func vmOutputOn(kernel, device, status string) string {
	var b strings.Builder
	mark := BeginMark
	if device != "" {
		mark += " device=" + device
	}
	b.WriteString("[" + kernel + "] == command (3.1s)\n[" + kernel + "] " + mark + "\n")
	for _, l := range strings.Split(probeJSON, "\n") {
		b.WriteString("[" + kernel + "] " + l + "\n")
	}
	b.WriteString("vm: still running\n[" + kernel + "] " + EndMark + " exit=" + status + "\n")
	return b.String()
}

func TestParseVMOutput(t *testing.T) {
	recs, err := ParseVMOutput(strings.NewReader(vmOutput("6.1.0-57-amd64", "1") + vmOutput("7.3.4+deb13-amd64", "0")))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || string(recs[rxe("6.1.0-57-amd64")]) != probeJSON+"\n" || string(recs[rxe("7.3.4+deb13-amd64")]) != probeJSON+"\n" {
		t.Errorf("records %q, want probeJSON for both kernels", recs)
	}
	for _, tc := range []struct {
		name, out, want string
		is              error
	}{
		{"probe error", vmOutput("6.1", "2"), `exited with "2"`, nil},
		{"merge without an ended run", "[5.10] " + BeginMark + " probe=sqd\n", "no run of the check ended", nil},
		{"no end", strings.Split(vmOutput("6.1", "0"), "vm: still")[0], "no end marker", nil},
		{"none", "[6.1] == command\n", "", ErrNoRecord},
		{"not JSON", "[6.1] " + BeginMark + "\n[6.1] Error: no device\n[6.1] " + EndMark + " exit=1\n", "not qpdrain check's JSON", nil},
		{"not a check", "[6.1] " + BeginMark + "\n[6.1] {}\n[6.1] " + EndMark + " exit=0\n", "no ifname", nil},
	} {
		_, err := ParseVMOutput(strings.NewReader(tc.out))
		if err == nil || !strings.Contains(err.Error(), tc.want) || tc.is != nil && !errors.Is(err, tc.is) {
			t.Errorf("%s: ParseVMOutput = %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}

// TestParseVMOutputProviders: one run with rxe0 and siw0 on each kernel
// gives a record per provider and kernel, named after both, and each
// provider's kernels render as columns of their own, rxe's first.
func TestParseVMOutputProviders(t *testing.T) {
	siwJSON := strings.Replace(probeJSON, `"rxe0"`, `"siw0"`, 1)
	out := vmOutputOn("6.1.0-57-amd64", "rxe0", "1") + strings.ReplaceAll(vmOutputOn("6.1.0-57-amd64", "siw0", "0"), `"rxe0"`, `"siw0"`) +
		vmOutputOn("7.3.4+deb13-amd64", "siw0", "4")
	recs, err := ParseVMOutput(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	siw := func(kernel string) Key { return Key{"siw", kernel} }
	if len(recs) != 3 || string(recs[rxe("6.1.0-57-amd64")]) != probeJSON+"\n" || string(recs[siw("6.1.0-57-amd64")]) != siwJSON+"\n" || recs[siw("7.3.4+deb13-amd64")] == nil {
		t.Fatalf("records %q, want rxe's and siw's on 6.1, siw's on 7.3", recs)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "siw-6.12.95+deb12-amd64.json"), []byte(siwJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	written, err := WriteRecords(dir, recs, true)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range written {
		names = append(names, filepath.Base(f))
	}
	if want := []string{"rxe-6.1.0-57-amd64.json", "siw-6.1.0-57-amd64.json", "siw-7.3.4+deb13-amd64.json"}; !slices.Equal(names, want) {
		t.Errorf("written %v, want %v", names, want)
	}
	if _, err := os.Stat(filepath.Join(dir, "siw-6.12.95+deb12-amd64.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("siw's record of 6.12, not in the run, after -replace: %v, want it removed", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "soft.json"), []byte(probeJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	doc, err := RenderDoc([]byte("<!-- providers:probes begin -->\n<!-- providers:probes end -->\n<!-- providers:settings begin -->\n<!-- providers:settings end -->\n"), dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := "| Probe | Soft device | rxe, `6.1.0-57-amd64` | siw, `6.1.0-57-amd64` | siw, `7.3.4+deb13-amd64` |\n"; !strings.Contains(string(doc), want) {
		t.Errorf("rendered doc lacks %q:\n%s", want, doc)
	}
}

// probeRun is qpdrain vm's output of a run of probe alone on kernel 5.10:
// probeJSON with the other probe skipped and what follows its record, no
// end marker when status is "".
func probeRun(probe, outcome, status, after string) string {
	var b strings.Builder
	b.WriteString("[5.10.0-32-amd64] " + BeginMark + " probe=" + probe + "\n")
	j := probeJSON
	for _, name := range []string{"recv-in-error", "drain-wr"} {
		o := `"skipped"`
		if name == probe {
			o = `"` + outcome + `"`
		}
		j = strings.Replace(j, `"name": "`+name+`", "outcome": "`, `"name": "`+name+`", "outcome": `+o+`, "was": "`, 1)
	}
	for _, l := range strings.Split(j, "\n") {
		if status == "" && strings.Contains(l, "drain-wr") {
			break // the guest wedged while writing
		}
		b.WriteString("[5.10.0-32-amd64] " + l + "\n")
	}
	if status != "" {
		b.WriteString("[5.10.0-32-amd64] " + EndMark + " exit=" + status + "\n")
	}
	for _, l := range strings.Split(after, "\n") {
		b.WriteString("[5.10.0-32-amd64] " + l + "\n")
	}
	return b.String() + "vm FAIL [5.10.0-32-amd64] ...\n"
}

// TestParseVMOutputMerge: runs of one probe each merge into one record, a
// probe whose run never ended locked, with the kernel's first complaint; the
// record of a kernel outside the default matrix is named after it.
func TestParseVMOutputMerge(t *testing.T) {
	out := probeRun("recv-in-error", "hung", "stuck", "thread 170: State: R (running)\nkernel log, first complaint: [   66.5] watchdog: BUG: soft lockup - CPU#0 stuck for 22s! [qpdrain:170]\nkernel log:\n[   44.1] rdma_rxe: loaded\n[   66.5] watchdog: BUG: soft lockup - CPU#0 stuck for 22s! [qpdrain:170]\n[ 70.0] rcu: INFO: rcu_sched self-detected stall on CPU") +
		probeRun("drain-wr", "", "", "the guest kernel's first complaint (console.txt:40):\n  [   80.2] watchdog: BUG: soft lockup - CPU#1 stuck for 23s! [qpdrain:171]")
	recs, err := ParseVMOutput(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := decode(recs[rxe("5.10.0-32-amd64")])
	if err != nil {
		t.Fatalf("merged record: %v\n%s", err, recs[rxe("5.10.0-32-amd64")])
	}
	got := map[string]string{}
	for _, p := range rec.Probes {
		got[p.Name] = p.Outcome + ": " + p.Observed
	}
	want := map[string]string{
		"recv-in-error": "hung: never completed | not even later; the process did not exit after its record; the kernel: watchdog: BUG: soft lockup - CPU#0 stuck for 22s! [qpdrain:170]",
		"drain-wr":      "locked: the guest never finished the probe: no record before the VM's deadline; the kernel: watchdog: BUG: soft lockup - CPU#1 stuck for 23s! [qpdrain:171]",
	}
	if !maps.Equal(got, want) || len(rec.Settings) != 0 {
		t.Errorf("merged probes %q, settings %v; want %q and none", got, rec.Settings, want)
	}
	var counts map[string]any
	if err := json.Unmarshal(recs[rxe("5.10.0-32-amd64")], &counts); err != nil || counts["hung"] != 1.0 || counts["locked"] != 1.0 || counts["skipped"] != 0.0 {
		t.Errorf("merged counts %v (%v), want hung 1, locked 1, skipped 0", counts, err)
	}

	dir := t.TempDir()
	written, err := WriteRecords(dir, recs, true)
	if err != nil || len(written) != 1 || filepath.Base(written[0]) != "rxe-5.10.json" {
		t.Fatalf("WriteRecords = %v, %v; want rxe-5.10.json", written, err)
	}
	// A run of the default matrix with -replace keeps the record of 5.10.
	if _, err := WriteRecords(dir, map[Key][]byte{rxe("6.1.0-57-amd64"): []byte(probeJSON)}, true); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "rxe-*.json"))
	if len(files) != 2 {
		t.Errorf("after a default-matrix run with -replace: %v, want 5.10's record kept", files)
	}
	os.WriteFile(filepath.Join(dir, "soft.json"), []byte(probeJSON), 0o644)
	doc := []byte("<!-- providers:probes begin -->\n<!-- providers:probes end -->\n<!-- providers:settings begin -->\n<!-- providers:settings end -->\n")
	r, err := RenderDoc(doc, dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| Probe | Soft device | rxe, `5.10` (bullseye; not in the default matrix) | rxe, `6.1.0-57-amd64` |\n",
		"| `drain-wr` | pass: drain WR completed | **locked**: the guest never finished the probe",
		"| Setting | Soft device | rxe, `6.1.0-57-amd64` |\n", // no settings from a merged record
	} {
		if !strings.Contains(string(r), want) {
			t.Errorf("rendered doc lacks %q:\n%s", want, r)
		}
	}
}

func TestWriteRecordsAndRender(t *testing.T) {
	dir := t.TempDir()
	soft := strings.Replace(strings.Replace(probeJSON, `"deviation"`, `"pass"`, 1), `"soft": false`, `"soft": true`, 1)
	if err := os.WriteFile(filepath.Join(dir, "soft.json"), []byte(soft), 0o644); err != nil {
		t.Fatal(err)
	}
	rec := []byte(probeJSON)
	if _, err := WriteRecords(dir, map[Key][]byte{rxe("6.0.0-1-amd64"): rec}, false); err != nil {
		t.Fatal(err)
	}
	written, err := WriteRecords(dir, map[Key][]byte{rxe("7.3.4+deb13-amd64"): rec, rxe("6.12.95+deb12-amd64"): rec, rxe("6.9.0-1-amd64"): rec, rxe("6.1.0-57-amd64"): rec}, true)
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "rxe-*.json"))
	if len(written) != 4 || !slices.Equal(files, written) {
		t.Errorf("written %v, in the directory %v: want the 4 kernels, 6.0's record replaced", written, files)
	}

	iwarp := strings.Replace(soft, `"outcome": "pass"`, `"outcome": "not-applicable"`, 1)
	if err := os.WriteFile(filepath.Join(dir, "soft-iwarp.json"), []byte(iwarp), 0o644); err != nil {
		t.Fatal(err)
	}

	doc := []byte("# x\n<!-- providers:probes begin -->\nold\n<!-- providers:probes end -->\ntext\n" +
		"<!-- providers:settings begin -->\n<!-- providers:settings end -->\n")
	out, err := RenderDoc(doc, dir)
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	for _, want := range []string{
		// In release order, not the files' (6.12 sorts before 6.9 as text).
		"| Probe | Soft device | Soft device, iWARP (siw's rules, through its RDMA CM) | rxe, `6.1.0-57-amd64` | rxe, `6.9.0-1-amd64` | rxe, `6.12.95+deb12-amd64` | rxe, `7.3.4+deb13-amd64` |\n",
		"| `recv-in-error` | pass: never completed \\| not even later | _not-applicable_: never completed \\| not even later | **deviation**: never completed \\| not even later |",
		"| Policy | `quarantine` | `quarantine` | `quarantine` |",
		"<!-- providers:probes end -->\ntext\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("rendered doc lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "old") {
		t.Errorf("the old table is still there:\n%s", s)
	}
	again, err := RenderDoc(out, dir)
	if err != nil || !bytes.Equal(again, out) {
		t.Errorf("rendering twice changed the doc (%v)", err)
	}
	if _, err := RenderDoc([]byte("no markers\n"), dir); !errors.Is(err, ErrMarkers) {
		t.Errorf("RenderDoc without markers = %v, want ErrMarkers", err)
	}
	if _, err := RenderDoc(doc, t.TempDir()); err == nil {
		t.Error("RenderDoc without records succeeded")
	}
}

// TestRunCheck: render -check fails on a stale doc and leaves it alone.
func TestRunCheck(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "soft.json"), []byte(probeJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	doc := filepath.Join(dir, "doc.md")
	stale := "<!-- providers:probes begin -->\n<!-- providers:probes end -->\n<!-- providers:settings begin -->\n<!-- providers:settings end -->\n"
	if err := os.WriteFile(doc, []byte(stale), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run([]string{"render", "-records", dir, "-doc", doc, "-check"}, nil, &out); !errors.Is(err, ErrStale) {
		t.Errorf("render -check on a stale doc = %v, want ErrStale", err)
	}
	if b, _ := os.ReadFile(doc); string(b) != stale {
		t.Error("render -check changed the doc")
	}
	if err := run([]string{"render", "-records", dir, "-doc", doc}, nil, &out); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{"render", "-records", dir, "-doc", doc, "-check"}, nil, &out); err != nil {
		t.Errorf("render -check after render = %v, want nil", err)
	}
	if err := run([]string{"frobnicate"}, nil, &out); err == nil {
		t.Error("an unknown subcommand succeeded")
	}
}

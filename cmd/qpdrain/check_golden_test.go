package main

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/qpdrain/qpdrain/soft"
)

// checkGolden holds what "qpdrain check --device soft -j" found with no
// quirk and with each quirk alone, recorded while the check ran the soft
// device in real time: every probe's outcome and observation and every
// drain setting, times left out (verdictLines).
const checkGolden = "../../testdata/check-soft.golden"

// durationRE matches a time.Duration as it prints ("0s", "12.6ms", "1m5s").
var durationRE = regexp.MustCompile(`\d+(\.\d+)?(ns|µs|ms|s|m|h)(\d+(\.\d+)?(ns|µs|ms|s))*`)

// qpnRE matches a QP number as the observations print it ("qpn 41",
// "qpn=35").
var qpnRE = regexp.MustCompile(`qpn[ =]\d+`)

// maskQPN replaces each QP number by "qpn N": the numbers follow the order
// the probes ran in, which is not the verdict.
func maskQPN(s string) string { return qpnRE.ReplaceAllString(s, "qpn N") }

// verdictLines are the lines of the golden file for one run of the check,
// each time replaced by "T": how long the device took is not the verdict.
func verdictLines(quirk string, doc checkJSON) []string {
	mask := func(s string) string { return maskQPN(durationRE.ReplaceAllString(s, "T")) }
	var out []string
	for _, p := range doc.Probes {
		out = append(out, fmt.Sprintf("%s\t%s\t%s\t%s", quirk, p.Name, p.Outcome, mask(p.Observed)))
	}
	for _, s := range doc.Settings {
		out = append(out, fmt.Sprintf("%s\tsetting %s\t%s\t%s", quirk, s.Name, mask(s.Value), mask(s.Reason)))
	}
	return out
}

// TestCheckSoftGolden: the check of the soft device, on its fabric's clock,
// reaches the verdicts it reached in real time, with no quirk and with each
// quirk, and does so without waiting out its timeouts in real time.
func TestCheckSoftGolden(t *testing.T) {
	want, err := os.ReadFile(checkGolden)
	if err != nil {
		t.Fatal(err)
	}
	wantLines := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(want)), "\n") {
		q, _, _ := strings.Cut(l, "\t")
		wantLines[q] = append(wantLines[q], maskQPN(l))
	}
	for _, quirk := range append([]string{"none"}, soft.QuirkNames()...) {
		t.Run(quirk, func(t *testing.T) {
			args := []string{"check", "--device", "soft", "-j"}
			if quirk != "none" {
				args = append(args, "--soft-quirk", quirk)
			}
			stdout, stderr, _ := runCLI(nil, args...)
			var doc checkJSON
			if err := json.Unmarshal([]byte(stdout), &doc); err != nil {
				t.Fatalf("qpdrain %s: %v\n%s%s", strings.Join(args, " "), err, stdout, stderr)
			}
			got := verdictLines(quirk, doc)
			w := wantLines[quirk]
			for i := range max(len(got), len(w)) {
				var g, x string
				if i < len(got) {
					g = got[i]
				}
				if i < len(w) {
					x = w[i]
				}
				if g != x {
					t.Errorf("line %d:\n got %q\nwant %q", i, g, x)
				}
			}
		})
	}
}

package trace

import (
	"fmt"
	"io"
	"path"
	"strings"
)

// WriteText prints the report for an operator: one line per traced process,
// then "clean" or each finding with its evidence and, with details, the rule
// it breaks; then the notes. It returns the writer's error.
func (r *Report) WriteText(w io.Writer, details bool) error {
	var b strings.Builder
	if len(r.Processes) == 0 {
		b.WriteString("no process of the program opened an RDMA device\n")
	}
	for _, p := range r.Processes {
		end := "ended without exiting normally"
		if p.Exited {
			end = "exited"
		}
		prog := ""
		if p.Program != "" {
			prog = " (" + path.Base(p.Program) + ")"
		}
		fmt.Fprintf(&b, "pid %d%s on %s: %d QPs, %d CQs, %d SRQs, %d WRs posted, %d completions polled, %d async events; %s\n",
			p.PID, prog, strings.Join(p.Devices, ","), p.QPs, p.CQs, p.SRQs, p.Posted, p.Polled, p.Events, end)
	}
	if r.Clean() {
		b.WriteString("clean\n")
	} else {
		fmt.Fprintf(&b, "%d finding(s):\n", len(r.Findings))
	}
	for _, f := range r.Findings {
		fmt.Fprintf(&b, "%s  pid %d  %s  %s", f.Kind, f.PID, f.Device, f.Object)
		if f.Queue != "" {
			fmt.Fprintf(&b, "  %s queue", f.Queue)
		}
		fmt.Fprintf(&b, "  at %s\n  %s\n", fmtDur(int64(f.At)), f.Evidence)
		if f.Site != nil {
			fmt.Fprintf(&b, "  %s called at %s\n", f.Site.Verb, f.Site)
		}
		if details {
			fmt.Fprintf(&b, "  rule: %s\n", f.Rule)
		}
	}
	if len(r.Suppressed) > 0 {
		// counted by the line that suppressed them, in its first finding's order
		var lines []string
		n := map[string]int{}
		kind := map[string]Kind{}
		for _, f := range r.Suppressed {
			if n[f.SuppressedBy] == 0 {
				lines = append(lines, f.SuppressedBy)
			}
			n[f.SuppressedBy]++
			kind[f.SuppressedBy] = f.Kind
		}
		var each []string
		for _, l := range lines {
			each = append(each, fmt.Sprintf("%d %s (%s)", n[l], kind[l], l))
		}
		fmt.Fprintf(&b, "%d finding(s) suppressed, not shown: %s\n", len(r.Suppressed), strings.Join(each, ", "))
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

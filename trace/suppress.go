package trace

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
)

// ErrBadSuppression is wrapped by ParseSuppressions' errors.
var ErrBadSuppression = errors.New("bad suppression")

// Suppression names findings a project has accepted, as a line of a
// suppressions file: a kind, then what it applies to, each optional:
//
//	KIND [program=PATTERN] [device=PATTERN] [queue=send|recv|srq] [caller=[OBJECT!]FUNCTION]
//
// PATTERNs are path.Match globs; a program pattern without a "/" is matched
// against the base name of the process's executable, one with a "/"
// against its whole path. A caller pattern is matched against the function
// of the finding's call site (Finding.Site, named by Report.Symbolize) or,
// with "OBJECT!", also against the object holding it, as program= against
// the executable; a finding whose call site has no function name matches
// no caller= line. A finding is suppressed by the first line that matches
// it.
type Suppression struct {
	Kind    Kind
	Program string
	Device  string
	Queue   string
	Caller  string
	// Where is the line's "FILE:LINE", for the report.
	Where string
}

// ParseSuppressions reads a suppressions file named name (for its errors
// and Where): one suppression a line, blank lines and lines starting with
// "#" ignored. Its errors wrap ErrBadSuppression (or ErrUnknownKind) and
// start with "name:LINE: ".
func ParseSuppressions(r io.Reader, name string) ([]Suppression, error) {
	var out []Suppression
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		where := fmt.Sprintf("%s:%d", name, line)
		sup, err := parseSuppression(s)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		sup.Where = where
		out = append(out, sup)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return out, nil
}

func parseSuppression(s string) (Suppression, error) {
	f := strings.Fields(s)
	k, err := ParseKind(f[0])
	if err != nil {
		return Suppression{}, err
	}
	sup := Suppression{Kind: k}
	for _, kv := range f[1:] {
		key, v, ok := strings.Cut(kv, "=")
		var dst *string
		switch key {
		case "program":
			dst = &sup.Program
		case "device":
			dst = &sup.Device
		case "caller":
			dst = &sup.Caller
		case "queue":
			dst = &sup.Queue
			if ok && v != "send" && v != "recv" && v != "srq" {
				return Suppression{}, fmt.Errorf("%w: queue=%q: want send, recv or srq", ErrBadSuppression, v)
			}
		default:
			return Suppression{}, fmt.Errorf("%w: %q: want program=, device=, queue= or caller= after the kind", ErrBadSuppression, kv)
		}
		switch {
		case !ok || v == "":
			return Suppression{}, fmt.Errorf("%w: %q: want %s=VALUE", ErrBadSuppression, kv, key)
		case *dst != "":
			return Suppression{}, fmt.Errorf("%w: %s= given twice", ErrBadSuppression, key)
		}
		for _, pat := range strings.SplitN(v, "!", 2) {
			if _, err := path.Match(pat, ""); err != nil || pat == "" {
				return Suppression{}, fmt.Errorf("%w: %s=%q: %v", ErrBadSuppression, key, v, cmp.Or(err, errEmptyPattern))
			}
		}
		*dst = v
	}
	return sup, nil
}

var errEmptyPattern = errors.New("empty pattern")

// Matches reports whether s applies to f.
func (s Suppression) Matches(f Finding) bool {
	if f.Kind != s.Kind || s.Queue != "" && f.Queue != s.Queue || !glob(s.Device, f.Device) {
		return false
	}
	if s.Program != "" && !globFile(s.Program, f.Program) {
		return false
	}
	if s.Caller == "" {
		return true
	}
	if f.Site == nil || f.Site.Func == "" {
		return false
	}
	fn := s.Caller
	if obj, rest, ok := strings.Cut(s.Caller, "!"); ok {
		if !globFile(obj, f.Site.Module) {
			return false
		}
		fn = rest
	}
	return glob(fn, f.Site.Func)
}

// globFile matches a file's path: on its base name when the pattern has no
// "/", else on the whole path; an empty path matches nothing.
func globFile(pattern, file string) bool {
	if !strings.Contains(pattern, "/") {
		file = path.Base(file)
	}
	return file != "" && file != "." && glob(pattern, file)
}

// glob matches a checked pattern ("" matches anything).
func glob(pattern, s string) bool {
	ok, _ := path.Match(pattern, s)
	return pattern == "" || ok
}

// Suppress moves the findings a suppression matches from Findings to
// Suppressed, each with SuppressedBy set to its line: what a project knows
// of and has chosen to live with, so that only new findings fail its runs.
func (r *Report) Suppress(sups []Suppression) {
	kept := r.Findings[:0:0]
	for _, f := range r.Findings {
		i := 0
		for i < len(sups) && !sups[i].Matches(f) {
			i++
		}
		if i == len(sups) {
			kept = append(kept, f)
			continue
		}
		f.SuppressedBy = sups[i].Where
		r.Suppressed = append(r.Suppressed, f)
	}
	r.Findings = kept
}

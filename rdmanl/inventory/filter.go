package inventory

import (
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/qpdrain/qpdrain/rdmanl"
	"github.com/qpdrain/qpdrain/workload"
)

// Filter is the filter syntax of `rdma resource show qp`: NAME VALUE
// pairs, where VALUE is a comma-separated list of numbers and ranges
// (lqpn 5-9,12) or of words (state RTS,ERR), and link is DEV or DEV/PORT
// (DEV/- for QPs without a port). A QP passes when it matches every filter;
// a QP without the filtered attribute (no rqpn on a UD QP, no pid on a
// kernel QP) does not match, as in iproute2. Beyond rdma's, cgroup PATH and
// pod UID select by workload (workloadFilters). The zero Filter, and that of
// no arguments, passes every QP.
type Filter struct {
	dev      string
	port     uint32
	hasPort  bool
	portNone bool
	nums     map[string][][2]uint32
	words    map[string][]string
	// workload are the workload filters given (workloadFilters).
	workload []func(*QP) bool
}

// Filter names, as rdma spells them.
var (
	numericQPFilters = []string{"lqpn", "rqpn", "pdn", "pid", "sq-psn", "rq-psn"}
	wordQPFilters    = []string{"type", "state", "path-mig-state"}
)

// qpFilterWords are the words each word filter can match: what rdma prints
// for every value the kernel's attribute can carry (rdma/res-qp.c and
// rdma/res.c: qp_types_to_str, qp_states_to_str, path_mig_to_str, with
// UNKNOWN for a value they lack). rdma compares them without case.
var qpFilterWords = map[string][]string{
	"type":           wordsOf(func(i uint8) string { return rdmanl.QPType(i).String() }),
	"state":          wordsOf(func(i uint8) string { return rdmanl.QPState(i).String() }),
	"path-mig-state": wordsOf(func(i uint8) string { return rdmanl.PathMigState(i).String() }),
}

// wordsOf lists the names name gives the u8 values, each once, in value
// order.
func wordsOf(name func(uint8) string) []string {
	var out []string
	for i := range 256 {
		if w := name(uint8(i)); !slices.Contains(out, w) {
			out = append(out, w)
		}
	}
	return out
}

// ParseFilter reads NAME VALUE pairs as `rdma resource show qp` takes them
// ("lqpn 5-9,12 state ERR link rxe0/1"). An unknown name, a missing value, a
// malformed range or a word no QP can carry is an error naming the filter
// and what it takes.
func ParseFilter(args []string) (Filter, error) {
	f := Filter{nums: map[string][][2]uint32{}, words: map[string][]string{}}
	known := "link, " + strings.Join(numericQPFilters, ", ") + ", " + strings.Join(wordQPFilters, ", ") + ", cgroup, pod"
	for i := 0; i < len(args); i += 2 {
		name := args[i]
		if i+1 >= len(args) {
			return f, fmt.Errorf("filter %q has no value", name)
		}
		val := args[i+1]
		switch {
		case name == "link":
			if err := f.parseLink(val); err != nil {
				return f, err
			}
		case slices.Contains(numericQPFilters, name):
			rs, err := parseRanges(name, val)
			if err != nil {
				return f, err
			}
			f.nums[name] = append(f.nums[name], rs...)
		case slices.Contains(wordQPFilters, name):
			for _, w := range strings.Split(val, ",") {
				if w == "" {
					return f, fmt.Errorf("filter %s %q: empty word in the list", name, val)
				}
				w = strings.ToUpper(w)
				if valid := qpFilterWords[name]; !slices.Contains(valid, w) {
					return f, fmt.Errorf("filter %s %q: no %s is %q: want one of %s (any case)", name, val, name, w, strings.Join(valid, ", "))
				}
				f.words[name] = append(f.words[name], w)
			}
		case workloadFilters[name] != nil:
			m, err := workloadFilters[name](val)
			if err != nil {
				return f, err
			}
			f.workload = append(f.workload, m)
		default:
			return f, fmt.Errorf("unknown filter %q: want one of %s", name, known)
		}
	}
	return f, nil
}

// Device is the device the filter's link names, "" for any: a caller
// reads only that device (Options.Devices).
func (f *Filter) Device() string { return f.dev }

func (f *Filter) parseLink(val string) error {
	dev, port, hasPort := strings.Cut(val, "/")
	if dev == "" {
		return fmt.Errorf("filter link %q: want DEV or DEV/PORT", val)
	}
	f.dev = dev
	if !hasPort {
		return nil
	}
	if port == "-" {
		f.portNone = true
		return nil
	}
	n, err := strconv.ParseUint(port, 10, 32)
	if err != nil || n == 0 {
		return fmt.Errorf("filter link %q: port %q is not a port number (1, 2, ... or -)", val, port)
	}
	f.port, f.hasPort = uint32(n), true
	return nil
}

// CheckPort fails when the filter's port is not one of its device's, as
// rdma does ("Wrong device name"): devs are the devices Take read.
func (f *Filter) CheckPort(devs []Device) error {
	if !f.hasPort {
		return nil
	}
	for _, d := range devs {
		if d.Name != f.dev || d.Ports == 0 || f.port <= d.Ports {
			continue
		}
		ports := "port 1"
		if d.Ports > 1 {
			ports = fmt.Sprintf("ports 1-%d", d.Ports)
		}
		return fmt.Errorf("filter link %s/%d: %s has %s only (or - for QPs without a port)", f.dev, f.port, d.Name, ports)
	}
	return nil
}

// parseRanges reads "5", "5-9", "1,3,7-9".
func parseRanges(name, val string) ([][2]uint32, error) {
	var out [][2]uint32
	for _, part := range strings.Split(val, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.ParseUint(lo, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("filter %s %q: %q is not a number or a range N-M", name, val, part)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(hi, 10, 32); err != nil {
				return nil, fmt.Errorf("filter %s %q: %q is not a number or a range N-M", name, val, part)
			}
			if b < a {
				return nil, fmt.Errorf("filter %s %q: range %q ends before it starts", name, val, part)
			}
		}
		out = append(out, [2]uint32{uint32(a), uint32(b)})
	}
	return out, nil
}

// value returns a QP's numeric attribute by filter name, and whether the QP
// has it.
func qpNumber(q *QP, name string) (uint32, bool) {
	switch name {
	case "lqpn":
		return q.LQPN, true
	case "rqpn":
		return q.RQPN, q.Has&rdmanl.HasRQPN != 0
	case "pdn":
		return q.PDN, q.Has&rdmanl.HasPDN != 0
	case "pid":
		return q.PID, q.Has&rdmanl.HasPID != 0
	case "sq-psn":
		return q.SQPSN, q.Has&rdmanl.HasSQPSN != 0
	case "rq-psn":
		return q.RQPSN, q.Has&rdmanl.HasRQPSN != 0
	}
	return 0, false
}

func qpWord(q *QP, name string) (string, bool) {
	switch name {
	case "type":
		return q.Type.String(), true
	case "state":
		return q.State.String(), true
	case "path-mig-state":
		return q.PathMigState.String(), q.Has&rdmanl.HasPathMigState != 0
	}
	return "", false
}

// Match reports whether q passes every filter.
func (f *Filter) Match(q *QP) bool {
	if f.dev != "" && q.DeviceName != f.dev {
		return false
	}
	hasPort := q.Has&rdmanl.HasPort != 0
	if f.portNone && hasPort || f.hasPort && (!hasPort || q.Port != f.port) {
		return false
	}
	for name, ranges := range f.nums {
		v, ok := qpNumber(q, name)
		if !ok || !inRanges(v, ranges) {
			return false
		}
	}
	for name, words := range f.words {
		v, ok := qpWord(q, name)
		if !ok || !slices.Contains(words, v) {
			return false
		}
	}
	for _, m := range f.workload {
		if !m(q) {
			return false
		}
	}
	return true
}

func inRanges(v uint32, ranges [][2]uint32) bool {
	for _, r := range ranges {
		if v >= r[0] && v <= r[1] {
			return true
		}
	}
	return false
}

// workloadFilters are the filters on a QP's workload, beyond rdma's:
// cgroup PATH (the cgroup or one below it) and pod UID (the dashes or the
// systemd driver's underscores), each a comma-separated list. A QP's
// workload is its owner's; a QP whose creator is gone has those of the
// processes that hold its device.
var workloadFilters = map[string]func(val string) (func(*QP) bool, error){
	"cgroup": func(val string) (func(*QP) bool, error) {
		paths, err := filterList("cgroup", val)
		if err != nil {
			return nil, err
		}
		for i, p := range paths {
			if !strings.HasPrefix(p, "/") {
				return nil, fmt.Errorf("filter cgroup %q: %q is not a cgroup path (/system.slice, /kubepods/...)", val, p)
			}
			paths[i] = path.Clean(p)
		}
		return anyWorkload(func(w *workload.Workload) bool {
			for _, p := range paths {
				if w.Path == p || p == "/" || strings.HasPrefix(w.Path, p+"/") {
					return true
				}
			}
			return false
		}), nil
	},
	"pod": func(val string) (func(*QP) bool, error) {
		uids, err := filterList("pod", val)
		if err != nil {
			return nil, err
		}
		for i, u := range uids {
			uids[i] = strings.ToLower(strings.ReplaceAll(u, "_", "-"))
		}
		return anyWorkload(func(w *workload.Workload) bool { return w.PodUID != "" && slices.Contains(uids, w.PodUID) }), nil
	},
}

func filterList(name, val string) ([]string, error) {
	list := strings.Split(val, ",")
	for _, v := range list {
		if v == "" {
			return nil, fmt.Errorf("filter %s %q: empty word in the list", name, val)
		}
	}
	return list, nil
}

// anyWorkload matches a QP one of whose workloads passes ok.
func anyWorkload(ok func(*workload.Workload) bool) func(*QP) bool {
	return func(q *QP) bool {
		for _, w := range qpWorkloads(q) {
			if ok(w) {
				return true
			}
		}
		return false
	}
}

// qpWorkloads are the workloads a QP belongs to: its owner's, else (its
// creator gone, or a zombie that closed its files) its holders'. A kernel
// QP has none.
func qpWorkloads(q *QP) []*workload.Workload {
	if q.Owner != nil && q.Owner.Via == FromKernel {
		return nil
	}
	if q.Owner != nil && !q.Owner.Zombie && q.Owner.Workload != nil {
		return []*workload.Workload{q.Owner.Workload}
	}
	var out []*workload.Workload
	for _, h := range q.Holders {
		if h.Workload != nil {
			out = append(out, h.Workload)
		}
	}
	return out
}
